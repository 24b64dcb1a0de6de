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

    @classmethod
    def sidecar(cls, module: torch.nn.Module) -> dict[str, Any]:
        """The sidecar (src/recognize/sidecar.hpp) of what the module's names and shapes cannot tell."""
        raise NotImplementedError

    def prepare(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Call | Fallback:
        """The call as per-element inputs, or why the planner cannot run it."""
        raise NotImplementedError

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

