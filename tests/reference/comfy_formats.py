"""ComfyUI models from quantized checkpoints, as its users load them: a 16/32-bit checkpoint in a
family's original layout is written by `streamplan convert` in a weight format and layout, and
loaded by ComfyUI's own loader (comfy.sd.load_diffusion_model_state_dict). Shared by
tests/python/test_comfy_formats.py (tiny models on the CPU) and scripts/comfy_check.py
(--formats, real widths on a GPU).

    path = convert(cli, src, "int8")                      # src: an fp32 .safetensors
    mp = load(comfy, path, FORMATS["int8"].load_dtype())  # ComfyUI's ModelPatcher
    ref = load(comfy, path, torch.float32, dequantized_state_dict(mp))  # the fp32 reference
    mp.add_patches(comfy.lora.load_lora(lora_state_dict(mp.model, 16, gen), keys), 1.0)
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# torch is imported where it is used: scripts/comfy_check.py reads FORMATS before it checks for torch.


@dataclass(frozen=True)
class Format:
    convert: tuple[str, ...]  # `streamplan convert` options
    weight_dtype: str | None  # the torch dtype ComfyUI's UNETLoader weight_dtype sets for such a file

    def load_dtype(self) -> Any:
        import torch

        return getattr(torch, self.weight_dtype) if self.weight_dtype else None


# The formats ComfyUI loads, by name: comfy_quant (QuantizedTensor layouts), scaled_fp8 and
# plain float8 weights (which ComfyUI casts per layer).
FORMATS = {
    "fp8": Format(("--to", "fp8"), None),
    "int8": Format(("--to", "int8"), None),
    "convrot-int8": Format(("--to", "convrot-int8"), None),
    "scaled-fp8": Format(("--to", "fp8", "--layout", "scaled_fp8", "--input-scale"), None),
    "plain-e4m3": Format(("--to", "fp8", "--layout", "plain"), "float8_e4m3fn"),
    "plain-e5m2": Format(("--to", "fp8-e5m2", "--layout", "plain"), "float8_e5m2"),
}


def convert(cli: Path, src: Path, fmt: str) -> Path:
    """`src` written in format `fmt` beside it by `streamplan convert` (once: an existing output is kept)."""
    out = src.with_name(f"{src.stem}.{fmt}.safetensors")
    if not out.exists():
        r = subprocess.run([str(cli), "convert", *FORMATS[fmt].convert, str(src), str(out)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise RuntimeError(f"streamplan convert {' '.join(FORMATS[fmt].convert)} {src}: {r.stderr.strip()}")
    return out


def load(comfy: Any, path: Path, dtype: Any, state_dict: dict | None = None) -> Any:
    """ComfyUI's ModelPatcher of the file (or of `state_dict` in its place), as its loader makes it."""
    sd, meta = comfy.utils.load_torch_file(str(path), return_metadata=True) if state_dict is None else (state_dict, {})
    return comfy.sd.load_diffusion_model_state_dict(sd, model_options={"dtype": dtype} if dtype else {}, metadata=meta)


def dequantized_state_dict(mp: Any) -> dict[str, Any]:
    """The loaded model's weights in fp32 as ComfyUI dequantizes them (what the reference holds)."""
    import torch

    out = {}
    for name, p in mp.model.diffusion_model.named_parameters():
        t = p.dequantize() if hasattr(p, "dequantize") and hasattr(p, "_params") else p
        out[name] = t.detach().to(torch.float32).contiguous()
    for name, b in mp.model.diffusion_model.named_buffers():
        out[name] = b.detach().to(torch.float32).contiguous() if b.is_floating_point() else b
    return out


BLOCKS = ("blocks.", "double_blocks.", "single_blocks.")


def lora_state_dict(model: Any, rank: int, gen: Any, dtype: Any = None, scale: float = 0.05) -> dict:
    """A random LoRA in diffusers/PEFT naming (lora_A / lora_B) over every 2-D block weight of a
    ComfyUI model (its diffusion_model); ComfyUI's comfy.lora.load_lora maps the names. `scale`:
    about the update's size relative to a weight of unit-variance rows; `dtype` default fp32."""
    import torch

    dtype = dtype or torch.float32
    sd = {}
    for name, p in model.diffusion_model.named_parameters():
        if p.dim() != 2 or not name.startswith(BLOCKS):
            continue
        key = "diffusion_model." + name[: -len(".weight")]
        a = torch.randn(rank, p.shape[1], generator=gen, device=gen.device) / p.shape[1] ** 0.5
        b = scale * torch.randn(p.shape[0], rank, generator=gen, device=gen.device) / rank ** 0.5
        sd[key + ".lora_A.weight"] = a.to(dtype)
        sd[key + ".lora_B.weight"] = b.to(dtype)
    return sd
