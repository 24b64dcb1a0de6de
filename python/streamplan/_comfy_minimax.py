"""Adapter of ComfyUI's MiniMaxH3Model (comfy.ldm.minimax.model; MiniMax H3 text to video + audio).

One call of ``MiniMaxH3Model.forward(x, timestep, context, transformer_options, minimax_payload,
**kwargs)`` (older trees: also ``denoise_mask, audio_denoise_mask``) is one planned forward of the
family "minimax-h3":

* ``x = [video [1, C, T, H, W], audio [1, C_a, 2, T_a]]`` -> raw ``video`` and ``audio``
  (batch dimension dropped; ComfyUI's model takes a batch of 1 only);
* ``timestep`` (the sampler's ``sigma * 1000``; its first element) -> raw ``sigma`` ``[1]``;
* ``context [1, L, text_dim or dim]`` -> raw ``text`` (encoder states, or text refined already);
* ``minimax_payload["text_token_tags"]`` -> raw ``text_tags`` (modality tag per text token).

The answer is what the original returns: the list ``[video, audio]`` in the latents' shapes and
dtypes. When the payload carries ``audio_scale`` (the sampler holds the audio latent on the video
schedule, ModelSamplingAV), the carry around the network is done here as the original does it:
the network sees the audio stream's own latent and the audio output becomes the derivative of
the carried variable; called from ComfyUI's diffusion-model wrapper of a tree whose forward does
the carry outside its wrappers, the planner answers the network's own output instead.

Runs the original forward, with the fallback's code, for what the planned forward does not model:
keyframe or reference condition rows (``condition_rows``), denoise masks that mask anything
(``denoise_mask``), a PDD head bank (``pdd_heads``), block replacements and patches
(``block_patch``, ``patches``), an attention override (``attention_override``), diffusion-model
wrappers (``wrappers``), other sigma shifts than the family's 12 / 3 (``sigma_shift``), weights
held in a layout streamplan does not run (``weight_format``), RMSNorm epsilons the family does
not share (``config``), and calls whose tensors do not fit (``arguments``). Weights patched at
cast time are acquired through ComfyUI's patch functions (_comfy.py). Other keys of
``transformer_options`` (ComfyUI's bookkeeping: sigmas, cond_or_uncond, uuids, ...) do not change
what the model computes and are ignored, as are extra keyword arguments, which the original's
network ignores too.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ._adapter import Call, Fallback
from ._comfy import ComfyAdapter

SHIFT_VIDEO = 12.0  # the family's sigma shifts (src/models/minimax_h3.cpp)
SHIFT_AUDIO = 3.0
_MASK_FULL = 1.0 - 1e-3  # a denoise mask value at or above this generates the row fully
_SEGMENT_KINDS = {"text", "audio", "video"}


def _shape(t: Any) -> str:
    return str(list(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _time_shift_sigma(sigma: torch.Tensor, from_shift: float, to_shift: float) -> torch.Tensor:
    """sigma of the `from_shift` schedule at the same base-grid point of the `to_shift` schedule."""
    base = sigma / (from_shift + sigma * (1.0 - from_shift))
    return to_shift * base / (1.0 + (to_shift - 1.0) * base)


def _masks_nothing(mask: Any) -> bool:
    """Whether a denoise mask leaves every row fully generated (the model ignores it then)."""
    return mask is None or (isinstance(mask, torch.Tensor) and bool((mask.float() >= _MASK_FULL).all()))


class MiniMaxH3(ComfyAdapter):
    """ComfyUI's MiniMaxH3Model (MiniMax H3, joint video + stereo audio DiT)."""

    class_name = "MiniMaxH3Model"
    named_outputs = True

    @classmethod
    def sidecar(cls, module: torch.nn.Module) -> dict[str, Any]:
        out: dict[str, Any] = {"family": "minimax-h3"}
        if len(module.blocks):
            block = module.blocks[0]
            out.update(head_dim=int(block.attn.head_dim), eps=float(block.norm1.eps))
        return out

    # --- what the module is -----------------------------------------------------------------

    def _model_fallback(self) -> Fallback | None:
        m = self.module
        shifts = (float(getattr(m, "sigma_shift_video", SHIFT_VIDEO)),
                  float(getattr(m, "sigma_shift_audio", SHIFT_AUDIO)))
        if shifts != (SHIFT_VIDEO, SHIFT_AUDIO):
            return Fallback("sigma_shift", f"the module's sigma shifts are video {shifts[0]}, audio {shifts[1]}; "
                                           f"the planned forward has {SHIFT_VIDEO} / {SHIFT_AUDIO}")
        head = m.final_layer.video_out
        n = head.weight.shape[0] // head.out_features
        if n != 1:
            return Fallback("pdd_heads", f"final_layer holds a PDD head bank of {n} heads per output; the planned "
                                         "forward has no head bank (it needs the sampler's sigma schedule)")
        eps = {}
        for name, sub in m.named_modules():
            if isinstance(getattr(sub, "eps", None), float) and hasattr(sub, "normalized_shape"):
                eps.setdefault(sub.eps, name)
        if len(eps) > 1:
            (e0, n0), (e1, n1) = sorted(eps.items())[:2]
            return Fallback("config", f"RMSNorm epsilons differ ('{n0}' {e0}, '{n1}' {e1}); the family has one eps")
        return self.weights_fallback()

    def _options_fallback(self, opts: Any) -> Fallback | None:
        if (f := self.options_fallback(opts)) is not None:
            return f
        for key, want in (("minimax_h3_sigma_shift_video", SHIFT_VIDEO),
                          ("minimax_h3_sigma_shift_audio", SHIFT_AUDIO)):
            if key in opts and float(opts[key]) != want:
                return Fallback("sigma_shift",
                                f"transformer_options['{key}'] is {opts[key]}; the planned forward has {want}")
        return None

    @staticmethod
    def _payload_fallback(payload: Mapping[str, Any], signature: tuple[int, ...]) -> Fallback | None:
        layout = payload.get("layout")
        if layout is not None and getattr(layout, "signature", None) == signature:
            kinds = sorted({s[2] for s in layout.segments} - _SEGMENT_KINDS)
            if kinds:
                return Fallback("condition_rows", f"the payload's packed layout has condition segments {kinds}")
        else:
            for key in ("keyframes", "refs"):
                if payload.get(key):
                    return Fallback("condition_rows", f"minimax_payload['{key}'] is given ({len(payload[key])})")
        for key in ("cond_video_latents", "cond_audio_latents"):
            if payload.get(key):
                return Fallback("condition_rows", f"minimax_payload['{key}'] is given ({len(payload[key])})")
        return None

    def _host_undoes_carry(self) -> bool:
        """Whether the tree's forward undoes the sampler's audio carry outside the diffusion-model
        wrappers (trees from 2026-08 on), so that a wrapper calling the planner sees the stream's
        own latent and answers the network's own velocity."""
        forward = getattr(type(self.module).forward, "__code__", None)
        return self.host_wrapped and forward is not None and "audio_scale" in forward.co_consts

    # --- a call -----------------------------------------------------------------------------

    def common_fallback(self, a: Mapping[str, Any]) -> Fallback | None:
        return self._model_fallback() or self._options_fallback(a["transformer_options"] or {})

    def prepare_bound(self, a: dict[str, Any]) -> Call | Fallback:
        payload = a["minimax_payload"] or {}
        if not isinstance(payload, Mapping):
            return Fallback("arguments", f"minimax_payload is {type(payload).__name__}, not a dict")
        x, timestep, context = a["x"], a["timestep"], a["context"]
        if not isinstance(x, (list, tuple)) or len(x) != 2:
            return Fallback("arguments", f"x is {type(x).__name__}; expected [video latent, audio latent]")
        video, audio = x
        for name, t, dims in (("x[0] (video)", video, 5), ("x[1] (audio)", audio, 4), ("context", context, 3)):
            if not isinstance(t, torch.Tensor) or t.dim() != dims or not t.is_floating_point():
                return Fallback("arguments",
                                f"{name} has shape {_shape(t)}; expected {dims} dimensions, floating point")
            if t.device != self.device:
                return Fallback("arguments", f"{name} is on {t.device}, the module on {self.device}")
        if video.shape[0] != 1 or audio.shape[0] != 1:
            return Fallback("arguments", f"x has batch {video.shape[0]} / {audio.shape[0]}; MiniMax H3 takes batch 1")
        if context.dtype != self.dtype:
            return Fallback("arguments",
                            f"context is {context.dtype} (the compute dtype), the module's parameters {self.dtype}")
        m = self.module
        if video.shape[1] != m.latents_dim or audio.shape[1] != m.audio_latents_dim or audio.shape[2] != 2:
            return Fallback("arguments", f"x has shapes {_shape(video)}, {_shape(audio)}; expected "
                                         f"[1, {m.latents_dim}, T, H, W] and [1, {m.audio_latents_dim}, 2, T_a]")
        if context.shape[2] not in (m.condition_proj.in_features, m.hidden_size):
            return Fallback("arguments", f"context has shape {_shape(context)}; expected "
                                         f"{m.condition_proj.in_features} (encoder states) or {m.hidden_size} "
                                         "(refined) features")
        if video.shape[3] % 2 or video.shape[4] % 2:
            return Fallback("arguments", f"x[0] (video) {_shape(video)} has odd sides; the planned forward takes "
                                         "2x2 patches without padding")
        if not isinstance(timestep, torch.Tensor) or timestep.numel() < 1:
            return Fallback("arguments", f"timestep is {_shape(timestep)}; expected a tensor (sigma * 1000)")
        L, T, H, W, Ta = context.shape[1], video.shape[2], video.shape[3], video.shape[4], audio.shape[3]
        if (f := self._payload_fallback(payload, (L, T, H, W, Ta))) is not None:
            return f
        for name in ("denoise_mask", "audio_denoise_mask"):
            # Trees whose forward takes no masks (2026-08 on) leave them to the sampler: the
            # network then ignores one passed among **kwargs, as the planned forward does.
            if not _masks_nothing(a.get(name)):
                return Fallback("denoise_mask", f"{name} masks rows (values below {_MASK_FULL}); the planned forward "
                                                "runs every row at the stream's sigma")
        raw: dict[str, torch.Tensor] = {}
        tags = payload.get("_text_token_tags_list")
        if tags is None and payload.get("text_token_tags") is not None:
            tags = payload["text_token_tags"].reshape(-1).tolist()
        if tags is not None:
            if len(tags) < L:
                return Fallback("arguments", f"text_token_tags has {len(tags)} entries for {L} text tokens")
            if any(int(t) not in (0, 1, 2) for t in tags[:L]):
                return Fallback("arguments", "text_token_tags holds a tag other than 0 (video), 1 (text), 2 (audio)")
            raw["text_tags"] = torch.tensor([int(t) for t in tags[:L]], dtype=torch.long)

        sigma_t = (timestep.flatten()[0] / 1000.0).float().clamp(min=1e-6)
        scale = float(payload.get("audio_scale", 1.0))
        carry = None
        if scale != 1.0 and not self._host_undoes_carry():
            # The sampler carries the audio as (sigma_v / sigma_a) * x_a: the network gets x_a.
            sigma_a = _time_shift_sigma(sigma_t, SHIFT_VIDEO, SHIFT_AUDIO)
            carry = (scale, sigma_a, (sigma_a / sigma_t).to(audio.dtype))
            audio = audio * carry[2]
        raw.update(video=video[0], audio=audio[0], text=context[0], sigma=sigma_t.reshape(1))
        return Call([raw], False, extra={"latents": (a["x"][0], a["x"][1]), "carry": carry})

    def output(self, call: Call, outputs: list[dict[str, torch.Tensor]]) -> Any:
        video, audio = call.extra["latents"]
        out = outputs[0]
        result = [out["video"].unsqueeze(0).to(video.dtype), out["audio"].unsqueeze(0).to(audio.dtype)]
        carry = call.extra["carry"]
        if carry is not None:
            # The audio answer as the derivative of the carried variable (d / d sigma_v).
            scale, sigma_a, c = carry
            result[1] = (1.0 - scale) * (audio * c) + (1.0 + (scale - 1.0) * sigma_a).to(result[1].dtype) * result[1]
        return result


ADAPTERS = (MiniMaxH3,)

