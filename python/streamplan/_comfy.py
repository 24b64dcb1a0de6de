"""Adapters of ComfyUI's diffusion modules: what every ComfyUI module shares (ComfyAdapter), and
ComfyUI's WanModel (comfy.ldm.wan.model; Wan 2.1 text to video) and Flux (comfy.ldm.flux.model;
Flux.1 dev and schnell). MiniMax H3 has its own file (_comfy_minimax.py).

ComfyUI's sampler calls these modules with ``transformer_options``. What in it changes the
computation runs the original forward, with the fallback's code: block replacements and patches
(``block_patch``, ``patches``), an attention override (``attention_override``) and
diffusion-model wrappers (``wrappers``). So do weights ComfyUI holds in a form streamplan does not
run (``weight_format``: nvfp4, mxfp8, W4A4, W4A8); fp8 casts and ComfyUI's QuantizedTensor fp8 and
int8 layouts run in the matching streamplan format, read in place. Weights that ComfyUI's ops patch when they cast them
(``weight_function``: LoRA under low-VRAM loading) are acquired through the same path, by a
weight hook (``ComfyAdapter.host_hook``). Other keys of ``transformer_options`` (sigmas, cond_or_uncond, uuids,
...) do not change what the model computes and are ignored.

**WanModel.forward(x, timestep, context, clip_fea, time_dim_concat, transformer_options, **kw)**:
``x [B, C, F, H, W]`` -> raw ``latents`` per element, ``timestep [B]`` (sigma * 1000) -> raw
``timestep``, ``context [B, L, text_dim]`` -> raw ``text``. The answer is ``[B, C_out, F, H, W]``
in x's dtype. Falls back for image conditioning (``clip_fea``: ``image_conditioning``),
concatenated condition frames (``time_dim_concat``: ``condition_frames``), a reference latent
(``reference_latent``), one timestep per token (``per_token_timestep``) and sides that are not
multiples of the patch (``arguments``: ComfyUI pads them).

**Flux.forward(x, timestep, context, y, guidance, ref_latents, control, transformer_options, **kw)**:
``x [B, C, H, W]`` is packed into 2 x 2 patches (raw ``latents``, ``img_ids`` (0, row, col)),
``context`` -> raw ``text`` with zero ``txt_ids``, ``y`` -> raw ``pooled`` (zeros where None),
``timestep`` and ``guidance`` (sigma-scaled, as ComfyUI passes them) -> raw ``timestep``,
``guidance``. The answer is unpacked to ``[B, C, H, W]``. Falls back for reference latents
(``reference_latents``), ControlNet residuals (``controlnet``), an attention mask
(``attention_mask``), odd sides (``arguments``: ComfyUI pads them), a guidance-distilled
model called without a guidance (``arguments``) and text positions on rope axes
(``params.txt_ids_dims``, ``config``).
"""

from __future__ import annotations

import sys
from typing import Any, Iterator, Mapping, Sequence

import torch

from ._adapter import (Adapter, Call, Fallback, WeightHook, check_tensor, flux1_sidecar, per_element,
                       per_element_scalar, shape_text)


# Set in transformer_options by streamplan's ComfyUI node when its plan's attention consumer
# calls the override itself (comfy_nodes): the call then plans, with the override's declared
# capabilities (none: attention unstreamed).
OVERRIDE_CONSUMED = "streamplan_attention_override_consumed"


class ComfyAdapter(Adapter):
    """What ComfyUI's diffusion modules share: transformer_options and weights cast by ComfyUI."""

    module_prefix = "comfy."
    host = "ComfyUI"

    def wrappers(self, opts: Mapping[str, Any]) -> list[Any]:
        """The diffusion-model wrappers the original forward would run, as ComfyUI collects them,
        but streamplan's own (comfy_nodes: the one making this call)."""
        found: list[Any] | None = None
        comfy = getattr(sys.modules.get(type(self.module).__module__), "comfy", None)
        ext = getattr(comfy, "patcher_extension", None)
        if ext is not None:
            try:
                found = list(ext.get_all_wrappers(ext.WrappersMP.DIFFUSION_MODEL, opts))
            except Exception:  # noqa: BLE001 - an unexpected form: decide from the dict below
                found = None
        if found is None:
            found = []
            w = opts.get("wrappers")
            d = w.get("diffusion_model") if isinstance(w, Mapping) else None
            for v in (d.values() if isinstance(d, Mapping) else [d or []]):
                found.extend(v)
        return [w for w in found if not getattr(w, "streamplan_wrapper", False)]

    def options_fallback(self, opts: Any) -> Fallback | None:
        """The fallback for what transformer_options carries that changes the computation."""
        if not isinstance(opts, Mapping):
            return Fallback("arguments", f"transformer_options is {type(opts).__name__}, not a dict")
        for key, code in (("patches_replace", "block_patch"), ("patches", "patches")):
            v = opts.get(key)
            if v and any(bool(x) for x in (v.values() if isinstance(v, Mapping) else [v])):
                what = sorted(map(str, v)) if isinstance(v, Mapping) else v
                return Fallback(code, f"transformer_options['{key}'] is not empty: {what}")
        if opts.get("optimized_attention_override") is not None and not opts.get(OVERRIDE_CONSUMED):
            return Fallback("attention_override",
                            "transformer_options['optimized_attention_override'] replaces attention")
        wrappers = self.wrappers(opts)
        if wrappers:
            return Fallback("wrappers", f"{len(wrappers)} diffusion-model wrapper(s) are registered")
        return None

    @classmethod
    def host_hook(cls, module: torch.nn.Module) -> WeightHook | None:
        """ComfyUI's cast-and-patch path for the weights its ops patch when they cast them
        (``weight_function`` / ``bias_function``: LoRA under low-VRAM loading): the weight is
        copied, as ComfyUI's cast does for a patched weight, and each function applied in order."""
        funcs: dict[str, list[Any]] = {}
        for name, sub in module.named_modules():
            for attr in ("weight", "bias"):
                fs = getattr(sub, f"{attr}_function", None)
                if fs and isinstance(getattr(sub, attr, None), torch.Tensor):
                    funcs[f"{name}.{attr}" if name else attr] = list(fs)
        if not funcs:
            return None

        def patched(name: str, t: torch.Tensor) -> torch.Tensor:
            w = t.clone()
            for f in funcs[name]:
                w = f(w)
            return w

        return WeightHook(patched, tuple(sorted(funcs)))

    @classmethod
    def host_tensors(cls, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The input scale ComfyUI quantizes an fp8 e4m3 layer's activations with, where the
        layer holds none: 1 (comfy.quant_ops quantizes per tensor with the layer's
        ``input_scale``, else scale 1), for the layers ComfyUI runs as fp8 matmuls."""
        # beside the weight: the GEMM reads it where the weight is, with no copy per call
        return {f"{name}.input_scale" if name else "input_scale": torch.ones((), dtype=torch.float32,
                                                                             device=sub.weight.device)
                for name, sub in fp8_layers(module)
                if quantized_input(sub) and getattr(sub, "input_scale", None) is None}

    def weights_fallback(self) -> Fallback | None:
        """The fallback for weights held in a form streamplan does not run (weight_format)."""
        return unsupported_weights(self.module)

    def common_fallback(self, a: Mapping[str, Any]) -> Fallback | None:
        """What makes any call of this module run the original (checked before the call's own)."""
        return self.options_fallback(a["transformer_options"] or {}) or self.weights_fallback()

    def prepare(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Call | Fallback:
        a = self.bind(args, kwargs)
        if isinstance(a, Fallback):
            return a
        return self.common_fallback(a) or self.prepare_bound(a)

    def prepare_bound(self, a: dict[str, Any]) -> Call | Fallback:
        """The call's bound arguments as per-element inputs, or why the planner cannot run it."""
        raise NotImplementedError


# ComfyUI's QuantizedTensor layouts (comfy.quant_ops) -> the streamplan format that runs them.
LAYOUT_FORMATS = {"TensorCoreFP8Layout": "fp8-e4m3", "TensorCoreFP8E4M3Layout": "fp8-e4m3",
                  "TensorCoreFP8E5M2Layout": "fp8-e5m2", "TensorWiseINT8Layout": "int8"}
# Plain float8 storage, which ComfyUI casts to the compute dtype per layer: computed the same way.
_PLAIN_FORMATS = {torch.float8_e4m3fn: "fp8-e4m3-cast", torch.float8_e5m2: "fp8-e5m2"}


def weight_format(t: torch.Tensor) -> tuple[str | None, str]:
    """(the streamplan format that runs a weight as ComfyUI holds it, how ComfyUI holds it);
    format None for a form streamplan does not run, "dense" for 16/32-bit floats."""
    layout = getattr(t, "_layout_cls", None) or getattr(t, "layout_type", None)
    params = getattr(t, "_params", None)
    if layout is not None or params is not None:
        name = layout if isinstance(layout, str) else getattr(layout, "__name__", type(t).__name__)
        fmt = LAYOUT_FORMATS.get(name)
        if fmt == "int8" and getattr(params, "convrot", False):
            group = int(getattr(params, "convrot_groupsize", 256))
            return ("convrot-int8" if group == 256 else None), f"{name} (ConvRot, groups of {group})"
        return fmt, name
    if t.dtype in _PLAIN_FORMATS:
        return _PLAIN_FORMATS[t.dtype], f"{t.dtype} (cast per use)"
    if t.is_floating_point() and t.element_size() > 1:
        return "dense", str(t.dtype)
    return None, str(t.dtype)


def fp8_layers(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """(name, layer) of the module's layers whose weight runs as fp8-e4m3."""
    for name, sub in module.named_modules():
        w = getattr(sub, "weight", None)
        if isinstance(w, torch.Tensor) and weight_format(w)[0] == "fp8-e4m3":
            yield name, sub


def quantized_input(layer: torch.nn.Module) -> bool:
    """Whether ComfyUI quantizes the layer's activations for its quantized weight (comfy.ops'
    mixed-precision Linear: not where the device has no kernel for the format or the checkpoint
    asks for full-precision matmuls)."""
    return getattr(layer, "layout_type", None) is not None and not getattr(layer, "_full_precision_mm", False)


def unsupported_weights(module: torch.nn.Module) -> Fallback | None:
    """The fallback (weight_format) for the first parameter ComfyUI holds in a form streamplan
    does not run (nvfp4, mxfp8, ConvRot W4A4, W4A8, ...), naming it and its layout, or computes
    otherwise than ComfyUI (an fp8 layer whose checkpoint asks for a full-precision matmul)."""
    for name, p in module.named_parameters():
        fmt, held = weight_format(p)
        if fmt is None:
            return Fallback("weight_format", f"'{name}' is held as {held}; streamplan runs fp8 (e4m3, e5m2), "
                                             "int8 tensorwise and ConvRot int8 (groups of 256)")
    for name, sub in fp8_layers(module):
        if (getattr(sub, "_full_precision_mm_config", False)
                and getattr(sub, "quant_format", None) not in getattr(sub, "_disabled_formats", ())):
            return Fallback("weight_format", f"'{name}.weight' asks ComfyUI for a full-precision matmul "
                                             "(comfy_quant full_precision_matrix_mult); streamplan runs "
                                             "fp8 e4m3 weights as fp8 matmuls")
    return None


def weight_formats(module: torch.nn.Module) -> dict[str, int]:
    """How many weights of the module each streamplan format runs (the ones it runs)."""
    out: dict[str, int] = {}
    for _, p in module.named_parameters():
        fmt, _held = weight_format(p)
        if fmt is not None and p.dim() >= 2:
            out[fmt] = out.get(fmt, 0) + 1
    return out


class WanModel(ComfyAdapter):
    """ComfyUI's WanModel (Wan 2.1 text to video)."""

    class_name = "WanModel"

    @classmethod
    def sidecar(cls, module: torch.nn.Module) -> dict[str, Any]:
        return {"family": "wan2.1", "head_dim": int(module.dim // module.num_heads), "eps": float(module.eps)}

    def prepare_bound(self, a: dict[str, Any]) -> Call | Fallback:
        if a["clip_fea"] is not None:
            return Fallback("image_conditioning", "clip_fea (CLIP image features) is given")
        if a["time_dim_concat"] is not None:
            return Fallback("condition_frames", "time_dim_concat (frames concatenated along time) is given")
        if getattr(self.module, "ref_conv", None) is not None and "reference_latent" in (a["kwargs"] or {}):
            return Fallback("reference_latent", "a reference_latent is given to a model with a reference embedding")
        x, t = a["x"], a["timestep"]
        if (f := check_tensor("x", x, self)) is not None:
            return f
        if x.dim() != 5:
            return Fallback("arguments", f"x has shape {shape_text(x)}; expected [B, C, F, H, W]")
        patch = tuple(self.module.patch_size)
        if any(s % p for s, p in zip(x.shape[2:], patch)):
            return Fallback("arguments", f"x {shape_text(x)} is not divisible by the patch {list(patch)} "
                                         "(the original pads it)")
        if isinstance(t, torch.Tensor) and t.dim() == 2:
            return Fallback("per_token_timestep", f"timestep has shape {shape_text(t)}: one timestep per token")
        batch = x.shape[0]
        text = check_tensor("context", a["context"], self) or per_element("context", a["context"], batch, 2)
        step = per_element_scalar("timestep", t, batch)
        for f in (text, step):
            if isinstance(f, Fallback):
                return f
        inputs = [{"latents": x[b], "timestep": step(b).float(), "text": text(b)} for b in range(batch)]
        return Call(inputs, False)

    def output(self, call: Call, outputs: list[torch.Tensor]) -> Any:
        return torch.stack(outputs).to(self.dtype)


class Flux(ComfyAdapter):
    """ComfyUI's Flux (Flux.1 dev and schnell)."""

    class_name = "Flux"

    @classmethod
    def sidecar(cls, module: torch.nn.Module) -> dict[str, Any]:
        p = module.params
        return flux1_sidecar(p.hidden_size // p.num_heads, p.axes_dim, p.theta)

    def prepare_bound(self, a: dict[str, Any]) -> Call | Fallback:
        if a["ref_latents"]:
            return Fallback("reference_latents", f"{len(a['ref_latents'])} reference latent(s) are given")
        if a["control"] is not None:
            return Fallback("controlnet", "ControlNet residuals (control) are given")
        if (a["kwargs"] or {}).get("attention_mask") is not None:
            return Fallback("attention_mask", "an attention_mask is given")
        p = self.module.params
        if list(getattr(p, "txt_ids_dims", None) or []):
            return Fallback("config", f"params.txt_ids_dims is {list(p.txt_ids_dims)}: text positions on rope axes "
                                      "(the planned forward has Flux.1's zero text positions)")
        x = a["x"]
        if (f := check_tensor("x", x, self)) is not None:
            return f
        if x.dim() != 4 or x.shape[1] != p.in_channels:
            return Fallback("arguments", f"x has shape {shape_text(x)}; expected [B, {p.in_channels}, H, W]")
        ps = int(p.patch_size)
        B, C, H, W = x.shape
        if H % ps or W % ps:
            return Fallback("arguments", f"x {shape_text(x)} has sides that are not multiples of {ps} (the original pads them)")
        if p.guidance_embed and a["guidance"] is None:
            return Fallback("arguments", "the model embeds a guidance, and none is given")
        text = check_tensor("context", a["context"], self) or per_element("context", a["context"], B, 2)
        step = per_element_scalar("timestep", a["timestep"], B)
        guide = per_element_scalar("guidance", a["guidance"], B) if p.guidance_embed else None
        pooled = None
        if a["y"] is not None:
            pooled = check_tensor("y", a["y"], self) or per_element("y", a["y"], B, 1)
        for f in (text, step, guide, pooled):
            if isinstance(f, Fallback):
                return f
        rows, cols = H // ps, W // ps
        packed = x.reshape(B, C, rows, ps, cols, ps).permute(0, 2, 4, 1, 3, 5).reshape(B, rows * cols, C * ps * ps)
        img_ids = torch.zeros(rows, cols, 3, device=x.device)
        img_ids[..., 1] = torch.arange(rows, device=x.device, dtype=torch.float32)[:, None]
        img_ids[..., 2] = torch.arange(cols, device=x.device, dtype=torch.float32)[None, :]
        img_ids = img_ids.reshape(rows * cols, 3)
        inputs = []
        for b in range(B):
            ctx = text(b)
            vec = pooled(b)[: p.vec_in_dim] if pooled is not None else torch.zeros(p.vec_in_dim, dtype=x.dtype,
                                                                                  device=x.device)
            raw = {"latents": packed[b], "img_ids": img_ids, "text": ctx,
                   "txt_ids": torch.zeros(ctx.shape[0], 3, device=x.device), "pooled": vec,
                   "timestep": step(b).float()}
            if guide is not None:
                raw["guidance"] = guide(b).float()
            inputs.append(raw)
        return Call(inputs, False, extra={"shape": (C, rows, cols, ps)})

    def output(self, call: Call, outputs: list[torch.Tensor]) -> Any:
        C, rows, cols, ps = call.extra["shape"]
        c_out = outputs[0].shape[-1] // (ps * ps)
        out = torch.stack(outputs).reshape(len(outputs), rows, cols, c_out, ps, ps)
        return out.permute(0, 3, 1, 4, 2, 5).reshape(len(outputs), c_out, rows * ps, cols * ps).to(self.dtype)


ADAPTERS: tuple[type[Adapter], ...] = (WanModel, Flux)
