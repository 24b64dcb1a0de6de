#!/usr/bin/env python3
"""diffusers' WanPipeline with and without `streamplan.apply`, in one process on a GPU.

The Wan 2.1 14B transformer at its real widths with a few layers and seeded random weights
(tests/reference/make_reference.py's randomization), a tiny VAE (the pipeline only needs its
scale factors: output_type="latent"), Wan's own scheduler, random prompt embeddings of 512
tokens; one denoising step with classifier-free guidance (two transformer calls).

    python3 scripts/bench_package.py --out OUT/package.json
    python3 scripts/bench_package.py --layers 2 --frames 81 --height 720 --width 1280 --reps 3

Per transformer call it records the device time (CUDA events) and the peak of the caching
allocator above what was allocated when the call began (weights, inputs, pipeline state):
the transformer's activation peak. The unpatched pipeline is run before and after the
patched one (its time is the mean of both medians); the latents of each bf16 run are compared
with an fp32 run of the unpatched pipeline on the same weights. Prints a short table last.
"""

from __future__ import annotations

import argparse
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
    add_wan_run_args(ap, layers=2, reps=3)
    ap.add_argument("--budget", default=None, help="streamplan.apply budget (default: none, the lean default)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_package: needs a CUDA device", file=sys.stderr)
        return 1

    import streamplan
    from bench_meter import metered, wan14b_transformer, write_json
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline

    t0 = time.time()
    model = wan14b_transformer(a.layers).to("cuda")  # fp32: the reference run
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True]).to("cuda")
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        num_train_timesteps=1000, flow_shift=5.0)
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler, transformer=model)
    pipe.set_progress_bar_config(disable=True)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randn((1, 512, 4096), generator=gen)
    negative = torch.randn((1, 512, 4096), generator=gen)
    print(f"[bench_package] model of {a.layers} layers built in {time.time() - t0:.0f} s", file=sys.stderr)

    def run() -> torch.Tensor:
        dt = pipe.transformer.dtype
        with torch.no_grad():
            out = pipe(prompt_embeds=prompt.to("cuda", dt), negative_prompt_embeds=negative.to("cuda", dt),
                       height=a.height, width=a.width, num_frames=a.frames, num_inference_steps=1,
                       guidance_scale=5.0, generator=torch.Generator("cuda").manual_seed(2),
                       output_type="latent")
        return out.frames.float()

    reference = run()  # fp32
    pipe.transformer.to(torch.bfloat16)
    torch.cuda.empty_cache()

    def measured(label: str) -> tuple[torch.Tensor, list]:
        lat, calls = metered(pipe.transformer, run, a.reps)
        print(f"[bench_package] {label}: {len(calls)} calls", file=sys.stderr)
        return lat, calls

    base_lat, base_before = measured("unpatched")
    handle = streamplan.apply(pipe.transformer, budget=a.budget)
    sp_lat, sp_calls = measured("streamplan")
    plan = handle.to_dict()
    fallbacks = [str(f) for f in handle.fallbacks]
    streamplan.remove(pipe.transformer)
    _, base_after = measured("unpatched again")

    def rel_l2(x: torch.Tensor) -> float:
        return float((x.double() - reference.double()).norm() / reference.double().norm())

    base_ms = 0.5 * (statistics.median(c[0] for c in base_before) + statistics.median(c[0] for c in base_after))
    sp_ms = statistics.median(c[0] for c in sp_calls)
    base_peak = max(c[1] for c in base_before + base_after)
    sp_peak = max(c[1] for c in sp_calls)
    tokens = (1 + (a.frames - 1) // 4) * (a.height // 16) * (a.width // 16)
    result = {
        "case": f"wan14b-{a.layers}-layer pipeline, {a.frames}x{a.width}x{a.height}, 1 step, CFG",
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": tokens,
        "peer": "diffusers WanTransformer3DModel (unpatched)",
        "peer_ms_per_call": base_ms, "peer_peak_bytes": base_peak, "peer_rel_l2_vs_fp32": rel_l2(base_lat),
        "streamplan_ms_per_call": sp_ms, "streamplan_peak_bytes": sp_peak, "streamplan_rel_l2_vs_fp32": rel_l2(sp_lat),
        "streamplan_estimated_peak_bytes": plan["planned"]["estimated_peak_bytes"],
        "floor_bytes": plan["floor_bytes"], "fallbacks": fallbacks, "budget": a.budget,
    }
    write_json(a.out, result)
    G = float(1 << 30)
    print(f"{'':28} {'ms/call':>9} {'peak GiB':>9} {'rel L2 vs fp32':>15}")
    print(f"{'diffusers (unpatched)':28} {base_ms:9.1f} {base_peak / G:9.3f} {result['peer_rel_l2_vs_fp32']:15.3e}")
    print(f"{'streamplan.apply':28} {sp_ms:9.1f} {sp_peak / G:9.3f} {result['streamplan_rel_l2_vs_fp32']:15.3e}")
    print(f"peak unpatched / streamplan: {base_peak / max(sp_peak, 1):.2f}; time streamplan / unpatched: "
          f"{sp_ms / base_ms:.3f}; error ratio: {result['streamplan_rel_l2_vs_fp32'] / result['peer_rel_l2_vs_fp32']:.2f}; "
          f"fallbacks: {len(fallbacks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
