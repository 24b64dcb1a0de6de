"""PyTorch's attention kernels at the video models' shapes: ATen's flash, cuDNN and
memory-efficient scaled_dot_product_attention, on Q/K/V laid out as the planner hands them to a
consumer (token-major views [B, H, S, D] of a [B, S, H*D] projection, and head-major), whole and
in query slabs against the whole K/V. Prints ms, TFLOP/s and rel L2 against fp32 per kernel, and
writes JSON with --out.

    python scripts/bench_sdpa.py --out sdpa.json
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# (name, batch, heads, tokens): Wan 2.1 14B at 81x1280x720 with CFG in one batch, MiniMax H3 10 s
# at 1376x768 (video, audio and text rows of one call).
SHAPES = {"wan14b-81f-cfg": (2, 40, 75600), "h3-10s": (1, 56, 75626)}
KERNELS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
           "efficient": SDPBackend.EFFICIENT_ATTENTION}


def qkv(b: int, h: int, s: int, d: int, dtype: torch.dtype, layout: str) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for _ in range(3):
        if layout == "token-major":  # a [B, S, H*D] projection viewed as heads
            t = torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
        else:
            t = torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g)
        out.append(t)
    return out


def timed(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        ms.append(start.elapsed_time(end))
    return sorted(ms)[len(ms) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--slabs", default="1,4", help="query slabs per call (the K/V is whole)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ref-rows", type=int, default=512, help="query rows checked against fp32")
    ap.add_argument("--out")
    a = ap.parse_args()
    dev = torch.cuda.get_device_name()
    rows = []
    for name in a.shapes.split(","):
        if name not in SHAPES:
            raise SystemExit(f"--shapes: unknown shape {name!r} (one of {', '.join(SHAPES)})")
        b, h, s = SHAPES[name]
        for dname in a.dtypes.split(","):
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dname]
            for layout in ("token-major", "head-major"):
                q, k, v = qkv(b, h, s, 128, dtype, layout)
                r = min(a.ref_rows, s)
                qr = q[:, :, :r].float()
                ref = torch.softmax(qr @ k.float().transpose(-1, -2) / 128 ** 0.5, -1) @ v.float()
                for slabs in (int(x) for x in a.slabs.split(",")):
                    bounds = [s * i // slabs for i in range(slabs + 1)]
                    for kname, backend in KERNELS.items():
                        def run() -> torch.Tensor:
                            with sdpa_kernel([backend]):
                                outs = [torch.nn.functional.scaled_dot_product_attention(q[:, :, lo:hi], k, v)
                                        for lo, hi in zip(bounds, bounds[1:])]
                            return outs[0]
                        try:
                            ms = timed(run, a.reps)
                            with sdpa_kernel([backend]):
                                o = torch.nn.functional.scaled_dot_product_attention(q[:, :, :r], k, v)
                            err = float((o.float() - ref).norm() / ref.norm())
                        except RuntimeError as e:
                            print(f"{name} {dname} {layout} slabs {slabs} {kname}: not run: {str(e).splitlines()[0]}")
                            continue
                        tflops = 4.0 * b * h * s * s * 128 / ms / 1e9
                        rows.append(dict(shape=name, batch=b, heads=h, tokens=s, dtype=dname, layout=layout,
                                         slabs=slabs, kernel=kname, ms=ms, tflops=tflops, rel_l2=err))
                        print(f"{name} {dname} {layout} slabs {slabs} {kname}: {ms:.1f} ms, {tflops:.0f} TFLOP/s, "
                              f"rel L2 {err:.2e}", flush=True)
                del q, k, v
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
