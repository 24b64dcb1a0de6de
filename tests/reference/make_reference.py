#!/usr/bin/env python3
"""Builds a small random-weight diffusers transformer, runs its forward in fp32 on the CPU and
writes everything streamplan needs to reproduce that forward.

    make_reference.py --family wan|flux [--variant dev|schnell] --out DIR [--seed N]

Writes into DIR:
  model.safetensors      the model's state_dict as is (diffusers names and layouts), fp32
  config.json            the diffusers config of the model (model.save_config)
  inputs.safetensors     fp32 inputs, batch dimension dropped (see INPUTS below)
  reference.safetensors  `output`: diffusers' forward on those inputs, batch dimension dropped

INPUTS
  wan:  latents  [C, F, H, W]        hidden_states (video latents)
        timestep [1]                 the value given to the transformer (e.g. 730.0)
        text     [L, text_dim]       encoder_hidden_states (before the text embedder)
  flux: latents  [N, in_channels]    hidden_states as the transformer takes them (packed 2x2 latent
                                     patches, tokens in row-major order over the patch grid)
        img_ids  [N, 3]              (0, row, col) of each image token, as FluxPipeline makes them
        text     [L, joint_attention_dim]  encoder_hidden_states (before context_embedder)
        txt_ids  [L, 3]              position ids of the text tokens. FluxPipeline passes zeros; here
                                     they are nonzero on purpose, so that RoPE on text tokens and on
                                     axis 0 is exercised (i, i % 3, 2 * i)
        pooled   [pooled_projection_dim]  pooled_projections
        timestep [1]                 the value given to the transformer, already divided by 1000
                                     (e.g. 0.73); the transformer multiplies it by 1000 itself
        guidance [1]                 dev only: the value given to the transformer (e.g. 3.5); the
                                     transformer multiplies it by 1000 itself
OUTPUT
  wan:  output [C_out, F, H, W];  flux: output [N, out_channels]

Every parameter is overwritten with seeded random values (diffusers zero-initialises some layers):
matrices and conv kernels N(0, 1/fan_in), 1-D weights (norm scales) 1 + N(0, 0.1^2), biases
N(0, 0.05^2), scale_shift_table N(0, 1/dim).

The metadata of inputs.safetensors records family, variant, seed and the diffusers version.
"""
import argparse
import json
import math
import os
import sys

import torch

# Plain PyTorch SDPA for diffusers' attention, whatever the environment says; never the network.
os.environ["DIFFUSERS_ATTN_BACKEND"] = "native"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DIFFUSERS_VERSION = "0.42.1"

WAN_CONFIG = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=32,  # RoPE split t/h/w = 12/10/10
    in_channels=16,
    out_channels=16,
    text_dim=32,
    freq_dim=32,
    ffn_dim=96,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    image_dim=None,
    added_kv_proj_dim=None,
    rope_max_seq_len=1024,
)
WAN_LATENT = (16, 3, 8, 12)  # C, F (odd), H, W
WAN_TEXT_LEN = 7
WAN_TIMESTEP = 730.0


def flux_config(variant):
    return dict(
        patch_size=1,
        in_channels=16,
        out_channels=None,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=24,
        guidance_embeds=(variant == "dev"),
        axes_dims_rope=(4, 6, 6),
    )


FLUX_GRID = (8, 10)  # latent patch rows, cols
FLUX_TEXT_LEN = 5
FLUX_TIMESTEP = 0.73
FLUX_GUIDANCE = 3.5


def randomize(model, gen):
    """Overwrites every parameter with seeded random values of a reasonable scale (drawn on the
    generator's device)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("scale_shift_table"):
                v = torch.randn(p.shape, generator=gen, device=gen.device) / math.sqrt(p.shape[-1])
            elif p.ndim >= 2:
                fan_in = p[0].numel()
                v = torch.randn(p.shape, generator=gen, device=gen.device) / math.sqrt(fan_in)
            elif name.endswith("bias"):
                v = 0.05 * torch.randn(p.shape, generator=gen, device=gen.device)
            elif name.endswith("weight") or name.endswith(".scale"):  # norm gains (BFL names them scale)
                v = 1.0 + 0.1 * torch.randn(p.shape, generator=gen, device=gen.device)
            else:
                raise RuntimeError(f"no initialisation rule for parameter {name} {tuple(p.shape)}")
            p.copy_(v.to(p.dtype))


def build_wan(gen):
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel(**WAN_CONFIG)
    randomize(model, gen)
    inputs = {
        "latents": torch.randn(WAN_LATENT, generator=gen),
        "timestep": torch.tensor([WAN_TIMESTEP]),
        "text": torch.randn((WAN_TEXT_LEN, WAN_CONFIG["text_dim"]), generator=gen),
    }

    def forward():
        out = model(
            hidden_states=inputs["latents"][None],
            timestep=inputs["timestep"],
            encoder_hidden_states=inputs["text"][None],
            return_dict=False,
        )[0]
        return out[0]

    return model, inputs, forward


def build_flux(gen, variant):
    from diffusers import FluxTransformer2DModel

    cfg = flux_config(variant)
    model = FluxTransformer2DModel(**cfg)
    randomize(model, gen)
    rows, cols = FLUX_GRID
    n = rows * cols
    img_ids = torch.zeros(rows, cols, 3)
    img_ids[..., 1] = torch.arange(rows, dtype=torch.float32)[:, None]
    img_ids[..., 2] = torch.arange(cols, dtype=torch.float32)[None, :]
    i = torch.arange(FLUX_TEXT_LEN, dtype=torch.float32)
    txt_ids = torch.stack([i, i.remainder(3), 2 * i], dim=1)
    inputs = {
        "latents": torch.randn((n, cfg["in_channels"]), generator=gen),
        "img_ids": img_ids.reshape(n, 3),
        "text": torch.randn((FLUX_TEXT_LEN, cfg["joint_attention_dim"]), generator=gen),
        "txt_ids": txt_ids,
        "pooled": torch.randn((cfg["pooled_projection_dim"],), generator=gen),
        "timestep": torch.tensor([FLUX_TIMESTEP]),
    }
    if cfg["guidance_embeds"]:
        inputs["guidance"] = torch.tensor([FLUX_GUIDANCE])

    def forward():
        out = model(
            hidden_states=inputs["latents"][None],
            encoder_hidden_states=inputs["text"][None],
            pooled_projections=inputs["pooled"][None],
            timestep=inputs["timestep"],
            img_ids=inputs["img_ids"],
            txt_ids=inputs["txt_ids"],
            guidance=inputs.get("guidance"),
            return_dict=False,
        )[0]
        return out[0]

    return model, inputs, forward


def stats(t):
    t = t.double()
    return (f"shape={list(t.shape)} mean={t.mean().item():+.4f} std={t.std(unbiased=False).item():.4f} "
            f"absmax={t.abs().max().item():.4f} rms={t.pow(2).mean().sqrt().item():.4f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", required=True, choices=["wan", "flux"])
    ap.add_argument("--variant", choices=["dev", "schnell"], default="dev",
                    help="flux only: dev (guidance_embeds=True) or schnell (guidance_embeds=False)")
    ap.add_argument("--out", required=True, help="output folder (created if missing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    import diffusers
    from safetensors.torch import save_file

    if diffusers.__version__ != DIFFUSERS_VERSION:
        sys.exit(f"make_reference.py: needs diffusers=={DIFFUSERS_VERSION}, found {diffusers.__version__}")

    torch.manual_seed(args.seed)
    torch.set_default_dtype(torch.float32)
    gen = torch.Generator().manual_seed(args.seed)
    if args.family == "wan":
        model, inputs, forward = build_wan(gen)
        variant = ""
    else:
        model, inputs, forward = build_flux(gen, args.variant)
        variant = args.variant
    model = model.eval()  # built on the CPU in fp32 (the default dtype)

    with torch.no_grad():
        output = forward().contiguous()
    if not torch.isfinite(output).all():
        sys.exit("make_reference.py: reference output is not finite")

    os.makedirs(args.out, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    model.save_config(args.out)  # config.json, with _class_name and _diffusers_version
    meta = {"family": args.family, "variant": variant, "seed": str(args.seed),
            "diffusers": diffusers.__version__, "class": type(model).__name__}
    save_file({k: v.contiguous() for k, v in inputs.items()},
              os.path.join(args.out, "inputs.safetensors"), metadata=meta)
    save_file({"output": output}, os.path.join(args.out, "reference.safetensors"), metadata=meta)

    if not args.quiet:
        name = args.family + (f"-{variant}" if variant else "")
        nparams = sum(v.numel() for v in state.values())
        print(f"{name}: {len(state)} tensors, {nparams} parameters -> {args.out}")
        for k, v in inputs.items():
            print(f"  input  {k:9s} {stats(v)}")
        print(f"  output {'output':9s} {stats(output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
