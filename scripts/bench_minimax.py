#!/usr/bin/env python3
"""ComfyUI's MiniMaxH3Model with and without `streamplan.apply`, in one process on a GPU.

The real MiniMax H3 dimensions with a few blocks (default 2) and seeded random weights in the
real layout (tests/reference/minimax_h3.py's make_state_dict), text to video + audio: 10 s at
1376 x 768 (72 latent frames, 74,304 video rows), 800 audio rows (2 x 400), 512 text tokens.

    python3 scripts/bench_minimax.py --out OUT/minimax.json
    python3 scripts/bench_minimax.py --blocks 2 --frames 72 --reps 3

Needs a ComfyUI tree with comfy/ldm/minimax/model.py (COMFYUI_PATH, default .deps/comfyui) and
comfy_kitchen importable (COMFY_KITCHEN_PATH adds a folder that holds it).

Runs, in order: ComfyUI's module in fp32 (the reference), ComfyUI's module in bf16 (the peer),
and streamplan attached to that same bf16 module, once with its default policy and once with
a budget of --budget-floor x floor (the floor read from the default plan). Each bf16 run is one
warm-up and then --reps timed calls (CUDA events); the peak is the caching allocator's peak
above what was allocated when the call began (weights, inputs). Video and audio are each
compared with the fp32 reference (rel L2). Prints a short table last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, HERE)

import torch  # noqa: E402


def comfy_modules():
    tree = os.environ.get("COMFYUI_PATH", os.path.join(ROOT, ".deps", "comfyui"))
    for p in (os.environ.get("COMFY_KITCHEN_PATH"), tree):
        if p and p not in sys.path:
            sys.path.insert(0, p)
    import comfy.ldm.minimax.model as model
    import comfy.ops as ops

    return model, ops


def build(model_mod, ops, cfg, sd, dtype):
    """ComfyUI's MiniMaxH3Model on the GPU in `dtype`, holding the weights of sd (as ComfyUI's
    loader gives them: its fp32 layers stay fp32)."""
    import minimax_h3 as h3

    m = model_mod.MiniMaxH3Model(**h3.comfy_kwargs(cfg), dtype=dtype, device="cuda", operations=ops.disable_weight_init)
    missing, unexpected = m.load_state_dict(sd, strict=True)
    assert not missing and not unexpected
    return m.to("cuda").eval().requires_grad_(False)  # buffers made without a device (rope.inv_freq) too


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--frames", type=int, default=72, help="latent frames (72: 10 s)")
    ap.add_argument("--height", type=int, default=768)
    ap.add_argument("--width", type=int, default=1376)
    ap.add_argument("--audio", type=int, default=400, help="audio latent frames per channel (40 Hz)")
    ap.add_argument("--text", type=int, default=512)
    ap.add_argument("--sigma", type=float, default=0.7)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget-floor", type=float, default=1.1)
    ap.add_argument("--out", help="write the results as JSON")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_minimax: needs a CUDA device", file=sys.stderr)
        return 1

    import minimax_h3 as h3
    import streamplan
    from bench_meter import metered, write_json

    model_mod, ops = comfy_modules()
    cfg = replace(h3.REAL, layers=a.blocks)
    t0 = time.time()
    sd = {k: v.cuda() for k, v in h3.make_state_dict(cfg, seed=0).items()}
    inp = h3.random_inputs(cfg, text_len=a.text, latent_t=a.frames, lat_h=a.height // 16, lat_w=a.width // 16,
                           audio_t=a.audio, seed=1)
    print(f"[bench_minimax] weights of {a.blocks} blocks and inputs in {time.time() - t0:.0f} s", file=sys.stderr)

    def args_for(dtype):
        x = [inp["video"][None].to("cuda", dtype), inp["audio"][None].to("cuda", dtype)]
        return x, torch.tensor([a.sigma * 1000.0], device="cuda"), inp["text"][None].to("cuda", dtype)

    def call(m, args):
        with torch.no_grad():  # transformer_options and the payload are fresh per call (ComfyUI writes into them)
            return m(*args, transformer_options={}, minimax_payload={})

    m32 = build(model_mod, ops, cfg, sd, torch.float32)
    reference = [t.float() for t in call(m32, args_for(torch.float32))]
    del m32
    torch.cuda.empty_cache()
    m16 = build(model_mod, ops, cfg, sd, torch.bfloat16)
    del sd
    torch.cuda.empty_cache()
    args16 = args_for(torch.bfloat16)

    def measured(label):
        out, calls = metered(m16, lambda: call(m16, args16), a.reps)
        errs = [float((o.double() - r.double()).norm() / r.double().norm()) for o, r in zip(out, reference)]
        print(f"[bench_minimax] {label}: {len(calls)} calls", file=sys.stderr)
        return {"ms_per_call": statistics.median(c[0] for c in calls),
                "peak_bytes": max(c[1] for c in calls),
                "video_rel_l2_vs_fp32": errs[0], "audio_rel_l2_vs_fp32": errs[1]}

    rows = {"ComfyUI MiniMaxH3Model (bf16)": measured("ComfyUI")}
    floor = None
    for label, budget in (("streamplan default", None), (f"streamplan {a.budget_floor} x floor", "floor")):
        if budget == "floor":
            budget = int(a.budget_floor * floor)
        handle = streamplan.apply(m16, budget=budget)
        try:
            try:
                r = measured(label)
            except streamplan.BudgetError as e:  # recorded, not fatal: the other rows still stand
                rows[label] = {"error": str(e), "budget": budget}
                continue
            plan = handle.to_dict()
            r.update(budget=budget, estimated_peak_bytes=plan["planned"]["estimated_peak_bytes"],
                     fallbacks=[str(f) for f in handle.fallbacks], planned_calls=handle.planned_calls)
            floor = plan["floor_bytes"]
        finally:
            streamplan.remove(m16)
        rows[label] = r
    comfy_again = measured("ComfyUI again")
    peer = rows["ComfyUI MiniMaxH3Model (bf16)"]
    peer["ms_per_call"] = 0.5 * (peer["ms_per_call"] + comfy_again["ms_per_call"])
    peer["peak_bytes"] = max(peer["peak_bytes"], comfy_again["peak_bytes"])

    tokens = a.text + 2 * a.audio + a.frames * (a.height // 32) * (a.width // 32)
    result = {"case": f"minimax-h3 {a.blocks} blocks, {a.frames} latent frames at {a.width}x{a.height}, "
                      f"{2 * a.audio} audio rows, {a.text} text", "tokens": tokens,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "floor_bytes": floor,
              "runs": rows}
    write_json(a.out, result)
    M = float(1 << 20)
    print(f"rows {tokens}, floor {floor / M:.0f} MiB, {a.blocks} blocks")
    print(f"{'':34} {'ms/call':>8} {'peak MiB':>9} {'/floor':>7} {'video err':>10} {'audio err':>10}")
    for label, r in rows.items():
        if "error" in r:
            print(f"{label:34} {r['error']}")
            continue
        print(f"{label:34} {r['ms_per_call']:8.1f} {r['peak_bytes'] / M:9.0f} {r['peak_bytes'] / floor:7.3f} "
              f"{r['video_rel_l2_vs_fp32']:10.3e} {r['audio_rel_l2_vs_fp32']:10.3e}")
    for label, r in rows.items():
        if "fallbacks" in r and r["fallbacks"]:
            print(f"{label}: fallbacks {r['fallbacks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
