"""The error of 8-bit attention arithmetic on bench-attention's input distributions, emulated in
fp32 on the CPU: what a quantization scheme can reach before any kernel is written for it.

Each scheme rounds Q, K (and for FP8 P·V, P and V) as a kernel would, then computes attention in
fp32; the row is the rel L2 of its output against exact fp32 attention. `int8 tile` is the int8
consumer's arithmetic (K smoothed by its per-head mean, Q and K per head and 64-row tile,
scale = absmax / 127, P rounded to bf16 for P·V): its figures match the device's (docs/benchmarks.md). The
other schemes are candidates:

    int8 tile, K channels balanced   K channel j divided by c_j and Q's multiplied by it (exact in
                                     real arithmetic), c_j = sqrt(absmax of K channel j / the mean
                                     of those), from K alone
    int8 row                         one scale per row of Q and of K
    int8 row, balanced               both
    int8 tile, 32-channel groups     one scale per 64-row tile and 32 channels
    int8 tile + FP8 P·V              P (<= 1 after the online max) times 448 in e4m3, V per channel
                                     in e4m3 (absmax / 448), V unchanged
    int8 tile + FP8 P·V, V smoothed  V's per-channel mean subtracted first and added back
    int8 tile + INT8 P·V             P (<= 1) as u8 at steps of 1/255 (the row sum from the
                                     unrounded P), V's per-channel mean subtracted, then s8 per
                                     channel (absmax / 127): u8 x s8 products, as wgmma takes them
    ..., P per KV tile               P as u8 per row and KV tile of 128 at that tile's largest
                                     value (the online softmax knows it: exp of the tile's row
                                     maximum less the running one), undone with the tile's int32
                                     sum when it is added to the fp32 output

Last, per distribution, the logit noise the int8 consumer's rounding of Q and K predicts, from
what its kernels hold (Q's and K's tile scales, each Q tile's largest row norm, K's largest row
norm, after K's mean and channel factors): per head, the mean over query tiles of
ln 2 / sqrt(12) * sqrt(|q|max^2 * mean k_scale^2 + |k|max^2 * q_scale^2) in the kernels' log2
scale, i.e. the standard deviation of a score's error in natural-log units. It is an upper
estimate of the output's rel L2 where attention is diffuse; peaked rows are less sensitive.

    .venv/bin/python scripts/attn_error_model.py [--rows 4096] [--heads 2] [--head-dim 128]
        [--distribution gaussian,outlier-k,peaky,qk-norm,video-local] [--json F]

The inputs follow the generator of `bench-attention --distribution` (docs/bench.md), on a square
video grid of the given rows; video-local's field is drawn here with the same recipe (trilinear
from a grid 4x coarser, unit variance per channel, plus N(0, 0.25) noise).
"""

from __future__ import annotations

import argparse
import json
import math

import torch

TILE = 64
DISTRIBUTIONS = ("gaussian", "outlier-k", "peaky", "qk-norm", "video-local")


def inputs(name: str, h: int, n: int, d: int, gen: torch.Generator):
    def normal(*shape):
        return torch.randn(*shape, generator=gen)

    q, k, v = normal(1, h, n, d)[0], normal(1, h, n, d)[0], normal(1, h, n, d)[0]
    if name == "gaussian":
        k += normal(1, 1, d)
    elif name == "outlier-k":
        k += 3 * normal(1, 1, d)
        for c in (3, d // 5, d // 2, d - 7):
            k[..., min(max(c, 0), d - 1)] *= 20
    elif name == "peaky":
        q = 1.5 * k[:, torch.randint(n, (n,), generator=gen)] + 0.5 * normal(h, n, d)
    elif name == "qk-norm":
        def rms(x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        q = rms(q) * (4 + 4 * torch.rand(d, generator=gen))
        k = rms(k) * (4 + 4 * torch.rand(d, generator=gen))
    elif name == "video-local":
        side = max(1, int(round(math.sqrt(n / 4))))
        grid, rows = (4, side, n // (4 * side)), 4 * side * (n // (4 * side))
        coarse = normal(1, h * d, *((g + 3) // 4 for g in grid))
        f = torch.nn.functional.interpolate(coarse, size=grid, mode="trilinear", align_corners=True)
        f = f.view(h * d, rows).t()
        f = (f - f.mean(0)) / f.std(0).clamp_min(1e-6)
        f = f.view(rows, h, d).permute(1, 0, 2)
        q[:, :rows] = f + 0.5 * normal(h, rows, d)
        k[:, :rows] = f + 0.5 * normal(h, rows, d)
    else:
        raise ValueError(f"--distribution: unknown '{name}' ({', '.join(DISTRIBUTIONS)})")
    return q, k, v


def int8_tiles(x: torch.Tensor, tile: int = TILE, group: int | None = None) -> torch.Tensor:
    h, n, d = x.shape
    g = group or d
    t = x.view(h, n // tile, tile, d // g, g)
    s = t.abs().amax((2, 4), keepdim=True).clamp_min(1e-30) / 127
    return (torch.round(t / s).clamp(-127, 127) * s).view(h, n, d)


def int8_rows(x: torch.Tensor) -> torch.Tensor:
    s = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 127
    return torch.round(x / s).clamp(-127, 127) * s


def e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float8_e4m3fn).float()


KV_TILE = 128


def u8_tiles(p: torch.Tensor) -> torch.Tensor:
    """P as u8 per row and KV tile of 128 at that tile's largest value (<= 1)."""
    h, n, m = p.shape
    t = p.view(h, n, m // KV_TILE, KV_TILE)
    s = t.amax(-1, keepdim=True).clamp_min(1e-30) / 255
    return (torch.round(t / s) * s).view(h, n, m)


def smoothed(q: torch.Tensor, k: torch.Tensor, balance: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Q and K as the int8 consumer quantizes them: K less its per-head mean (softmax does not see
    a per-row constant) and, with balance, K's channel j divided by c_j and Q's multiplied by it."""
    k = k - k.mean(1, keepdim=True)
    if balance:
        a = k.abs().amax(1, keepdim=True)
        c = (a / a.mean(-1, keepdim=True)).sqrt().clamp_min(1e-6)
        q, k = q * c, k / c
    return q, k


def logit_noise(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Per head, the predicted standard deviation (natural-log units) of a score's error under
    the int8 consumer's rounding (tiles of 64, K less its mean and balanced against Q)."""
    q, k = smoothed(q, k, balance=True)
    h, n, d = q.shape

    def step(x):  # the int8 step of each 64-row tile: absmax / 127
        return x.view(h, n // TILE, TILE, d).abs().amax((2, 3)) / 127

    qn = q.norm(dim=-1).view(h, n // TILE, TILE).amax(-1)  # each query tile's largest row norm
    kn = k.norm(dim=-1).amax(-1, keepdim=True)               # K's largest row norm
    ks = step(k).mean(-1, keepdim=True)
    sigma = scale / math.sqrt(12) * torch.sqrt(qn ** 2 * ks ** 2 + kn ** 2 * step(q) ** 2)
    return sigma.mean(-1)


def attention(q, k, v, scale, round_qk=None, balance=False, fp8_pv=False, smooth_v=False, int8_pv=None):
    if round_qk is None:
        return torch.softmax(q @ k.transpose(1, 2) * scale, -1) @ v
    q, k = smoothed(q, k, balance)
    s = round_qk(q) @ round_qk(k).transpose(1, 2) * scale
    p = torch.exp(s - s.amax(-1, keepdim=True))
    if int8_pv:  # P as u8 at 1/255, V's channels as s8 (absmax / 127) after their mean
        mean = v.mean(1, keepdim=True)
        vs = (v - mean).abs().amax(1, keepdim=True).clamp_min(1e-30) / 127
        o = int8_pv(p) @ (torch.round((v - mean) / vs).clamp(-127, 127) * vs)
        return o / p.sum(-1, keepdim=True) + mean
    if not fp8_pv:  # P in bf16, as the kernels' 16-bit P·V takes it
        return (p.bfloat16().float() @ v) / p.sum(-1, keepdim=True)
    mean = v.mean(1, keepdim=True) if smooth_v else torch.zeros_like(v[:, :1])
    vs = (v - mean).abs().amax(1, keepdim=True).clamp_min(1e-30) / 448
    o = (e4m3(p * 448) / 448) @ (e4m3((v - mean) / vs) * vs)
    return o / p.sum(-1, keepdim=True) + mean


SCHEMES = {
    "int8 tile": dict(round_qk=int8_tiles),
    "int8 tile, K channels balanced": dict(round_qk=int8_tiles, balance=True),
    "int8 row": dict(round_qk=int8_rows),
    "int8 row, balanced": dict(round_qk=int8_rows, balance=True),
    "int8 tile, 32-channel groups": dict(round_qk=lambda x: int8_tiles(x, group=32)),
    "int8 tile + FP8 P·V": dict(round_qk=int8_tiles, fp8_pv=True),
    "int8 tile + FP8 P·V, V smoothed": dict(round_qk=int8_tiles, fp8_pv=True, smooth_v=True),
    "int8 tile + INT8 P·V": dict(round_qk=int8_tiles, int8_pv=lambda p: torch.round(p * 255) / 255),
    "int8 tile + INT8 P·V, P per KV tile": dict(round_qk=int8_tiles, int8_pv=u8_tiles),
    "int8 row, balanced + INT8 P·V, P per KV tile": dict(round_qk=int8_rows, balance=True, int8_pv=u8_tiles),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4096, help="sequence length, a multiple of 128 (default 4096)")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--distribution", default=",".join(DISTRIBUTIONS), help="comma-separated (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the rows to this file")
    a = ap.parse_args(argv)
    if a.rows < KV_TILE or a.rows % KV_TILE:
        ap.error(f"--rows: a positive multiple of {KV_TILE}, got {a.rows}")
    if a.heads < 1 or a.head_dim < 32 or a.head_dim % 32:
        ap.error(f"--heads >= 1 and --head-dim a multiple of 32, got {a.heads} and {a.head_dim}")
    names = [s for s in a.distribution.split(",") if s]
    for s in names:
        if s not in DISTRIBUTIONS:
            ap.error(f"--distribution: unknown '{s}' ({', '.join(DISTRIBUTIONS)})")

    rows, noise = [], {}
    for name in names:
        gen = torch.Generator().manual_seed(a.seed)
        q, k, v = inputs(name, a.heads, a.rows, a.head_dim, gen)
        scale = 1 / math.sqrt(a.head_dim)
        exact = attention(q, k, v, scale)
        for scheme, kw in SCHEMES.items():
            got = attention(q, k, v, scale, **kw)
            rows.append({"distribution": name, "scheme": scheme,
                         "rel_l2": ((got - exact).norm() / exact.norm()).item()})
        noise[name] = logit_noise(q, k, scale).tolist()

    width = max(len(s) for s in SCHEMES)
    print(f"{a.heads} heads x {a.rows} rows x head_dim {a.head_dim}, rel L2 against fp32 attention")
    print(f"{'scheme':<{width}} " + " ".join(f"{n:>11}" for n in names))
    for scheme in SCHEMES:
        vals = {r["distribution"]: r["rel_l2"] for r in rows if r["scheme"] == scheme}
        print(f"{scheme:<{width}} " + " ".join(f"{vals[n]:>11.2e}" for n in names))
    print(f"{'predicted logit noise (largest head)':<{width}} " + " ".join(f"{max(noise[n]):>11.2e}" for n in names))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"heads": a.heads, "rows": a.rows, "head_dim": a.head_dim, "seed": a.seed, "results": rows,
                       "logit_noise": noise}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
