"""ComfyUI nodes: "Streamplan Memory Planner" (MODEL in, MODEL out).

The node clones the ModelPatcher and adds a diffusion-model wrapper to the clone (ComfyUI's
``add_wrapper_with_key``; nothing of ComfyUI is monkeypatched). When the sampler calls the
diffusion model, the wrapper runs the planned forward on the effective model: the module ComfyUI
loaded, with the LoRA ComfyUI patched into it, or with the patches its ops apply at cast time
acquired through ComfyUI's own patch functions (the package's weight hook). A call the planner
does not model runs the rest of ComfyUI's wrapper chain unchanged, with the reason recorded.

Attention: the consumer ``comfy`` runs ComfyUI's selected attention function
(``comfy.ldm.modules.attention.optimized_attention``) on each Q slab against the global K and V,
with the capabilities of the SDPA baseline; where that function is ComfyUI's PyTorch one, the
call runs PyTorch's scaled_dot_product_attention with the ``sdpa`` consumer's kernel choice (on
CUDA cuDNN's fused attention where it passes its self-test and is not slower). ``sdpa`` and the
other built-in consumers are offered too. When another node installs an attention override
(``transformer_options["optimized_attention_override"]``), the call plans with the consumer
``comfy-override``, which calls ComfyUI's attention with the call's transformer_options (so the
override runs) and has the capabilities the override declares in its attribute
``streamplan_caps`` (the package's consumer caps); an override that declares none leaves them
undeclared, so streamed Q is rejected for it and attention runs whole, which the plan says.

After each sampling call that made a new plan or recorded a fallback, the node's text (ComfyUI's
progress text on the node, and the log) says what was planned: per geometry the estimated peak
and floor, per call the fallbacks with their reasons; with ``explain`` the whole plan.

"Streamplan Sparse Attention" (and its advanced variant) puts sparse-attention settings on a
clone of the model (``transformer_options["streamplan_sparse"]``) and makes sure the model has
the planner's wrapper (the Memory Planner's, or one with its defaults): the two nodes compose in
either order. Per call the wrapper picks the backend once per device and dtype ("auto": the
first of ``sparse`` and ``int8`` that passes its self-test there, else the planner's own dense
consumer; an explicit backend that cannot run is an error) and sets the KV budget of the
sampler's step (``sample_sigmas`` and the call's sigma: the densest of the video budget and the
early / late windows covering the step). Text, audio and conditioning rows stay dense (the
sparse consumer routes video query tiles only).

Weights ComfyUI leaves in host memory (its low-VRAM partial loading: the rest of the model is on
the GPU) stream through streamplan's device slots, prefetched on a side stream, instead of
ComfyUI's cast layer by layer: the weights ComfyUI put on the GPU are read where they are, those in
host memory are copied from where they are (ComfyUI pins them), so nothing is loaded twice.
"Streamplan Residency" sets the device memory ("auto": what ComfyUI reports free when the call
comes, less its reserve) and the resident blocks; without it, a call that finds weights in host
memory streams them under those defaults. Weights ComfyUI patches at cast time (a LoRA on layers
it left in host memory) stream too; the patches run on the streamed copy. When a sampling ends
and when ComfyUI unloads the model, the planner gives back its slots and the blocks it kept
(ComfyUI's ON_CLEANUP and ON_DETACH callbacks), so that outside a sampling ComfyUI's accounting
is all there is.

This module imports ComfyUI only when a node runs, so that it loads (and its option handling is
tested) without ComfyUI.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import logging
from typing import Any, Callable

import torch

from . import _api, _consumers
from ._adapter import Fallback
from ._comfy import OVERRIDE_CONSUMED, unsupported_weights, weight_formats
from ._comfy_residency import (AUTO_STEP, DEVICE_MEMORY_HELP, RESIDENCY_KEY, RESIDENT_HELP,  # noqa: F401  (node API)
                               ResidencySettings, host_bytes, host_placed)

CATEGORY = "advanced/model"
BUDGET_HELP = '"auto" (free memory less a margin), "none" (the leanest plan as fast as the fastest, within 0.5%) or a size ("12GiB")'


def parse_budget(text: str) -> str | None:
    """The node's budget text as streamplan.apply takes it; ValueError naming the value."""
    t = (text or "").strip()
    if t.lower() in ("", "none"):
        return None
    if t.lower() == "auto":
        return "auto"
    from . import _C

    try:
        _C.parse_budget(t)
    except Exception as e:  # noqa: BLE001 - the parser's own message, named
        raise ValueError(f"budget: {t!r} is not {BUDGET_HELP}: {e}") from None
    return t


# The transformer_options of the call the planner runs now (the override consumer passes them on).
_CALL_OPTIONS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("streamplan_call_options", default=None)


def comfy_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int, q_total: int,
                    layer: int) -> torch.Tensor:
    """ComfyUI's selected attention on one Q slab [1, G, rows, d] against the global K and V;
    with the call's transformer_options, so that an attention override there runs."""
    from comfy.ldm.modules import attention

    opts = _CALL_OPTIONS.get()
    if comfy_runs_sdpa(opts):
        key = (str(q.device), q.dtype, q.shape[-1])
        if key not in SDPA_KERNELS:
            SDPA_KERNELS[key] = _api._C.sdpa_kernel(str(q.device), _api._dtype_name(q.dtype), q.shape[-1])
        return _api._C.sdpa_attention(q, k, v, q.shape[-1] ** -0.5)
    extra = {"transformer_options": opts} if opts is not None else {}
    return attention.optimized_attention(q, k, v, q.shape[1], skip_reshape=True, skip_output_reshape=True, **extra)


# The kernel PyTorch's SDPA ran as, per (device, dtype, head_dim), where ComfyUI's attention is it.
SDPA_KERNELS: dict[tuple[str, torch.dtype, int], str] = {}


def comfy_runs_sdpa(opts: dict | None = None) -> bool:
    """Whether ComfyUI's selected attention is its PyTorch one (scaled_dot_product_attention,
    nothing else) with no attention override in the call's options. Such calls run through the
    `sdpa` consumer's kernel choice: the same function, on CUDA with cuDNN's fused attention
    where it passed its self-test and measured no slower than PyTorch's own choice."""
    from comfy.ldm.modules import attention

    return attention.optimized_attention is attention.attention_pytorch and not (
        opts and "optimized_attention_override" in opts)


COMFY_CONSUMER = "comfy"
OVERRIDE_CONSUMER = "comfy-override"
COMFY_CAPS = {"accepts_bounded_q": True, "requires_global_k": True, "requires_global_v": True, "slab_output": True,
              "dtypes": ["fp32", "bf16", "fp16"]}


def comfy_caps() -> dict:
    """COMFY_CAPS, with strided heads where ComfyUI's selected attention is its PyTorch one
    (scaled_dot_product_attention reads strided heads in place; its other attention functions
    reshape, which would copy K and V)."""
    return {**COMFY_CAPS, "strided_heads": comfy_runs_sdpa()}


def _options_of(module: torch.nn.Module, args: tuple, kwargs: dict) -> dict:
    try:
        bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
    except TypeError:
        return {}
    opts = bound.arguments.get("transformer_options")
    return opts if isinstance(opts, dict) else {}


SPARSE_KEY = "streamplan_sparse"  # transformer_options entry of the Sparse Attention node
SPARSE_BACKENDS = ("auto", "sparse", "int8", "dense")


@dataclasses.dataclass(frozen=True)
class SparseSettings:
    """The Sparse Attention node's inputs: the video KV budget, the early and late windows of
    the sampler's steps and their budgets, and the backend ("auto", "sparse", "int8", "dense")."""

    kv_budget: float = 0.3
    early_steps: int = 2
    early_kv: float = 0.5
    late_steps: int = 2
    late_kv: float = 0.5
    backend: str = "auto"

    def __post_init__(self) -> None:
        if self.backend not in SPARSE_BACKENDS:
            raise ValueError(f"backend: {self.backend!r} is not one of {', '.join(SPARSE_BACKENDS)}")
        self.budget_at(0, 1)  # the extension names a bad budget or window

    def budget_at(self, step: int, steps: int) -> float:
        return _api.kv_budget_at(step, steps, self.kv_budget, early_steps=self.early_steps, early_kv=self.early_kv,
                                 late_steps=self.late_steps, late_kv=self.late_kv)


def sampler_step(opts: dict) -> tuple[int, int] | None:
    """(step, steps) of the call from ComfyUI's ``sample_sigmas`` and the call's ``sigmas``:
    the schedule's sigma nearest the call's; None outside a sampler."""
    schedule, sigma = opts.get("sample_sigmas"), opts.get("sigmas")
    if not isinstance(schedule, torch.Tensor) or not isinstance(sigma, torch.Tensor) or schedule.numel() < 2:
        return None
    s = schedule.detach().flatten().double().cpu()[:-1]
    now = float(sigma.detach().flatten()[0])
    return int(torch.argmin((s - now).abs())), int(s.numel())


def _call_device(module: torch.nn.Module, args: tuple, kwargs: dict) -> torch.device:
    """Where the call runs: its first tensor argument's device, else the module's."""
    x = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
    return x.device if x is not None else next(module.parameters()).device


def consumer_names() -> list[str]:
    return [COMFY_CONSUMER] + [c for c in _consumers.consumers() if c != COMFY_CONSUMER]


class PlannerWrapper:
    """ComfyUI's diffusion-model wrapper that runs the planned forward; one handle per module."""

    streamplan_wrapper = True  # the adapters do not count it among the wrappers a call must run

    def __init__(self, budget: str | None, consumer: str, explain: bool, node_id: str | None = None,
                 report: Callable[[str], None] | None = None, token_chunk: int | None = None,
                 dtype: torch.dtype | None = None) -> None:
        self.budget, self.consumer, self.explain, self.node_id = budget, consumer, explain, node_id
        self.report = report or self._report
        self.token_chunk = token_chunk  # streamplan.apply's option (scripts and tests; not a node input)
        self.dtype = dtype  # ComfyUI's compute dtype (what it casts 8-bit weights to); None: the module's
        self.handles: dict[tuple, _api.Handle] = {}
        # Sparse attention (the Sparse Attention node): the backend chosen per (settings, device,
        # dtype) with the self-test results, and the KV budget of each sampler step seen.
        self.backends: dict[tuple, tuple[str, list[str]]] = {}
        self.step_budgets: dict[str, dict[tuple[int, int], float]] = {}
        # Weight residency per (settings, device): (device memory bytes, resident blocks, device, in place).
        self.residencies: dict[tuple, tuple[int, int, str, bool]] = {}
        self.host_dynamic = False  # the model is ComfyUI's DynamicVRAM one (set where the node installs it)
        self.placed: dict[tuple[int, str], bool] = {}  # per (module, device): host_placed, until release()
        # Modules the planner cannot attach to (weights it does not run, a layout it does not
        # recognize): the fallback every call of theirs records, and the calls.
        self.refused: dict[int, tuple[torch.nn.Module, Fallback, list[Fallback]]] = {}

    def handle(self, module: torch.nn.Module, override: Any = None, consumer: str | None = None,
               residency: tuple[int, int, str, bool] | None = None) -> _api.Handle:
        """The module's handle; with an attention override, one whose consumer calls it, with
        the capabilities it declares (a handle of its own: the plans differ); with `consumer`
        (a sparse-attention backend), one that runs that consumer; with `residency`, one whose
        weights in host memory stream (streamplan.Handle's residency)."""
        key = (id(module), None if override is None else id(override), consumer, residency)
        h = self.handles.get(key)
        if h is not None and h.module is module:
            return h
        for other in [k for k in self.handles if k[:3] == key[:3] and k[3] is not None]:
            del self.handles[other]  # the same module streamed under another device memory: replaced
        if self.consumer == COMFY_CONSUMER and COMFY_CONSUMER not in _consumers.consumers():
            _consumers.register_consumer(COMFY_CONSUMER, comfy_attention, caps=comfy_caps())
        if consumer is None and override is None and residency is None:
            h = _api.apply(module, budget=self.budget, consumer=self.consumer, token_chunk=self.token_chunk,
                           install=False, dtype=self.dtype)
        else:  # a handle of the wrapper's own, not attached to the module
            if override is not None:
                caps = dict(getattr(override, "streamplan_caps", None) or {})
                if OVERRIDE_CONSUMER in _consumers.consumers():  # handles made already keep the caps they had
                    _consumers.unregister_consumer(OVERRIDE_CONSUMER)
                _consumers.register_consumer(OVERRIDE_CONSUMER, comfy_attention, caps=caps)
                consumer = OVERRIDE_CONSUMER
            h = _api.Handle(module, _api.adapter_for(module), _api._budget_text(self.budget), consumer or self.consumer,
                            _api._positive_or_none("token_chunk", self.token_chunk), 0,
                            residency=residency or (0, -1, "", False), dtype=_api._dtype_name(self.dtype))
        self.handles[key] = h
        return h

    def refusal(self, module: torch.nn.Module) -> Fallback | None:
        """Why the planner cannot attach to the module at all, if it cannot (recorded once)."""
        known = self.refused.get(id(module))
        if known is not None and known[0] is module:
            return known[1]
        why = unsupported_weights(module)
        if why is not None:
            self.refused[id(module)] = (module, why, [])
        return why

    def backend(self, settings: SparseSettings, device: torch.device, dtype: torch.dtype) -> tuple[str, list[str]]:
        """The sparse-attention backend for the device and dtype, and the self-test results:
        "auto" takes the first of sparse and int8 that can run there, else dense (the planner's
        own consumer); an explicit backend that cannot run raises RuntimeError with the reason."""
        key = (settings.backend, str(device), dtype)
        known = self.backends.get(key)
        if known is not None:
            return known
        order = {"auto": ["sparse", "int8"], "dense": []}.get(settings.backend, [settings.backend])
        results: list[str] = []
        chosen = self.consumer
        for name in order:
            why = _api._C.consumer_unusable(name, str(device), _api._dtype_name(dtype))
            if not why:
                results.append(f"{name}: self-test passed on {device}")
                chosen = name
                break
            if settings.backend != "auto":
                raise RuntimeError(f"streamplan: sparse attention backend '{name}' was asked for and cannot run: {why}")
            results.append(f"{name}: not used: {why}")
        self.backends[key] = (chosen, results)
        return chosen, results

    def sparse_consumer(self, settings: SparseSettings, module: torch.nn.Module, args: tuple, kwargs: dict,
                        opts: dict) -> tuple[str | None, float | None]:
        """The consumer of a call under the Sparse Attention node's settings (None: the
        planner's own) and the KV budget of the call's sampler step (None: not routed)."""
        device = _call_device(module, args, kwargs)
        dtype = self.dtype or next(module.parameters()).dtype
        consumer, _ = self.backend(settings, device, dtype)
        if consumer != "sparse":
            return (None if consumer == self.consumer else consumer), None
        at = sampler_step(opts)
        step, steps = at if at is not None else (-1, 0)
        kv = settings.budget_at(step, steps) if at is not None else settings.kv_budget
        self.step_budgets.setdefault(consumer, {})[(step, steps)] = kv
        return consumer, kv

    def residency(self, module: torch.nn.Module, args: tuple, kwargs: dict,
                  opts: dict) -> tuple[int, int, str, bool] | None:
        """The call's weight residency: the Residency node's settings, or its defaults where
        ComfyUI left weights in host memory; None where every weight is on the call's device
        and no Residency node asked. The handle's residency is fixed when it is made: "auto"
        device memory is what ComfyUI reports free at the first call of a sampling."""
        settings = opts.get(RESIDENCY_KEY)
        if self.host_dynamic:  # DynamicVRAM places the weights itself (the Residency node says so)
            return None
        device = _call_device(module, args, kwargs)
        if not isinstance(settings, ResidencySettings):
            # ComfyUI places the weights when a sampling starts: one look per module and sampling.
            placed = self.placed.get((id(module), str(device)))
            if placed is None:
                placed = self.placed[(id(module), str(device))] = host_placed(module, device)
            if not placed:
                return None
            settings = ResidencySettings()
        known = self.residencies.get((settings, str(device)))
        if known is None:
            blocks = settings.blocks()
            known = (settings.bytes_on(device), 0 if blocks == "auto" else blocks, str(device), True)
            self.residencies[(settings, str(device))] = known
        return known

    def release(self) -> None:
        """Gives back what streamed weights hold (ComfyUI ended a sampling or unloads the model);
        the next sampling takes the device memory ComfyUI reports free then."""
        for h in self.handles.values():
            if h.streams:
                h.release()
        self.residencies.clear()
        self.placed.clear()

    def __call__(self, executor: Any, *args: Any, **kwargs: Any) -> Any:
        module = executor.class_obj
        why = self.refusal(module)
        opts = _options_of(module, args, kwargs)
        override = opts.get("optimized_attention_override")
        sparse = opts.get(SPARSE_KEY)
        consumer, kv, residency = None, None, None
        if why is None and isinstance(sparse, SparseSettings) and override is None:
            # An explicit backend that cannot run is the user's hard requirement: it raises.
            consumer, kv = self.sparse_consumer(sparse, module, args, kwargs, opts)
        if why is None:
            try:
                residency = self.residency(module, args, kwargs, opts)
                h = self.handle(module, override, consumer, residency)
                if kv is not None:
                    h.set_kv_budget(kv)
            except (ValueError, TypeError, RuntimeError) as e:  # RecognizeError is a ValueError
                why = Fallback("unrecognized" if residency is None else "residency", f"{type(module).__name__}: {e}")
                self.refused[id(module)] = (module, why, [])
        if why is not None:
            calls = self.refused[id(module)][2]
            calls.append(why)
            if len(calls) == 1:
                self.report(f"streamplan: {type(module).__name__} runs ComfyUI's own forward on every call: "
                            f"fallback {why.code}: {why.reason}")
            return executor(*args, **kwargs)
        if override is not None:
            opts[OVERRIDE_CONSUMED] = True  # this handle's consumer runs the override
        plans, fallbacks = len(h.plans), len(h.fallbacks)
        token = _CALL_OPTIONS.set(opts)
        try:
            out = h.call(executor, args, kwargs)
        finally:
            _CALL_OPTIONS.reset(token)
            opts.pop(OVERRIDE_CONSUMED, None)
        if len(h.plans) != plans or len(h.fallbacks) != fallbacks:
            self.report(self.summary(h))
        return out

    def status(self) -> str:
        """The status text of every module this wrapper ran (summary), or what it has not run yet."""
        parts = [self.summary(h) for h in self.handles.values()]
        for module, why, calls in self.refused.values():
            parts.append(f"streamplan: {type(module).__name__}: {len(calls)} calls ran ComfyUI's own forward: "
                         f"fallback {why.code}: {why.reason}")
        return "\n".join(parts) or "streamplan: no call of the diffusion model yet"

    def summary(self, h: _api.Handle) -> str:
        lines = [f"streamplan: {type(h.module).__name__} as {h.variant}, {h.planned_calls} of {h.calls} calls planned, "
                 f"budget {h.budget or 'none'}",
                 f"  attention: consumer {h.consumer} ({attention_provider(h.consumer)})"]
        for p in h.plans:
            formats = ", ".join(f"{n} linears {f} ({provider})" for f, n, provider in p.get("formats", []))
            lines.append(f"  {p['key']}: estimated peak {_size(p['estimated_peak_bytes'])}, "
                         f"floor {_size(p['floor_bytes'])}, {p['calls']} calls")
            if formats:
                lines.append(f"    weights: {formats}")
        for (backend, device, dtype), (chosen, results) in self.backends.items():
            lines.append(f"  sparse attention ({backend}) on {device}, {dtype}: backend {chosen}"
                         + ("".join(f"; {r}" for r in results)))
        steps = self.step_budgets.get(h.consumer)
        if steps:
            seen = ", ".join(f"step {s + 1} of {n}: {kv:g}" if n else f"outside a sampler: {kv:g}"
                             for (s, n), kv in sorted(steps.items()))
            lines.append(f"  video KV budget by sampler step: {seen} (text, audio and conditioning rows stay dense)")
        if h.streams:
            r = h.residency
            device_memory, resident, device, _ = h._residency
            lines.append(f"  weights: those ComfyUI left in host memory stream to {device} (device memory "
                         f"{_size(device_memory)}, resident blocks {resident or 'auto'})"
                         + (f": {r['kept_blocks']} blocks kept, {len(r['streamed_blocks'])} streamed through {r['slots']} "
                            f"slot{'s' if r['slots'] != 1 else ''}, predicted {r['predicted_ms']:.0f} ms against {r['all_resident_ms']:.0f} ms "
                            "all resident" if r else "")
                         + (f"; the weights only the prologue reads ({_size(r['prologue_bytes'])}) stay in host memory, "
                            "copied as it reads them" if r and r.get("prologue_copied") else ""))
            pinned, pageable = host_bytes(h.module)
            if pageable > max(64 << 20, pinned // 100):  # not a few small buffers
                lines.append(f"  host memory: {_size(pageable)} of the weights ComfyUI left there are pageable "
                             f"({_size(pinned)} pinned): their copies to the device run at a fraction of the pinned "
                             "rate (ComfyUI pins offloaded weights up to its pinned-memory limit; "
                             "--disable-pinned-memory turns it off)")
        if h.consumer == COMFY_CONSUMER and comfy_runs_sdpa():
            for (device, dtype, dim), kernel in SDPA_KERNELS.items():
                lines.append(f"  attention kernel on {device}, {dtype}, head_dim {dim}: PyTorch's SDPA as {kernel}")
        if h.consumer == OVERRIDE_CONSUMER:
            lines.append("  attention override: it runs as the consumer 'comfy-override' with the capabilities it "
                         "declares (streamplan_caps); what it leaves undeclared keeps attention unstreamed")
        for f in h.fallbacks[-8:]:
            lines.append(f"  fallback {f.code}: {f.reason}")
        if self.explain and h.plans:
            lines.append(h.explain())
        return "\n".join(lines)

    def _report(self, text: str) -> None:
        logging.info(text)
        try:
            from server import PromptServer

            if self.node_id is not None and PromptServer.instance is not None:
                PromptServer.instance.send_progress_text(text, self.node_id)
        except Exception:  # noqa: BLE001 - no server (a script), or an older one: the log has it
            pass


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def attention_provider(consumer: str) -> str:
    """What computes attention for a consumer: ComfyUI's selected function, or streamplan's own."""
    if consumer in (COMFY_CONSUMER, OVERRIDE_CONSUMER):
        try:
            from comfy.ldm.modules import attention

            fn = getattr(attention.optimized_attention, "__name__", str(attention.optimized_attention))
        except Exception:  # noqa: BLE001 - no ComfyUI (a script): say what would run
            fn = "optimized_attention"
        extra = ", through the override" if consumer == OVERRIDE_CONSUMER else ""
        return f"ComfyUI's {fn}{extra}"
    return f"streamplan's '{consumer}'"


class _ModelNode:
    """A node that takes a MODEL and returns a patched clone with its status text."""

    RETURN_TYPES = ("MODEL", "STRING")
    RETURN_NAMES = ("model", "status")
    FUNCTION = "patch"
    CATEGORY = CATEGORY


class StreamplanMemoryPlanner(_ModelNode):
    """MODEL in, MODEL out: the model runs through streamplan's planned forward."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 - ComfyUI's name
        return {
            "required": {
                "model": ("MODEL",),
                "budget": ("STRING", {"default": "none", "tooltip": BUDGET_HELP}),
                "consumer": (consumer_names(), {"default": COMFY_CONSUMER}),
                "explain": ("BOOLEAN", {"default": False}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    DESCRIPTION = ("Runs the diffusion model with bounded activation memory: plans the effective model (LoRA "
                   "and patches applied) before sampling and falls back per call where it cannot.")

    def patch(self, model: Any, budget: str, consumer: str, explain: bool,
              unique_id: str | None = None) -> tuple[Any, str]:
        dtype = compute_dtype(model)
        wrapper = PlannerWrapper(parse_budget(budget), consumer, explain, unique_id, dtype=dtype)
        m = model.clone()
        # One planner per model: this node's replaces one added before (the Sparse Attention
        # or Residency node's defaults, or an earlier Memory Planner's); their settings stay.
        install(m, wrapper)
        module = getattr(getattr(model, "model", None), "diffusion_model", None)
        if not isinstance(module, torch.nn.Module):
            return (m, "streamplan: the model has no diffusion_model to plan")
        why = wrapper.refusal(module)
        if why is not None:
            return (m, f"streamplan: {type(module).__name__} will run ComfyUI's own forward: fallback {why.code}: "
                       f"{why.reason}")
        formats = ", ".join(f"{n} {f}" for f, n in weight_formats(module).items())
        return (m, f"streamplan: {type(module).__name__}, weights {formats}, compute {dtype}; attention: consumer "
                   f"{consumer} ({attention_provider(consumer)}); planned at the first sampling call (the Streamplan "
                   "Status node shows the plan after sampling)")


def install(model: Any, wrapper: PlannerWrapper) -> None:
    """Puts the planner on a ModelPatcher (replacing one there) with ComfyUI's callbacks: when a
    sampling ends (ON_CLEANUP) and when ComfyUI unloads the model (ON_DETACH) the planner gives
    back what its streamed weights hold on the device and in pinned host memory."""
    import comfy.patcher_extension as ext

    wrapper.host_dynamic = bool(getattr(model, "is_dynamic", lambda: False)())
    model.remove_wrappers_with_key(ext.WrappersMP.DIFFUSION_MODEL, "streamplan")
    model.add_wrapper_with_key(ext.WrappersMP.DIFFUSION_MODEL, "streamplan", wrapper)
    for when in (ext.CallbacksMP.ON_CLEANUP, ext.CallbacksMP.ON_DETACH):
        model.remove_callbacks_with_key(when, "streamplan")
        model.add_callback_with_key(when, "streamplan", _release_streamed)


def _release_streamed(patcher: Any, *_: Any) -> None:
    # No import here: ComfyUI also detaches from ModelPatcher.__del__, at interpreter exit too.
    for w in getattr(patcher, "wrappers", {}).get("diffusion_model", {}).get("streamplan", []):
        if isinstance(w, PlannerWrapper):
            w.release()


def ensure_planner(model: Any) -> None:
    """The Memory Planner's defaults on a model that has no planner yet."""
    if planner_of(model) is None:
        install(model, PlannerWrapper(None, COMFY_CONSUMER, False, dtype=compute_dtype(model)))


def compute_dtype(model: Any) -> torch.dtype | None:
    """ComfyUI's compute dtype of a ModelPatcher's model (what it casts stored weights to), if it says."""
    base = getattr(model, "model", None)
    return base.get_dtype_inference() if hasattr(base, "get_dtype_inference") else None


def planner_of(model: Any) -> PlannerWrapper | None:
    """The planner wrapper the Streamplan Memory Planner node added to a ModelPatcher, if any."""
    import comfy.patcher_extension as ext

    for w in model.get_wrappers(ext.WrappersMP.DIFFUSION_MODEL, "streamplan"):
        if isinstance(w, PlannerWrapper):
            return w
    return None


class StreamplanStatus:
    """STRING out, after sampling: the planner's status for a model (per geometry the attention
    and weight-format providers, the estimated peak and the floor, every fallback)."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 - ComfyUI's name
        return {"required": {"model": ("MODEL",)},
                "optional": {"after": ("LATENT", {"tooltip": "the sampler's output: the status is read after it"})}}

    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("status",)
    FUNCTION = "status"
    CATEGORY = CATEGORY
    OUTPUT_NODE = True
    DESCRIPTION = "The Streamplan Memory Planner's status text for this model, after the sampler ran."

    def status(self, model: Any, after: Any = None) -> tuple[str]:
        w = planner_of(model)
        text = w.status() if w is not None else "streamplan: no Streamplan Memory Planner on this model"
        logging.info(text)
        return (text,)


KV_HELP = "fraction of video key tiles each video query tile keeps (1: dense)"
BACKEND_HELP = ('"auto": the first of sparse and int8 that passes its self-test on this GPU, else dense attention; '
                "an explicit backend must run (an error where it cannot)")


class StreamplanSparseAttention(_ModelNode):
    """MODEL in, MODEL out: sparse attention over the video rows, with the KV budget per sampler
    step (the first and last 2 steps at 50%, the middle ones at the video budget)."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 - ComfyUI's name
        return {
            "required": {
                "model": ("MODEL",),
                "kv_budget": ("FLOAT", {"default": 0.3, "min": 0.01, "max": 1.0, "step": 0.01, "tooltip": KV_HELP}),
                "backend": (list(SPARSE_BACKENDS), {"default": "auto", "tooltip": BACKEND_HELP}),
            },
        }

    DESCRIPTION = ("Block-sparse attention over the video rows (an approximation: the result changes), with the "
                   "KV budget following the sampler's step; composes with the Streamplan Memory Planner in either order.")

    def patch(self, model: Any, kv_budget: float, backend: str, early_steps: int = 2, early_kv: float = 0.5,
              late_steps: int = 2, late_kv: float = 0.5) -> tuple[Any, str]:
        settings = SparseSettings(kv_budget, early_steps, early_kv, late_steps, late_kv, backend)
        m = model.clone()
        m.model_options.setdefault("transformer_options", {})[SPARSE_KEY] = settings
        ensure_planner(m)
        return (m, f"streamplan: sparse attention, video KV budget {kv_budget:g} (first {early_steps} steps "
                   f"{early_kv:g}, last {late_steps} steps {late_kv:g}), backend {backend}; the backend is chosen at "
                   "the first sampling call (the Streamplan Status node shows it and each step's budget)")


class StreamplanSparseAttentionAdvanced(StreamplanSparseAttention):
    """The same with the early and late windows as inputs."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 - ComfyUI's name
        types = super().INPUT_TYPES()
        types["required"].update({
            "early_steps": ("INT", {"default": 2, "min": 0, "max": 1000}),
            "early_kv": ("FLOAT", {"default": 0.5, "min": 0.01, "max": 1.0, "step": 0.01}),
            "late_steps": ("INT", {"default": 2, "min": 0, "max": 1000}),
            "late_kv": ("FLOAT", {"default": 0.5, "min": 0.01, "max": 1.0, "step": 0.01}),
        })
        return types


class StreamplanResidency(_ModelNode):
    """MODEL in, MODEL out: the weights ComfyUI leaves in host memory stream to the GPU through
    streamplan's slots, prefetched on a side stream, under a device memory."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 - ComfyUI's name
        return {
            "required": {
                "model": ("MODEL",),
                "device_memory": ("STRING", {"default": "auto", "tooltip": DEVICE_MEMORY_HELP}),
                "resident_blocks": ("STRING", {"default": "auto", "tooltip": RESIDENT_HELP}),
            },
        }

    DESCRIPTION = ("Streams the weights ComfyUI keeps in host memory (low-VRAM partial loading) through device slots "
                   "with prefetch, instead of casting them layer by layer; composes with the other Streamplan nodes.")

    def patch(self, model: Any, device_memory: str, resident_blocks: str) -> tuple[Any, str]:
        settings = ResidencySettings(device_memory, resident_blocks)
        m = model.clone()
        dynamic = getattr(m, "is_dynamic", lambda: False)()
        if dynamic:
            return (m, "streamplan: residency is off: ComfyUI's DynamicVRAM places this model's weights on demand; "
                       "start ComfyUI with --disable-dynamic-vram for streamplan to stream them")
        m.model_options.setdefault("transformer_options", {})[RESIDENCY_KEY] = settings
        ensure_planner(m)
        return (m, f"streamplan: weights in host memory stream to the GPU, device memory {settings.device_memory}, "
                   f"resident blocks {settings.resident_blocks}; arranged at the first sampling call (the Streamplan "
                   "Status node shows it)")


NODE_CLASS_MAPPINGS = {"StreamplanMemoryPlanner": StreamplanMemoryPlanner, "StreamplanStatus": StreamplanStatus,
                       "StreamplanSparseAttention": StreamplanSparseAttention,
                       "StreamplanSparseAttentionAdvanced": StreamplanSparseAttentionAdvanced,
                       "StreamplanResidency": StreamplanResidency}
NODE_DISPLAY_NAME_MAPPINGS = {"StreamplanMemoryPlanner": "Streamplan Memory Planner",
                              "StreamplanStatus": "Streamplan Status",
                              "StreamplanSparseAttention": "Streamplan Sparse Attention",
                              "StreamplanSparseAttentionAdvanced": "Streamplan Sparse Attention (Advanced)",
                              "StreamplanResidency": "Streamplan Residency"}
