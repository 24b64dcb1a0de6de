#!/usr/bin/env python3
"""ComfyUI's own sampling with and without the "Streamplan Memory Planner" node.

Given a ComfyUI source tree (COMFYUI_PATH; its Python dependencies importable, or in the
folder COMFY_SITE), builds random-weight ComfyUI models and samples them with ComfyUI's
sampling function (comfy.sample.sample: euler, simple schedule, CFG), in one process:

  wan    Wan 2.1 14B widths with 2 layers (comfy.model_base.WAN21), latents for 81 frames at
         1280 x 720 (--tiny: a few tokens at test widths)
  flux   Flux.1-dev widths with 2 double and 4 single blocks (comfy.model_base.Flux), 1024 x 1024

Each model is sampled four ways: without and with the node, each without and with a rank-16
LoRA that ComfyUI loads itself (comfy.lora.load_lora onto the ModelPatcher, as its LoRA loader
does). In bf16 (on a GPU) ComfyUI also samples the same weights in fp32, the reference. The
latents with the node are compared with those without, and both with the fp32 reference (rel
L2); the peak of the caching allocator above what was allocated before sampling is printed for
each run.

    COMFYUI_PATH=/path/to/ComfyUI python3 scripts/comfy_check.py [--models wan,flux] [--steps 2]
    python3 scripts/comfy_check.py --tiny --device cpu      # a quick run on the CPU

Writes --out (JSON) and prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))

import torch  # noqa: E402


def comfy_import(device: str):
    tree = os.environ.get("COMFYUI_PATH", os.path.join(HERE, "..", ".deps", "comfyui-full"))
    site = os.environ.get("COMFY_SITE", os.path.join(HERE, "..", ".deps", "comfy-site"))
    for p in (site, tree):
        if os.path.isdir(p) and p not in sys.path:
            sys.path.insert(0, p)
    import comfy.cli_args

    if device == "cpu":
        comfy.cli_args.args.cpu = True
    import comfy.latent_formats
    import comfy.lora
    import comfy.model_base
    import comfy.model_patcher
    import comfy.sample
    import comfy.supported_models_base

    return comfy


def model_config(comfy, family: str, tiny: bool, dtype: torch.dtype):
    base = comfy.supported_models_base.BASE
    if family == "wan":
        unet = (dict(dim=64, ffn_dim=96, num_heads=2, freq_dim=32, text_dim=32) if tiny else
                dict(dim=5120, ffn_dim=13824, num_heads=40, freq_dim=256, text_dim=4096))
        unet.update(model_type="t2v", patch_size=(1, 2, 2), in_dim=16, out_dim=16, num_layers=2, eps=1e-6,
                    qk_norm=True, cross_attn_norm=True, text_len=512, dtype=dtype)

        class Cfg(base):
            unet_config = unet
            unet_extra_config = {}
            sampling_settings = {"shift": 8.0}
            latent_format = comfy.latent_formats.Wan21
        return Cfg(unet), comfy.model_base.WAN21
    unet = (dict(hidden_size=32, num_heads=2, axes_dim=[4, 6, 6], context_in_dim=32, vec_in_dim=24) if tiny else
            dict(hidden_size=3072, num_heads=24, axes_dim=[16, 56, 56], context_in_dim=4096, vec_in_dim=768))
    unet.update(in_channels=16, out_channels=16, patch_size=2, mlp_ratio=4.0, depth=2, depth_single_blocks=4,
                theta=10000, qkv_bias=True, guidance_embed=True, image_model="flux", dtype=dtype)

    class Cfg(base):
        unet_config = unet
        unet_extra_config = {}
        sampling_settings = {"shift": 1.15, "multiplier": 1.0}
        latent_format = comfy.latent_formats.Flux
    return Cfg(unet), comfy.model_base.Flux


def lora_state_dict(model: torch.nn.Module, rank: int, gen: torch.Generator, dtype: torch.dtype) -> dict:
    """A LoRA in diffusers/PEFT naming (lora_A / lora_B) over every 2-D block weight."""
    sd = {}
    for name, p in model.diffusion_model.named_parameters():
        if p.dim() != 2 or not name.startswith(("blocks.", "double_blocks.", "single_blocks.")):
            continue
        key = "diffusion_model." + name[: -len(".weight")]
        a = torch.randn(rank, p.shape[1], generator=gen, device=gen.device) / p.shape[1] ** 0.5
        b = 0.05 * torch.randn(p.shape[0], rank, generator=gen, device=gen.device) / rank ** 0.5
        sd[key + ".lora_A.weight"] = a.to(dtype)
        sd[key + ".lora_B.weight"] = b.to(dtype)
    return sd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="wan,flux")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out")
    a = ap.parse_args()
    comfy = comfy_import(a.device)
    import make_reference

    import streamplan
    from streamplan import comfy_nodes

    device = torch.device(a.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cuda = device.type == "cuda"
    rows = []
    for family in [m for m in a.models.split(",") if m]:
        t0 = time.time()
        cfg, cls = model_config(comfy, family, a.tiny, dtype)  # built in dtype, ComfyUI's fp32 layers kept
        model = cls(cfg, device=device)
        gen = torch.Generator(device).manual_seed(0)
        make_reference.randomize(model.diffusion_model, gen)
        patcher = comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device)
        patcher32 = None
        if dtype != torch.float32:  # the reference: ComfyUI in fp32 on the same (rounded) weights
            cfg32, _ = model_config(comfy, family, a.tiny, torch.float32)
            model32 = cls(cfg32, device=device)
            model32.diffusion_model.load_state_dict(model.diffusion_model.state_dict())
            patcher32 = comfy.model_patcher.ModelPatcher(model32, load_device=device, offload_device=device)
        if family == "wan":
            shape = (1, 16, 3, 8, 12) if a.tiny else (1, 16, 21, 90, 160)
            ctx_dim, ctx_len = cfg.unet_config["text_dim"], 512
        else:
            shape = (1, 16, 16, 12) if a.tiny else (1, 16, 128, 128)
            ctx_dim, ctx_len = cfg.unet_config["context_in_dim"], 512
        noise = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        g = torch.Generator().manual_seed(2)
        extra = {}
        if family == "flux":
            extra = {"pooled_output": torch.randn(1, cfg.unet_config["vec_in_dim"], generator=g), "guidance": 3.5}
        positive = [[torch.randn(1, ctx_len, ctx_dim, generator=g), dict(extra)]]
        negative = [[torch.randn(1, ctx_len, ctx_dim, generator=g), dict(extra)]]
        lora = comfy.lora.load_lora(lora_state_dict(model, 16, torch.Generator(device).manual_seed(3), dtype),
                                    comfy.lora.model_lora_keys_unet(model, {}))
        print(f"[comfy_check] {family}: built in {time.time() - t0:.0f} s, {len(lora)} LoRA weights", file=sys.stderr)

        def sample(p) -> tuple[torch.Tensor, float, int]:
            if cuda:
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            start = time.time()
            out = comfy.sample.sample(p, noise, a.steps, 5.0, "euler", "simple", positive, negative,
                                      torch.zeros_like(noise), disable_pbar=True, seed=4)
            if cuda:
                torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base if cuda else 0
            return out.float(), time.time() - start, peak

        plain = None
        for with_lora in (False, True):
            p = patcher.clone()
            if with_lora:
                p.add_patches(lora, 1.0)
            fp32 = None
            if patcher32 is not None:
                p32 = patcher32.clone()
                if with_lora:
                    p32.add_patches(lora, 1.0)
                fp32 = sample(p32)[0]
                p32.unpatch_model()
            sample(p)  # weights loaded (and patched) once before measuring
            ref, ref_s, ref_peak = sample(p)
            (planned_model,) = comfy_nodes.StreamplanMemoryPlanner().patch(p, "none", "comfy", False)
            wrapper = planned_model.wrappers["diffusion_model"]["streamplan"][0]
            reports: list[str] = []
            wrapper.report = reports.append
            sample(planned_model)  # the plans of this geometry
            got, got_s, got_peak = sample(planned_model)
            h = next(iter(wrapper.handles.values()))
            err = float((got.double() - ref.double()).norm() / ref.double().norm())
            vs32 = (lambda x: None) if fp32 is None else (
                lambda x: float((x.double() - fp32.double()).norm() / fp32.double().norm()))
            lora_effect = None if plain is None else float((ref.double() - plain.double()).norm() / plain.double().norm())
            plain = ref if plain is None else plain
            rows.append({"model": family, "lora": with_lora, "steps": a.steps, "dtype": str(dtype),
                         "device": torch.cuda.get_device_name() if cuda else "cpu", "rel_l2": err,
                         "lora_changes_latents_by": lora_effect, "comfy_rel_l2_vs_fp32": vs32(ref),
                         "streamplan_rel_l2_vs_fp32": vs32(got),
                         "comfy_s": ref_s, "streamplan_s": got_s, "comfy_peak_bytes": ref_peak,
                         "streamplan_peak_bytes": got_peak, "planned_calls": h.planned_calls, "calls": h.calls,
                         "fallbacks": sorted({f.code for f in h.fallbacks}), "report": reports[-1] if reports else ""})
            if a.out:
                with open(a.out, "w") as f:
                    json.dump(rows, f, indent=1)
            for hd in wrapper.handles.values():
                if streamplan.handle_of(hd.module) is hd:
                    streamplan.remove(hd.module)
    G = float(1 << 30)
    print(f"{'model':6} {'LoRA':5} {'LoRA effect':>11} {'sp vs comfy':>11} {'comfy err':>9} {'sp err':>9} "
          f"{'comfy s':>8} {'sp s':>8} {'comfy GiB':>10} {'sp GiB':>8} planned fallbacks")
    fmt = lambda v: "-" if v is None else f"{v:.2e}"  # noqa: E731
    for r in rows:
        print(f"{r['model']:6} {str(r['lora']):5} {fmt(r['lora_changes_latents_by']):>11} {r['rel_l2']:11.2e} "
              f"{fmt(r['comfy_rel_l2_vs_fp32']):>9} {fmt(r['streamplan_rel_l2_vs_fp32']):>9} "
              f"{r['comfy_s']:8.2f} {r['streamplan_s']:8.2f} "
              f"{r['comfy_peak_bytes'] / G:10.3f} {r['streamplan_peak_bytes'] / G:8.3f} "
              f"{r['planned_calls']}/{r['calls']} {','.join(r['fallbacks']) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
