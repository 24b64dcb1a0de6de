"""apply / remove and the Handle they manage (see the package docstring)."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import sys
import time
import warnings
import weakref
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch.autograd.profiler import record_function

from . import _C
from ._adapter import Adapter, Call, Fallback, WeightHook, find_adapter
from . import _comfy, _comfy_minimax, _diffusers, _lora, _module_state
from ._consumers import _CONSUMERS, _DTYPES
from ._sequence import CfgParallel, group_size

ADAPTERS: tuple[type[Adapter], ...] = (*_diffusers.ADAPTERS, *_comfy.ADAPTERS, *_comfy_minimax.ADAPTERS)


def adapter_for(module: torch.nn.Module) -> type[Adapter] | None:
    """The adapter of the module's class: diffusers' Wan and Flux transformers, ComfyUI's
    WanModel, Flux and MiniMaxH3Model."""
    return find_adapter(module, ADAPTERS)

_ATTR = "_streamplan_handle"


def _size_bytes(name: str, text: str) -> int:
    """Bytes of a size such as '12GiB'; the parser's message, which names the CLI's budget,
    names the argument `name` instead."""
    try:
        return int(_C.parse_budget(text))
    except Exception as e:  # the parser names what it expected
        raise ValueError(f"{name}: {str(e).removeprefix('budget: ')}") from None


# The CLI's option names in messages of the shared C++ code, as the Python arguments say them.
_ARGUMENT_NAMES = {"--device": "device", "--kv-budget": "kv_budget", "--early-kv": "early_kv",
                   "--late-kv": "late_kv", "--early-steps": "early_steps", "--late-steps": "late_steps",
                   "--step": "step", "--steps": "steps"}


@contextlib.contextmanager
def _argument_names(names: Mapping[str, str] = _ARGUMENT_NAMES) -> Iterator[None]:
    """A ValueError of the C++ side that names the CLI's options is raised again naming the
    Python arguments of `names` instead: ``--device cuda: ...`` becomes ``device='cuda': ...``.
    Its subclasses (RecognizeError, BudgetError, ...) pass as they are."""

    def named(m: re.Match[str]) -> str:
        name = names.get(m.group(1))
        if name is None:
            return m.group(0)
        value = m.group(3)
        if value is None:
            return name
        return f"{name}={value}" if re.fullmatch(r"-?[0-9.]+", value) else f"{name}={value!r}"

    try:
        yield
    except ValueError as e:
        text = re.sub(r"(--[a-z][a-z-]*)( ([^\s,;]*[^\s:,;]))?", named, str(e))
        if type(e) is not ValueError or text == str(e):
            raise
        raise ValueError(text) from None


def _budget_text(budget: str | int | None) -> str:
    if budget is None:
        return ""
    if isinstance(budget, bool) or not isinstance(budget, (str, int)):
        raise TypeError(f"budget: expected None, 'auto', a size such as '12GiB' or bytes, got {budget!r}")
    if isinstance(budget, int):
        if budget <= 0:
            raise ValueError(f"budget: must be > 0 bytes, got {budget}")
        return str(budget)
    if budget != "auto":
        _size_bytes("budget", budget)
    return budget


def _device_memory_bytes(v: str | int | None) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise TypeError(f"device_memory: expected None, a size such as '8GiB' or bytes, got {v!r}")
    if isinstance(v, int):
        if v <= 0:
            raise ValueError(f"device_memory: must be > 0 bytes, got {v}")
        return v
    return _size_bytes("device_memory", v)


def _resident_blocks(v: int | str | None) -> int:
    if v is None:
        return -1
    if v == "auto":
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"resident_blocks: expected None, 'auto' or a count >= 1, got {v!r}")
    return v


def _positive_or_none(name: str, v: int | None) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v == 0:
        raise ValueError(f"{name}: expected None or a nonzero int, got {v!r}")
    if name == "token_chunk" and v < 0:
        raise ValueError(f"token_chunk: must be >= 1, got {v}")
    return v


class Handle:
    """The planner attached to one module by :func:`apply`.

    Attributes:
        fallbacks: every call that ran the original forward, with its code and reason, in order.
        calls: calls of the module since it was attached.
        planned_calls: calls that ran the planned schedule.
        last_host_ms: host milliseconds the last planned call spent outside its planned runs
            (the module's state checked, the arguments and outputs converted, each input's
            IR prepared and its plan looked up or made); None before the first.
    """

    fallbacks: list[Fallback]
    calls: int
    planned_calls: int
    last_host_ms: float | None

    def __init__(
        self,
        module: torch.nn.Module,
        adapter: type[Adapter],
        budget: str,
        consumer: str,
        token_chunk: int,
        feature_slice: int,
        weight_hook: WeightHook | None = None,
        loras: list[tuple[str, dict[str, torch.Tensor], float]] | None = None,
        residency: tuple[int, int, str, bool] = (0, -1, "", False),
        dtype: str = "",
        sequence: tuple[Any, str, bool | None, float] = (None, "ulysses", None, 0.0),
        cfg_parallel: bool = False,
    ) -> None:
        self._module = module
        self._cfg = CfgParallel(sequence[0]) if cfg_parallel else None
        # Each half of the ranks splits the rows of its batch elements over its own group.
        self._sequence = (self._cfg.group, *sequence[1:]) if self._cfg else sequence
        group, _, shard, link_rate = self._sequence
        ranks = 0 if group is None else group_size(group)
        got = "none" if group is None else str(ranks)
        if link_rate and ranks < 2:
            raise ValueError(f"link_rate: prices the exchanges between the ranks of a process_group of 2 or more "
                             f"ranks; got {got}")
        if shard and ranks < 2:
            raise ValueError("shard_weights: shares the blocks' weights over the ranks of a process_group of 2 or "
                             f"more ranks{' (with cfg_parallel: of each half)' if self._cfg else ''}; got {got}")
        self._dtype = dtype
        self._residency = residency
        self._weight_hook = weight_hook
        self._loras = loras or []
        self._lora_warned: set[str] = set()
        self._autograd_warned = False
        self._adapter_type = adapter
        self._options = (consumer, budget, token_chunk, feature_slice)
        self._python_consumers = [(consumer, *_CONSUMERS[consumer])] if consumer in _CONSUMERS else []
        self._original: Callable[..., Any] = module.forward
        self._processors = self._processor_types()
        self._unrecognized: tuple[Any, str] | None = None  # (fingerprint, why) of a module recognition refused
        self.fallbacks = []
        self.calls = 0
        self.planned_calls = 0
        self.last_host_ms = None
        self._attaches = 0  # the module's tensors read (1, and once more after each change)
        self._attach()

        me = weakref.ref(self)  # no cycle: the handle goes with its last reference after remove()

        @functools.wraps(self._original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            handle = me()
            if handle is None:
                raise RuntimeError("streamplan: the handle of this forward was removed")
            return handle._call(args, kwargs)

        self._forward = forward

    # --- what the handle shows -------------------------------------------------------------

    @property
    def module(self) -> torch.nn.Module:
        """The module this handle is attached to."""
        return self._module

    @property
    def family(self) -> str:
        """The recognized family: ``"wan2.1"``, ``"flux1"`` or ``"minimax-h3"``."""
        return str(self._attached.config["family"])

    @property
    def variant(self) -> str:
        """The recognized variant (``"wan2.1-1.3b"``, ``"flux1-dev"``, ..., or ``"custom"``)."""
        return str(self._attached.config["variant"])

    @property
    def layout(self) -> str:
        """The layout its tensors were recognized in (``"diffusers"``, or the checkpoint layout of
        ComfyUI's MiniMaxH3Model)."""
        return str(self._attached.layout)

    @property
    def config(self) -> dict[str, Any]:
        """The recognized structure: dims, heads, layers, RoPE axes, ..."""
        return dict(self._attached.config)

    @property
    def consumer(self) -> str:
        """The attention consumer the plans use."""
        return self._options[0]

    @property
    def budget(self) -> str | None:
        """The activation memory budget (``"auto"``, a size), or None."""
        return self._options[1] or None

    @property
    def plans(self) -> list[dict[str, Any]]:
        """One entry per geometry planned and kept (the streamplan.PLAN_CACHE_SIZE most recently
        used): key, calls, estimated_peak_bytes, estimated_ms (the cost model's time of one call),
        floor_bytes, retry, formats, residency."""
        return list(self._attached.plans())

    @property
    def streams(self) -> bool:
        """Whether the weights stream from host memory (``device_memory`` or ``resident_blocks``)."""
        return self._residency[0] > 0 or self._residency[1] >= 0

    @property
    def residency(self) -> dict[str, Any] | None:
        """Where the weights are for the last call's geometry (None unless they stream, or
        before the first call): ``kept_blocks``, ``streamed_blocks``, ``slots``, the byte parts
        of the device memory (``kept_bytes``, ``slot_bytes``, ``fixed_bytes``,
        ``activation_bytes``, ``slack_bytes``), ``prologue_bytes`` and ``prologue_copied`` (the
        weights only the family's prologue reads, and whether they stay in host memory and are
        copied on each call), ``predicted_ms`` and ``all_resident_ms``; under sequence parallel
        ``sharded``, ``ranks`` and ``shard_bytes`` (the blocks sharded over the ranks, this
        rank's shares); ``why`` (the arrangements weighed) and ``explain``."""
        key = self._attached.last_key
        for p in self._attached.plans():
            if p["key"] == key and p["residency"] is not None:
                return dict(json.loads(p["residency"]))
        return None

    @property
    def streamed_bytes(self) -> tuple[int, int]:
        """What the streamed weights hold now: (device bytes of kept weights and slots, pinned
        host bytes of streamplan's own); (0, 0) when nothing streams or after :meth:`release`."""
        return tuple(self._attached.streamed_bytes())

    @property
    def sharded_bytes(self) -> tuple[int, int]:
        """With the weights sharded (`shard_weights`, or chosen under `device_memory`): (this
        rank's shares of the blocks' weights, the two slots a block is gathered into), device
        bytes; (0, 0) before the first call, after :meth:`release`, or without them."""
        return tuple(self._attached.sharded_bytes())

    def release(self) -> None:
        """Gives back what the streamed weights hold on the device and in pinned host memory;
        the next call streams them again (the plans stay)."""
        self._attached.release_streamed()

    @property
    def copies(self) -> list[tuple[str, int]]:
        """Canonical tensors held as copies (concatenated biases, swapped halves), with their bytes.

        Every other weight is the module's own tensor, acquired as a view.
        """
        return list(self._attached.copies())

    @property
    def lora(self) -> dict[str, Any]:
        """The LoRA adapters applied: ``adapters`` and ``weights`` (counts), ``unmatched`` (keys that
        name no weight of the module) and ``unapplied`` (keys of weights the planned forward
        computes outside its projections, known after the first call)."""
        return dict(self._attached.lora)

    def explain(self, geometry: str | None = None) -> str:
        """The plan of `geometry` (a key of :attr:`plans`; default: the last call's) as text,
        with every transformation, its chunks and each rejection with its code."""
        a = self._attached
        key = geometry if geometry is not None else a.last_key
        head = (
            f"{type(self._module).__name__} as {self.variant} ({self.layout} layout), {a.dtype} on {a.device}, "
            f"consumer {self.consumer}, budget {self.budget or 'none'}\n"
            f"geometry: {key}\n"
        )
        if self._cfg:
            head += self._cfg.text() + "\n"
        return head + a.explain(geometry)

    def to_dict(self, geometry: str | None = None) -> dict[str, Any]:
        """The plan of `geometry` (default: the last call's) as the JSON of
        ``streamplan plan --explain --json``: model, tokens, device, dtype, the estimated peak,
        the floor, the plan (chosen chunks per sublayer) and the schedule programs."""
        return dict(json.loads(self._attached.document(geometry)))

    def remove(self) -> None:
        """Restores the module's original forward (same as :func:`remove`)."""
        remove(self._module)

    def __repr__(self) -> str:
        return (
            f"<streamplan.Handle {type(self._module).__name__} as {self.variant} ({self.layout} layout), "
            f"consumer {self.consumer}, budget {self.budget or 'none'}, {self.lora['adapters']} LoRA adapters: "
            f"{self.calls} calls, "
            f"{self.planned_calls} planned, {len(self.plans)} plans, {len(self.fallbacks)} fallbacks>"
        )

    # --- attaching and calling -------------------------------------------------------------

    def _attach(self) -> None:
        m = self._module
        consumer, budget, chunk, fslice = self._options
        sidecar = json.dumps(self._adapter_type.sidecar(m))
        tensors = list(m.state_dict().items()) + list(self._adapter_type.host_tensors(m).items())
        hook = self._hook_now()
        device_memory, resident_blocks, device, in_place = self._residency
        with _argument_names():
            self._attached = _C.Attached(tensors, sidecar, consumer, budget, chunk, fslice, self._python_consumers,
                                         hook.fn if hook else None, list(hook.names) if hook else [], self._loras,
                                         device_memory, resident_blocks, device, getattr(self, "_kv_budget", 1.0),
                                         self._dtype, in_place, *self._sequence)
        _lora.warn(self._attached.lora, self._lora_warned)
        device = torch.device(self._attached.device)
        self._adapter = self._adapter_type(m, self._original, _DTYPES[self._attached.dtype], device)
        self._state = _module_state.ModuleState(m, _hook_names(hook))
        self._attaches += 1

    def set_kv_budget(self, budget: float) -> None:
        """The fraction of video key tiles each video query tile keeps from the next call on
        (consumer ``"sparse"`` only; 1 is dense). Per denoising step: :func:`kv_budget_at`."""
        with _argument_names():
            self._attached.set_kv_budget(float(budget))
        self._kv_budget = float(budget)

    def _hook_now(self) -> WeightHook | None:
        """The caller's weight hook, else the host's for the module as it is now."""
        return self._weight_hook or self._adapter_type.host_hook(self._module)

    def _processor_types(self) -> dict[str, type]:
        return {
            name: type(sub.processor)
            for name, sub in self._module.named_modules()
            if hasattr(sub, "processor")
        }

    def _module_fallback(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Fallback | None:
        """Why the module as it is now cannot run planned, if it cannot."""
        m = self._module
        if torch.is_grad_enabled():
            needs = [n for n, p in m.named_parameters() if p.requires_grad][:1]
            needs += [f"argument {i}" for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad][:1]
            needs += [f"argument {k}" for k, a in kwargs.items() if isinstance(a, torch.Tensor) and a.requires_grad][:1]
            if needs:
                return Fallback(
                    "autograd",
                    f"gradients are enabled and {needs[0]} requires grad; the planned forward records no graph "
                    "(call it under torch.no_grad() or torch.inference_mode(), as pipelines do)",
                )
        hooks = torch.nn.modules.module
        if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
            return Fallback("hooks", "global module forward hooks are registered (torch.nn.modules.module)")
        for name, sub in m.named_modules():
            if sub is m:
                continue
            if sub._forward_hooks or sub._forward_pre_hooks:
                return Fallback("hooks", f"submodule '{name}' has forward hooks")
            if "forward" in sub.__dict__:
                return Fallback("hooks", f"submodule '{name}' has its forward replaced (a hook or an offloading wrapper)")
        processors = self._processor_types()
        if processors != self._processors:
            changed = sorted(k for k in set(processors) | set(self._processors) if processors.get(k) != self._processors.get(k))
            now = processors.get(changed[0])
            return Fallback(
                "attention_processor",
                f"the attention processor of '{changed[0]}' is {getattr(now, '__name__', now)}, "
                f"not the one the module was attached with ({len(changed)} changed)",
            )
        hook_names = _hook_names(self._hook_now())
        if self._state.unchanged(m, hook_names):
            return None
        fingerprint = _module_state.fingerprint(m, hook_names)
        if fingerprint != self._state.fingerprint:
            if self._unrecognized is not None and self._unrecognized[0] == fingerprint:
                return Fallback("module_changed", self._unrecognized[1])
            try:
                self._attach()
            except ValueError as e:  # RecognizeError, or tensors on several devices
                why = f"the module's tensors changed since it was attached and are no longer recognized: {e}"
                self._unrecognized = (fingerprint, why)
                return Fallback("module_changed", why)
        return None

    def call(self, original: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """One call of the module's forward, planned, or `original(*args, **kwargs)` with the
        fallback recorded. For a host that calls the planner from its own hook around the
        module (ComfyUI's diffusion-model wrapper: `original` is the rest of the chain) rather
        than through the replaced forward of :func:`apply`."""
        return self._call(args, kwargs, original)

    def _call(self, args: Sequence[Any], kwargs: Mapping[str, Any], original: Callable[..., Any] | None = None) -> Any:
        self.calls += 1
        t0 = time.perf_counter()
        why: Call | Fallback | None = self._module_fallback(args, kwargs)
        if why is None:
            self._adapter.host_wrapped = original is not None
            with record_function("streamplan.prepare"):
                why = self._adapter.prepare(args, kwargs)
        if isinstance(why, Fallback):
            self.fallbacks.append(why)
            if why.code == "autograd" and not self._autograd_warned:  # easy to miss: once per module
                self._autograd_warned = True
                warnings.warn(f"streamplan: {type(self._module).__name__} ({self.variant}) runs its original "
                              f"forward, not the planned one (fallback autograd): {why.reason}",
                              stacklevel=_caller_level())
            if self.streams and original is None:  # a host's own chain (`call`) places its weights itself
                raise RuntimeError(
                    f"streamplan: this call cannot run planned ({why.code}: {why.reason}), and the module's own "
                    f"forward cannot run instead: its weights stream to {self._attached.device} from host memory "
                    "(device_memory / resident_blocks)"
                )
            return (original or self._original)(*args, **kwargs)
        run = self._attached.forward_named if self._adapter.named_outputs else self._attached.forward
        t1 = time.perf_counter()
        outputs, prepare_ms = [], 0.0
        with record_function("streamplan.forward"):  # a profiler's name for the planned run
            shared = self._cfg.shares(why.inputs) if self._cfg else None
            for e, raw in enumerate(why.inputs):
                if shared is not None and e != shared:
                    outputs.append(None)  # another group of ranks runs it
                    continue
                outputs.append(run(raw))
                prepare_ms += self._attached.last_prepare_ms
            if shared is not None:
                outputs = self._cfg.exchange(outputs, shared)
        t2 = time.perf_counter()
        self.planned_calls += 1
        _lora.warn(self._attached.lora, self._lora_warned)
        result = self._adapter.output(why, outputs)
        self.last_host_ms = 1e3 * (t1 - t0 + time.perf_counter() - t2) + prepare_ms
        return result


def _hook_names(hook: WeightHook | None) -> Any:
    return hook.names if hook else None


def _caller_level() -> int:
    """warnings.warn's stacklevel of the first frame outside this package and torch.nn's module
    machinery: the code that called the module."""
    inside = (os.path.dirname(__file__), os.path.dirname(torch.nn.modules.module.__file__))
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def apply(
    module: torch.nn.Module,
    budget: str | int | None = None,
    consumer: str = "sdpa",
    *,
    token_chunk: int | None = None,
    feature_slice: int | None = None,
    weight_hook: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
    hooked: Sequence[str] | None = None,
    install: bool = True,
    lora: Sequence[Any] | None = None,
    device_memory: str | int | None = None,
    resident_blocks: int | str | None = None,
    device: str | torch.device | None = None,
    kv_budget: float | None = None,
    dtype: str | torch.dtype | None = None,
    process_group: Any = None,
    sequence_parallel: str = "ulysses",
    cfg_parallel: bool = False,
    shard_weights: bool | None = None,
    link_rate: float | None = None,
) -> Handle:
    """Attaches the planner to `module` and replaces its forward; returns the handle.

    The module is recognized from its ``state_dict()`` names and shapes (the recognition tables
    of checkpoints) and its config. Its parameters are the weights, used in place. The pipeline
    keeps calling the module as before and gets what the original forward returns; each batch
    element runs the planned schedule of its geometry (one plan per geometry, cached).

    Args:
        module: a diffusers ``WanTransformer3DModel`` or ``FluxTransformer2DModel``, or ComfyUI's
            ``WanModel``, ``Flux`` (python/streamplan/_comfy.py) or ``MiniMaxH3Model`` (text to
            video + audio; python/streamplan/_comfy_minimax.py).
        budget: activation memory budget: None (the leanest schedule whose estimated time is within 0.5% of the fastest),
            ``"auto"`` (free device memory less a margin), a size such as ``"12GiB"``, or bytes.
            The fastest schedule that fits is chosen; a call whose geometry no schedule fits
            raises :class:`BudgetError` naming the smallest achievable peak.
        consumer: the attention consumer (see :func:`consumers`).
        token_chunk: force the token chunk (rows per slab) instead of choosing it.
        feature_slice: force the MLP feature slice (-1: never slice) instead of choosing it.
        weight_hook: ``fn(name, tensor) -> tensor``, called with a module tensor's
            ``state_dict()`` name and the tensor each time the planned forward acquires it; the
            forward computes with what it returns (same shape and device; e.g. a LoRA patched in).
            The acquired slice goes into a buffer the plan places, and the plan counts the
            whole weight during the acquire (the step's transient). Without it, a host's own patch path is used
            where the module has one (ComfyUI ops with ``weight_function``).
        hooked: the ``state_dict()`` names `weight_hook` applies to (default: every tensor).
        lora: LoRAs applied lazily per slab on top of the module's weights (never merged):
            a list of ``(source, strength)`` pairs or sources (strength 1), a source being a
            safetensors path or a state dict in kohya, diffusers/PEFT or trainer naming. The
            scale is strength * alpha / rank where the file has an alpha. Keys that match no
            weight are warned about and listed in :attr:`Handle.lora`.
        device_memory: run a module larger than the GPU's free memory: what its calls may hold
            on the device (a size such as ``"8GiB"``, or bytes), for the weights kept there,
            the slots the other blocks' weights stream through from pinned host memory while
            the previous block computes, and the activations. The planner picks the blocks
            kept, the slots and the activation schedule together (:attr:`Handle.residency`),
            and each call runs with the caching allocator capped at that much beyond what the
            rest of the process holds. The module stays in host memory (load it on the CPU)
            and is copied once into pinned buffers; `device` says where the calls run. A size
            nothing fits raises :class:`DeviceMemoryError` naming the smallest that works. A
            call that cannot run planned raises instead of falling back (the module's own
            forward would need its weights on the device).
        resident_blocks: at most this many blocks' weights on the device at once (``"auto"``:
            chosen under `device_memory`); streams the weights like `device_memory`.
        device: where the calls run when the weights stream (e.g. ``"cuda"``); default: the
            module's device.
        dtype: the compute dtype (``"bf16"``, ``torch.float16``, ...); default: the 16/32-bit
            float dtype holding most of the module's bytes. Needed where the module keeps its
            weights in 8 bits and casts them per use (ComfyUI's fp8 models: its manual-cast dtype).
        kv_budget: with ``consumer="sparse"``: the fraction of video key tiles each video query
            tile keeps (default 1: dense); :meth:`Handle.set_kv_budget` changes it per step
            (:func:`kv_budget_at` gives a step's budget of an early/late schedule).
        process_group: a ``torch.distributed`` process group (gloo on the CPU, NCCL on CUDA) for
            sequence parallelism, started e.g. by ``torchrun``. Every rank attaches the same
            module and calls it with the same inputs; each computes its share of the token rows
            and every rank gets the whole output. The plan of each rank holds its own rows
            (``Handle.explain()`` prints the split and the exchanges). With `device_memory`,
            the planner also chooses how the ranks hold the weights (`shard_weights`).
        sequence_parallel: how attention sees the other ranks' rows: ``"ulysses"`` (all-to-all
            exchanges trade rows for K/V head groups; any head count on any rank count) or
            ``"ring"`` (K/V blocks passed around the ranks, each attended by the consumer where
            it returns the log-sum-exp, ``"sdpa"`` and ``"math"`` do, else by ``"math"``; the
            outputs merged in fp32).
        cfg_parallel: with `process_group` of an even size: its ranks in two halves, each
            splitting the rows over its own group; a call with two batch elements of one
            geometry (classifier-free guidance's conditional and unconditional) runs one on
            each half, and the halves trade their outputs.
        shard_weights: with `process_group`, True: each rank keeps 1/N of every block's
            weights on its device and gathers a block from the other ranks as it begins (the
            next one while this one computes), as FSDP does. The module's tensors are read
            once: load the module on the CPU and pass `device`, so that its own copy is not on
            the GPU. False: every rank holds the whole weights (replicated). None (default):
            replicated, or with `device_memory` whichever of replicated (resident or streamed
            from host memory) and sharded the planner predicts fastest within it; under
            `device_memory` blocks that fit stay whole on each rank. ``Handle.residency``
            says which arrangements were weighed and why one was taken.
        link_rate: with `process_group`: the bytes per second each rank sends and receives in
            an all-to-all, with which the plans price the exchanges (the same on every rank).
            Default: measured when attached (an all-to-all of 16 MiB over the group, the
            slowest rank's).
        install: False leaves the module's forward as it is: the host calls
            :meth:`Handle.call` from its own hook around the module instead (ComfyUI's
            diffusion-model wrappers: streamplan.comfy_nodes).

    Raises:
        TypeError: `module` is not a torch module, `budget` has another type, or `weight_hook`
            is not callable.
        ValueError: the module's class is not supported, an option is invalid (the message names
            it and its value), or a handle is attached already.
        RecognizeError: the module's tensors match no known layout (the message names the
            closest layout and what did not fit).
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    if handle_of(module) is not None:
        raise ValueError("module: streamplan is attached already; streamplan.remove(module) first")
    if "forward" in module.__dict__:
        raise ValueError(
            "module: its forward is replaced on the instance already (a hook or an offloading wrapper); "
            "streamplan attaches to the module's own forward"
        )
    adapter = adapter_for(module)
    if adapter is None:
        known = ", ".join(f"{a.host} {a.class_name}" for a in ADAPTERS)
        raise ValueError(f"module: {type(module).__module__}.{type(module).__name__} is not supported (supported: {known})")
    if not isinstance(consumer, str):
        raise TypeError(f"consumer: expected a name (str), got {consumer!r}")
    hook = None
    if weight_hook is not None:
        if not callable(weight_hook):
            raise TypeError(f"weight_hook: expected a function (name, tensor) -> tensor, got {weight_hook!r}")
        names = tuple(hooked or ())
        bad = [n for n in names if not isinstance(n, str)]
        if bad:
            raise TypeError(f"hooked: expected state_dict names (str), got {bad[0]!r}")
        hook = WeightHook(weight_hook, names)
    elif hooked is not None:
        raise ValueError("hooked: names are given but no weight_hook")
    handle = Handle(
        module,
        adapter,
        _budget_text(budget),
        consumer,
        _positive_or_none("token_chunk", token_chunk),
        _positive_or_none("feature_slice", feature_slice),
        hook,
        _lora.inputs(lora),
        (_device_memory_bytes(device_memory), _resident_blocks(resident_blocks), "" if device is None else str(device),
         False),
        _dtype_name(dtype),
        (process_group, sequence_parallel, shard_weights, _link_rate(link_rate)),
        cfg_parallel,
    )
    if kv_budget is not None:
        handle.set_kv_budget(kv_budget)
    if install:
        module.forward = handle._forward
    setattr(module, _ATTR, handle)
    return handle


def _link_rate(rate: float | None) -> float:
    """`link_rate` in bytes per second (0: measured)."""
    if rate is None:
        return 0.0
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"link_rate: expected bytes per second (a finite number > 0), got {rate!r}")
    return float(rate)


def _dtype_name(dtype: str | torch.dtype | None) -> str:
    """The compute dtype as the extension names it ("" for the module's own)."""
    if dtype is None:
        return ""
    for name, d in _DTYPES.items():
        if dtype in (name, d):
            return name
    raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(_DTYPES)} (torch.float32, torch.bfloat16, "
                     "torch.float16)")


def kv_budget_at(
    step: int, steps: int, budget: float = 1.0, *, early_steps: int = 0, early_kv: float = 1.0,
    late_steps: int = 0, late_kv: float = 1.0,
) -> float:
    """The sparse attention budget of denoising step `step` of `steps`: the densest of `budget`
    and the windows covering the step (the first `early_steps` use `early_kv`, the last
    `late_steps` use `late_kv`). Raises ValueError naming a bad value."""
    with _argument_names({**_ARGUMENT_NAMES, "--kv-budget": "budget"}):
        return _C.kv_budget_at(step, steps, budget, early_steps, early_kv, late_steps, late_kv)


def remove(module: torch.nn.Module) -> None:
    """Detaches streamplan from `module`: its original forward runs again.

    Raises:
        ValueError: streamplan is not attached to `module`, or its forward was replaced again
            after :func:`apply` (remove that wrapper first).
    """
    handle = handle_of(module)
    if handle is None:
        raise ValueError("module: streamplan is not attached to it")
    installed = module.__dict__.get("forward")
    if installed is not None and installed is not handle._forward:
        raise ValueError("module: its forward was replaced after streamplan.apply; remove that wrapper first")
    if installed is not None:
        del module.__dict__["forward"]
    delattr(module, _ATTR)
    handle._attached.release_streamed()  # streamed weights' device and pinned memory, now


def handle_of(module: torch.nn.Module) -> Handle | None:
    """The handle attached to `module`, or None."""
    h = module.__dict__.get(_ATTR)
    return h if isinstance(h, Handle) else None
