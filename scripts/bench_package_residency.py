#!/usr/bin/env python3
"""`streamplan.apply(..., device_memory=...)` on a GPU: a diffusers transformer held in host
memory, its blocks' weights streamed to the device, against the same module all on the device.

diffusers' WanTransformer3DModel at Wan 2.1 14B's widths with a few layers and seeded random
bf16 weights (tests/reference/make_reference.py's randomization), latents for 81 frames at
1280x720 (75,600 tokens) and 512 random text tokens; one transformer call, repeated.

    python3 scripts/bench_package_residency.py --out OUT/package_residency.json
    python3 scripts/bench_package_residency.py --layers 8 --device-memory 5GiB,8GiB --reps 2

First the module on the device with `streamplan.apply(module)` (every weight resident), then
the module moved to the CPU and attached with `device_memory=SIZE, device="cuda"` for each
size. Per case: the median device time of a call, the caching allocator's peak allocated and
reserved bytes over the timed calls (everything the process held: kept weights, slots,
activations), the arrangement the planner chose (Handle.residency) and the output's rel L2
against the all-resident one. Prints a short table last.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    from bench_meter import add_wan_run_args

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_wan_run_args(ap, layers=8, reps=2)
    ap.add_argument("--device-memory", default="5GiB,8GiB", help="comma-separated sizes")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_package_residency: needs a CUDA device", file=sys.stderr)
        return 1

    import streamplan
    from bench_meter import metered, wan14b_transformer, write_json

    t0 = time.time()
    model = wan14b_transformer(a.layers).to(torch.bfloat16)
    block_bytes = sum(p.numel() * p.element_size() for p in model.blocks.parameters())
    print(f"[residency] {a.layers} layers ({block_bytes / 2**30:.2f} GiB of block weights) built in "
          f"{time.time() - t0:.0f} s", file=sys.stderr)
    gen = torch.Generator().manual_seed(1)
    frames = 1 + (a.frames - 1) // 4
    latents = torch.randn((1, 16, frames, a.height // 8, a.width // 8), generator=gen).to("cuda", torch.bfloat16)
    text = torch.randn((1, 512, 4096), generator=gen).to("cuda", torch.bfloat16)
    step = torch.tensor([500.0], device="cuda")

    def call() -> torch.Tensor:
        with torch.no_grad():
            return model(hidden_states=latents, timestep=step, encoder_hidden_states=text, return_dict=False)[0]

    def case(label: str, **options) -> dict:
        handle = streamplan.apply(model, **options)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        out, calls = metered(model, call, a.reps)
        row = {"case": label, "ms": statistics.median(c[0] for c in calls),
               "max_allocated_bytes": torch.cuda.max_memory_allocated(),
               "max_reserved_bytes": torch.cuda.max_memory_reserved(), "fallbacks": [str(f) for f in handle.fallbacks],
               "residency": handle.residency, "out": out.float()}
        streamplan.remove(model)  # gives back the streamed weights' memory
        del handle
        gc.collect()
        torch.cuda.empty_cache()
        print(f"[residency] {label}: {row['ms']:.1f} ms", file=sys.stderr)
        return row

    model.to("cuda")
    resident = case("all resident")
    model.to("cpu")
    torch.cuda.empty_cache()
    rows = []
    for size in [s for s in a.device_memory.split(",") if s]:
        row = case(f"device_memory {size}", device_memory=size, device="cuda")
        row["device_memory_bytes"] = streamplan._C.parse_budget(size)
        rows.append(row)

    ref = resident["out"]
    results = []
    for r in [resident, *rows]:
        out = r.pop("out")
        r["rel_l2_vs_all_resident"] = float((out.double() - ref.double()).norm() / ref.double().norm())
        r["equal_to_all_resident"] = bool(torch.equal(out, ref))
        results.append(r)
    for r in rows:
        r["all_resident_ms"] = resident["ms"]
        res = r["residency"] or {}
        r["resident_blocks"] = res.get("resident_blocks")
        r["predicted_ms"] = res.get("predicted_ms")
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "streamplan": streamplan.__version__,
           "model": f"diffusers WanTransformer3DModel, Wan 2.1 14B widths, {a.layers} layers",
           "block_weight_bytes": block_bytes, "tokens": frames * (a.height // 16) * (a.width // 16), "rows": results}
    write_json(a.out, doc)
    G = float(1 << 30)
    print(f"{'case':24} {'ms':>9} {'vs resident':>11} {'predicted':>9} {'kept+slots':>10} {'alloc GiB':>9} "
          f"{'held GiB':>9} {'rel L2':>9}")
    for r in results:
        res = r["residency"] or {}
        arrangement = f"{res['kept_blocks']}+{res['slots']}" if res else "all"
        pred = f"{res['predicted_ms']:9.1f}" if res else f"{'':9}"
        print(f"{r['case']:24} {r['ms']:9.1f} {r['ms'] / resident['ms']:11.3f} {pred} {arrangement:>10} "
              f"{r['max_allocated_bytes'] / G:9.2f} {r['max_reserved_bytes'] / G:9.2f} {r['rel_l2_vs_all_resident']:9.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
