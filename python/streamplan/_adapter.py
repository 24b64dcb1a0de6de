"""The adapter interface between a host's module class and the planner: what names and shapes
cannot tell (from the module's config), each call's arguments as per-element inputs of the family
(the raw-input format of ``streamplan run --inputs``, documented in src/models/families.hpp), or
the reason the planner cannot run that call; and the answer in the form the original returns.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch


@dataclass(frozen=True)
class Fallback:
    """Why one call ran the module's original forward.

    ``code`` is stable (tests and tools match it); ``reason`` says what in the call or the
    module it was, with the values.
    """

    code: str
    reason: str


@dataclass(frozen=True)
class WeightHook:
    """A function ``fn(name, tensor) -> tensor`` that the planner calls on each acquire of the
    module tensors named in ``names`` (state_dict names; every tensor where empty), computing
    with what it returns: same shape, same device."""

    fn: Callable[[str, torch.Tensor], torch.Tensor]
    names: tuple[str, ...] = ()


@dataclass
class Call:
    """A call the planner runs: one input map per batch element; `extra`: what the adapter keeps
    from the call to build the answer."""

    inputs: list[dict[str, torch.Tensor]]
    return_dict: bool
    extra: dict[str, Any] = field(default_factory=dict)


class Adapter:
    """How one module class is recognized, called and answered."""

    class_name: str = ""
    module_prefix: str = "diffusers."  # the package the class comes from
    host: str = "diffusers"            # its name in messages
    # False: the planner answers each element with the family's output tensor; True: with its
    # named outputs (a dict: MiniMax H3's "video" and "audio").
    named_outputs: bool = False

    def __init__(self, module: torch.nn.Module, original: Callable[..., Any], dtype: torch.dtype,
                 device: torch.device) -> None:
        """`dtype` and `device`: the module's activation dtype and device, as attached."""
        self.module = module
        self.signature = inspect.signature(original)
        self.dtype = dtype
        self.device = device
        # True while a call comes from the host's own hook around the module (Handle.call: e.g.
        # ComfyUI's diffusion-model wrapper) rather than through the replaced forward.
        self.host_wrapped = False

    @classmethod
    def sidecar(cls, module: torch.nn.Module) -> dict[str, Any]:
        """The sidecar (src/recognize/sidecar.hpp) of what the module's names and shapes cannot tell."""
        raise NotImplementedError

    def prepare(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Call | Fallback:
        """The call as per-element inputs, or why the planner cannot run it."""
        raise NotImplementedError

    @classmethod
    def host_hook(cls, module: torch.nn.Module) -> WeightHook | None:
        """The host's weight hook for the module as it is now (e.g. ComfyUI's patches applied at
        cast time), or None: weights are the module's tensors as they are."""
        return None

    @classmethod
    def host_tensors(cls, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Tensors the host computes with that the module's ``state_dict`` does not hold (by
        state_dict name), read beside it; none by default."""
        return {}

    def output(self, call: Call, outputs: list[Any]) -> Any:
        """What the original forward returns, from the per-element outputs (fp32): tensors, or
        dicts of named tensors when `named_outputs` is set."""
        raise NotImplementedError

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any] | Fallback:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            return Fallback("arguments", f"the arguments do not fit {self.class_name}.forward: {e}")
        bound.apply_defaults()
        return dict(bound.arguments)


# --- helpers of the adapters' prepare() -------------------------------------------------------

def shape_text(t: Any) -> str:
    return str(list(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def per_element(name: str, t: torch.Tensor, batch: int, dims: int) -> Callable[[int], torch.Tensor] | Fallback:
    """Element b of a batched argument of `dims` dimensions per element; a batch of one is shared
    by every element, as the modules broadcast it (pipelines pass one prompt for many videos)."""
    if not isinstance(t, torch.Tensor) or t.dim() != dims + 1 or t.shape[0] not in (1, batch):
        return Fallback(
            "arguments",
            f"{name} has shape {shape_text(t)}; expected {dims + 1} dimensions with a batch of 1 or {batch}",
        )
    return lambda b: t[b if t.shape[0] == batch else 0]


def per_element_scalar(name: str, t: Any, batch: int) -> Callable[[int], torch.Tensor] | Fallback:
    """Element b of a per-batch scalar (a timestep, a guidance), as a [1] tensor."""
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        t = torch.tensor([float(t)])
    if not isinstance(t, torch.Tensor):
        return Fallback("arguments", f"{name} is {type(t).__name__}, not a tensor or a number")
    if t.dim() == 0:
        t = t.reshape(1)
    if t.dim() != 1 or t.shape[0] not in (1, batch):
        return Fallback("arguments", f"{name} has shape {shape_text(t)}; expected [], [1] or [{batch}]")
    return lambda b: t[b if t.shape[0] == batch else 0].reshape(1)


def check_tensor(name: str, t: Any, adapter: Adapter) -> Fallback | None:
    """A fallback unless `t` is a tensor of the module's dtype on its device."""
    dtype, device = adapter.dtype, adapter.device
    if not isinstance(t, torch.Tensor):
        return Fallback("arguments", f"{name} is {type(t).__name__}, not a tensor")
    if t.device != device:
        return Fallback("arguments", f"{name} is on {t.device}, the module on {device}")
    if t.dtype != dtype:
        return Fallback("arguments", f"{name} is {t.dtype}, the module's parameters {dtype}")
    return None


def flux1_sidecar(head_dim: int, axes_dim: Sequence[int], theta: int = 10000) -> dict[str, Any]:
    """The sidecar of a Flux.1 module: its head width and RoPE axes (names and shapes tell neither)."""
    return {"family": "flux1", "head_dim": int(head_dim), "eps": 1e-6,
            "rope": {"theta": int(theta), "axes_dim": [int(d) for d in axes_dim]}}


def find_adapter(module: torch.nn.Module, adapters: Sequence[type[Adapter]]) -> type[Adapter] | None:
    """The adapter of the module's class, or of a class of its host it derives from."""
    for cls in type(module).__mro__:
        for a in adapters:
            if cls.__name__ == a.class_name and cls.__module__.startswith(a.module_prefix):
                return a
    return None
