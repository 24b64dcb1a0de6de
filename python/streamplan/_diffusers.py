"""Adapters of diffusers' transformer modules (WanTransformer3DModel, FluxTransformer2DModel)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from ._adapter import (Adapter, Call, Fallback, check_tensor, flux1_sidecar, per_element, per_element_scalar,
                       shape_text)


def _attention_kwargs(name: str, kw: Mapping[str, Any] | None) -> Fallback | None:
    """The fallback for what an attention-kwargs dict carries, if anything."""
    if not kw:
        return None
    if "scale" in kw:
        return Fallback("lora_scale", f"{name} carries a LoRA scale ({name}['scale'] = {kw['scale']!r})")
    if "attention_mask" in kw:
        return Fallback("attention_mask", f"{name} carries an attention mask ({name}['attention_mask'])")
    if "ip_adapter_image_embeds" in kw:
        return Fallback("ip_adapter", f"{name} carries IP-Adapter image embeddings")
    return Fallback("attention_kwargs", f"{name} carries key(s) the planner does not model: {sorted(kw)}")


class _Diffusers(Adapter):
    """diffusers' transformers answer Transformer2DModelOutput, or a tuple without return_dict."""

    def output(self, call: Call, outputs: list[torch.Tensor]) -> Any:
        from diffusers.models.modeling_outputs import Transformer2DModelOutput

        out = torch.stack(outputs).to(self.dtype)
        return Transformer2DModelOutput(sample=out) if call.return_dict else (out,)


class WanTransformer3D(_Diffusers):
    """diffusers' WanTransformer3DModel (Wan 2.1 text-to-video)."""

    class_name = "WanTransformer3DModel"

    @classmethod
    def sidecar(cls, module: torch.nn.Module) -> dict[str, Any]:
        c = module.config
        return {"family": "wan2.1", "head_dim": int(c.attention_head_dim), "eps": float(c.eps)}

    def prepare(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Call | Fallback:
        a = self.bind(args, kwargs)
        if isinstance(a, Fallback):
            return a
        if a["encoder_hidden_states_image"] is not None:
            return Fallback("image_conditioning", "encoder_hidden_states_image (image conditioning) is given")
        if (f := _attention_kwargs("attention_kwargs", a["attention_kwargs"])) is not None:
            return f
        x, t = a["hidden_states"], a["timestep"]
        if (f := check_tensor("hidden_states", x, self)) is not None:
            return f
        if x.dim() != 5:
            return Fallback("arguments", f"hidden_states has shape {shape_text(x)}; expected [B, C, F, H, W]")
        patch = tuple(self.module.config.patch_size)
        if any(s % p for s, p in zip(x.shape[2:], patch)):
            return Fallback("arguments", f"hidden_states {shape_text(x)} is not divisible by the patch {list(patch)}")
        if isinstance(t, torch.Tensor) and t.dim() == 2:
            return Fallback("per_token_timestep", f"timestep has shape {shape_text(t)}: one timestep per token")
        batch = x.shape[0]
        text = check_tensor("encoder_hidden_states", a["encoder_hidden_states"], self) or per_element(
            "encoder_hidden_states", a["encoder_hidden_states"], batch, 2)
        step = per_element_scalar("timestep", t, batch)
        for f in (text, step):
            if isinstance(f, Fallback):
                return f
        inputs = [{"latents": x[b], "timestep": step(b), "text": text(b)} for b in range(batch)]
        return Call(inputs, bool(a["return_dict"]))


class FluxTransformer2D(_Diffusers):
    """diffusers' FluxTransformer2DModel (Flux.1 dev and schnell)."""

    class_name = "FluxTransformer2DModel"

    @classmethod
    def sidecar(cls, module: torch.nn.Module) -> dict[str, Any]:
        return flux1_sidecar(module.config.attention_head_dim, module.config.axes_dims_rope)

    def _time(self, t: torch.Tensor) -> torch.Tensor:
        # The module scales timestep and guidance by 1000 in its own dtype before embedding
        # them; the family's prologue scales in fp32. Rounding them as the module does first
        # makes both embed the same value.
        if self.dtype == torch.float32:
            return t
        return (t.to(self.dtype) * 1000).float() / 1000

    def prepare(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Call | Fallback:
        a = self.bind(args, kwargs)
        if isinstance(a, Fallback):
            return a
        if a["controlnet_block_samples"] is not None or a["controlnet_single_block_samples"] is not None:
            return Fallback("controlnet", "ControlNet residuals (controlnet_block_samples) are given")
        if (f := _attention_kwargs("joint_attention_kwargs", a["joint_attention_kwargs"])) is not None:
            return f
        x = a["hidden_states"]
        if (f := check_tensor("hidden_states", x, self)) is not None:
            return f
        if x.dim() != 3:
            return Fallback("arguments", f"hidden_states has shape {shape_text(x)}; expected [B, tokens, channels]")
        batch, tokens = x.shape[0], x.shape[1]
        ids = {}
        for name, rows in (("img_ids", tokens), ("txt_ids", None)):
            v = a[name]
            if isinstance(v, torch.Tensor) and v.dim() == 3:
                v = v[0]  # the module takes the first batch element's ids, as here
            if not isinstance(v, torch.Tensor) or v.dim() != 2 or v.shape[1] != 3:
                return Fallback("arguments", f"{name} has shape {shape_text(v)}; expected [tokens, 3]")
            ids[name] = v
        if ids["img_ids"].shape[0] != tokens:
            return Fallback("arguments", f"img_ids has {ids['img_ids'].shape[0]} rows, hidden_states {tokens} tokens")
        guided = bool(self.module.config.guidance_embeds)
        if guided != (a["guidance"] is not None):
            need = "needs a guidance" if guided else "has no guidance embedding, yet a guidance is given"
            return Fallback("arguments", f"the module {need}")
        text = check_tensor("encoder_hidden_states", a["encoder_hidden_states"], self) or per_element(
            "encoder_hidden_states", a["encoder_hidden_states"], batch, 2)
        pooled = check_tensor("pooled_projections", a["pooled_projections"], self) or per_element(
            "pooled_projections", a["pooled_projections"], batch, 1)
        step = per_element_scalar("timestep", a["timestep"], batch)
        guide = per_element_scalar("guidance", a["guidance"], batch) if guided else None
        for f in (text, pooled, step, guide):
            if isinstance(f, Fallback):
                return f
        if ids["txt_ids"].shape[0] != text(0).shape[0]:
            return Fallback(
                "arguments",
                f"txt_ids has {ids['txt_ids'].shape[0]} rows, encoder_hidden_states {text(0).shape[0]} tokens",
            )
        inputs = []
        for b in range(batch):
            raw = {
                "latents": x[b],
                "img_ids": ids["img_ids"],
                "text": text(b),
                "txt_ids": ids["txt_ids"],
                "pooled": pooled(b),
                "timestep": self._time(step(b)),
            }
            if guide is not None:
                raw["guidance"] = self._time(guide(b))
            inputs.append(raw)
        return Call(inputs, bool(a["return_dict"]))


ADAPTERS: tuple[type[Adapter], ...] = (WanTransformer3D, FluxTransformer2D)

