#!/usr/bin/env python3
"""An independent, plain-torch statement of the Wan 2.1 and Flux.1 transformer forwards, written
from the state_dict alone (no diffusers modules), one token-major op at a time, the way a C++
executor computes them. It is the executable form of the recipes in README.md.

    recipe.py DIR            recomputes DIR/reference.safetensors from DIR/model.safetensors,
                             DIR/inputs.safetensors and DIR/config.json and reports the rel L2
    recipe.py --make --family wan|flux [--variant dev|schnell] [--seed N]
                             the same on a fresh make_reference.py folder (temporary)

Exits nonzero when the recipe and diffusers differ by more than --tol (default 1e-5).
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F


def linear(w, name, x):
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def layer_norm(x, eps, weight=None, bias=None):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def sinusoid(t, channels):
    """[channels] fp32: cos half first, then sin; freqs exp(-ln(10000) * i / half), fp32 math."""
    half = channels // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    arg = t.float().reshape(()) * freqs
    return torch.cat([torch.cos(arg), torch.sin(arg)])


def rope_tables(positions, dims, theta=10000.0):
    """positions [T, A] (one column per axis), dims [A] (even, summing to head_dim).
    Returns cos, sin [T, head_dim / 2], one angle per rotated pair, axes in order."""
    angles = []
    for a, d in enumerate(dims):
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles.append(positions[:, a].to(torch.float64)[:, None] * inv[None, :])
    ang = torch.cat(angles, dim=1)
    return ang.cos().float(), ang.sin().float()


def rope(x, cos, sin):
    """x [T, heads, hd]; rotates interleaved pairs (x[2i], x[2i+1]) by the angle of pair i."""
    xe, xo = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    out = torch.empty_like(x)
    out[..., 0::2] = xe * c - xo * s
    out[..., 1::2] = xe * s + xo * c
    return out


def attention(q, k, v):
    """q [Tq, H, hd], k/v [Tk, H, hd] -> [Tq, H*hd]; softmax(q k^T / sqrt(hd)) v per head."""
    hd = q.shape[-1]
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v)
    return o.reshape(q.shape[0], -1)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def wan_forward(w, cfg, inp):
    pt, ph, pw = cfg["patch_size"]
    heads, hd = cfg["num_attention_heads"], cfg["attention_head_dim"]
    D, eps = heads * hd, cfg["eps"]
    x = inp["latents"]
    C, Fr, H, W = x.shape
    Fp, Hp, Wp = Fr // pt, H // ph, W // pw

    # Patch embedding: tokens in (f, h, w) order, features in (c, pt, ph, pw) order.
    patches = x.reshape(C, Fp, pt, Hp, ph, Wp, pw).permute(1, 3, 5, 0, 2, 4, 6).reshape(Fp * Hp * Wp, -1)
    h = F.linear(patches, w["patch_embedding.weight"].reshape(D, -1), w["patch_embedding.bias"])

    # Time: sinusoid(freq_dim) -> linear_1 -> silu -> linear_2 = temb; time_proj(silu(temb)) -> 6 x D.
    e = sinusoid(inp["timestep"], cfg["freq_dim"])
    temb = linear(w, "condition_embedder.time_embedder.linear_2",
                  F.silu(linear(w, "condition_embedder.time_embedder.linear_1", e)))
    tproj = linear(w, "condition_embedder.time_proj", F.silu(temb)).reshape(6, D)
    ctx = linear(w, "condition_embedder.text_embedder.linear_2",
                 gelu_tanh(linear(w, "condition_embedder.text_embedder.linear_1", inp["text"])))

    # RoPE: head dim split t | h | w with h = w = 2 * (hd // 6), t = the rest.
    dh = 2 * (hd // 6)
    dims = [hd - 2 * dh, dh, dh]
    ff_, hh_, ww_ = torch.meshgrid(torch.arange(Fp), torch.arange(Hp), torch.arange(Wp), indexing="ij")
    pos = torch.stack([ff_.flatten(), hh_.flatten(), ww_.flatten()], dim=1)
    cos, sin = rope_tables(pos, dims)

    for i in range(cfg["num_layers"]):
        b = f"blocks.{i}."
        shift_msa, scale_msa, gate_msa, c_shift, c_scale, c_gate = (w[b + "scale_shift_table"][0] + tproj).unbind(0)
        # self-attention
        n = layer_norm(h, eps) * (1 + scale_msa) + shift_msa
        q = rms_norm(linear(w, b + "attn1.to_q", n), w[b + "attn1.norm_q.weight"], eps)
        k = rms_norm(linear(w, b + "attn1.to_k", n), w[b + "attn1.norm_k.weight"], eps)
        v = linear(w, b + "attn1.to_v", n)
        q, k, v = (t.reshape(-1, heads, hd) for t in (q, k, v))
        a = attention(rope(q, cos, sin), rope(k, cos, sin), v)
        h = h + linear(w, b + "attn1.to_out.0", a) * gate_msa
        # cross-attention (no modulation, no gate, no RoPE)
        n = layer_norm(h, eps, w.get(b + "norm2.weight"), w.get(b + "norm2.bias")) if cfg["cross_attn_norm"] else h
        q = rms_norm(linear(w, b + "attn2.to_q", n), w[b + "attn2.norm_q.weight"], eps)
        k = rms_norm(linear(w, b + "attn2.to_k", ctx), w[b + "attn2.norm_k.weight"], eps)
        v = linear(w, b + "attn2.to_v", ctx)
        a = attention(q.reshape(-1, heads, hd), k.reshape(-1, heads, hd), v.reshape(-1, heads, hd))
        h = h + linear(w, b + "attn2.to_out.0", a)
        # feed-forward
        n = layer_norm(h, eps) * (1 + c_scale) + c_shift
        h = h + linear(w, b + "ffn.net.2", gelu_tanh(linear(w, b + "ffn.net.0.proj", n))) * c_gate

    shift, scale = (w["scale_shift_table"][0] + temb).unbind(0)  # temb, not time_proj
    o = linear(w, "proj_out", layer_norm(h, eps) * (1 + scale) + shift)
    # Unpatchify: proj_out features in (pt, ph, pw, c) order.
    o = o.reshape(Fp, Hp, Wp, pt, ph, pw, -1).permute(6, 0, 3, 1, 4, 2, 5)
    return o.reshape(-1, Fp * pt, Hp * ph, Wp * pw)


def flux_forward(w, cfg, inp):
    heads, hd = cfg["num_attention_heads"], cfg["attention_head_dim"]
    D, eps = heads * hd, 1e-6
    h = linear(w, "x_embedder", inp["latents"])
    c = linear(w, "context_embedder", inp["text"])
    L = c.shape[0]

    def embed(prefix, e):
        return linear(w, prefix + ".linear_2", F.silu(linear(w, prefix + ".linear_1", e)))

    temb = embed("time_text_embed.timestep_embedder", sinusoid(inp["timestep"] * 1000, 256))
    if cfg["guidance_embeds"]:
        temb = temb + embed("time_text_embed.guidance_embedder", sinusoid(inp["guidance"] * 1000, 256))
    temb = temb + embed("time_text_embed.text_embedder", inp["pooled"])
    st = F.silu(temb)

    ids = torch.cat([inp["txt_ids"], inp["img_ids"]], dim=0)  # [text | image]
    cos, sin = rope_tables(ids.float(), cfg["axes_dims_rope"])

    for i in range(cfg["num_layers"]):
        b = f"transformer_blocks.{i}."
        m = linear(w, b + "norm1.linear", st).reshape(6, D)
        mc = linear(w, b + "norm1_context.linear", st).reshape(6, D)
        # chunks: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp
        nx = layer_norm(h, eps) * (1 + m[1]) + m[0]
        nc = layer_norm(c, eps) * (1 + mc[1]) + mc[0]
        a = b + "attn."
        q = rms_norm(linear(w, a + "to_q", nx).reshape(-1, heads, hd), w[a + "norm_q.weight"], eps)
        k = rms_norm(linear(w, a + "to_k", nx).reshape(-1, heads, hd), w[a + "norm_k.weight"], eps)
        v = linear(w, a + "to_v", nx).reshape(-1, heads, hd)
        cq = rms_norm(linear(w, a + "add_q_proj", nc).reshape(-1, heads, hd), w[a + "norm_added_q.weight"], eps)
        ck = rms_norm(linear(w, a + "add_k_proj", nc).reshape(-1, heads, hd), w[a + "norm_added_k.weight"], eps)
        cv = linear(w, a + "add_v_proj", nc).reshape(-1, heads, hd)
        Q = rope(torch.cat([cq, q]), cos, sin)
        K = rope(torch.cat([ck, k]), cos, sin)
        o = attention(Q, K, torch.cat([cv, v]))
        h = h + m[2] * linear(w, a + "to_out.0", o[L:])
        c = c + mc[2] * linear(w, a + "to_add_out", o[:L])
        n = layer_norm(h, eps) * (1 + m[4]) + m[3]
        h = h + m[5] * linear(w, b + "ff.net.2", gelu_tanh(linear(w, b + "ff.net.0.proj", n)))
        n = layer_norm(c, eps) * (1 + mc[4]) + mc[3]
        c = c + mc[5] * linear(w, b + "ff_context.net.2", gelu_tanh(linear(w, b + "ff_context.net.0.proj", n)))

    x = torch.cat([c, h])  # [text | image]
    for i in range(cfg["num_single_layers"]):
        b = f"single_transformer_blocks.{i}."
        shift, scale, gate = linear(w, b + "norm.linear", st).reshape(3, D)
        n = layer_norm(x, eps) * (1 + scale) + shift
        mlp = gelu_tanh(linear(w, b + "proj_mlp", n))
        q = rms_norm(linear(w, b + "attn.to_q", n).reshape(-1, heads, hd), w[b + "attn.norm_q.weight"], eps)
        k = rms_norm(linear(w, b + "attn.to_k", n).reshape(-1, heads, hd), w[b + "attn.norm_k.weight"], eps)
        v = linear(w, b + "attn.to_v", n).reshape(-1, heads, hd)
        o = attention(rope(q, cos, sin), rope(k, cos, sin), v)
        x = x + gate * linear(w, b + "proj_out", torch.cat([o, mlp], dim=-1))

    h = x[L:]  # image tokens only
    scale, shift = linear(w, "norm_out.linear", st).reshape(2, D)  # scale first
    return linear(w, "proj_out", layer_norm(h, eps) * (1 + scale) + shift)


def check(dirpath, tol):
    from safetensors.torch import load_file

    w = load_file(os.path.join(dirpath, "model.safetensors"))
    inp = load_file(os.path.join(dirpath, "inputs.safetensors"))
    ref = load_file(os.path.join(dirpath, "reference.safetensors"))["output"]
    with open(os.path.join(dirpath, "config.json")) as f:
        cfg = json.load(f)
    cls = cfg["_class_name"]
    with torch.no_grad():
        if cls == "WanTransformer3DModel":
            out = wan_forward(w, cfg, inp)
        elif cls == "FluxTransformer2DModel":
            out = flux_forward(w, cfg, inp)
        else:
            sys.exit(f"recipe.py: unknown model class {cls}")
    if out.shape != ref.shape:
        sys.exit(f"recipe.py: shape {list(out.shape)} != reference {list(ref.shape)}")
    rel = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    ok = rel <= tol
    print(f"recipe {cls}: rel L2 vs diffusers {rel:.3e} (tol {tol:g}) {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--make", action="store_true", help="make a fresh reference folder first")
    ap.add_argument("--family", choices=["wan", "flux"])
    ap.add_argument("--variant", choices=["dev", "schnell"], default="dev")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-5)
    args = ap.parse_args(argv)
    if not args.make:
        if not args.dir:
            ap.error("give DIR, or --make --family F")
        return check(args.dir, args.tol)
    if not args.family:
        ap.error("--make needs --family")
    import tempfile

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_reference

    with tempfile.TemporaryDirectory(prefix="streamplan-recipe-") as d:
        out = args.dir or d
        make_reference.main(["--family", args.family, "--variant", args.variant, "--out", out,
                             "--seed", str(args.seed), "--quiet"])
        return check(out, args.tol)


if __name__ == "__main__":
    sys.exit(main())
