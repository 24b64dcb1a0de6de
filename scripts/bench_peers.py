#!/usr/bin/env python3
"""The peers of the benchmark cases: diffusers' own transformer modules, unpatched and with
`streamplan.apply`, in one process on the same seeded random weights (bf16, on a GPU).

    python3 scripts/bench_peers.py --out OUT/peers.json
    python3 scripts/bench_peers.py --cases flux-dev-1024 --reps 5
    python3 scripts/bench_peers.py --merge OUT/peers.json docs/benchmarks.json

Cases (the names and geometries of `streamplan bench`'s cases):
  wan14b-block-81f   WanTransformer3DModel, Wan 2.1 14B widths, 1 layer, 81 x 1280 x 720, 512 text
  wan14b-model-81f   the same with all 40 layers
  flux-dev-1024      FluxTransformer2DModel, Flux.1-dev (19 + 38 blocks), 1024 x 1024, 512 text
  flux-dev-2048      the same at 2048 x 2048

Per case the unpatched module runs before and after the patched one (its time is the mean of
both medians); each run is one warm-up and then --reps timed calls (CUDA events). The peak is
the caching allocator's peak above what was allocated when the call began (weights, inputs).
streamplan runs its default policy unless --budget is given. The outputs of both are compared
(rel L2 of the streamplan output against the unpatched one, both bf16).

--merge copies peer, peer_ms and peer_peak_bytes (and the package's own figures) into the
matching cases of a benchmarks JSON (docs/benchmarks.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from bench_meter import WAN14B, metered, write_json  # noqa: E402

FLUX_DEV = dict(patch_size=1, in_channels=64, out_channels=None, num_layers=19, num_single_layers=38,
                attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
TEXT = 512
CASES = {
    "wan14b-block-81f": ("wan", 1, (81, 720, 1280)),
    "wan14b-model-81f": ("wan", 40, (81, 720, 1280)),
    "flux-dev-1024": ("flux", None, (1024, 1024)),
    "flux-dev-2048": ("flux", None, (2048, 2048)),
}


def build(case: str, gen: torch.Generator):
    """The module (bf16, on the GPU, seeded random weights) and its call's keyword arguments."""
    import make_reference
    from diffusers import FluxTransformer2DModel, WanTransformer3DModel

    family, layers, geometry = CASES[case]
    with torch.device("cuda"):
        if family == "wan":
            model = WanTransformer3DModel(**WAN14B, num_layers=layers)
            frames, height, width = geometry
            latents = (1, 16, 1 + (frames - 1) // 4, height // 8, width // 8)
            kwargs = dict(hidden_states=torch.randn(latents, generator=gen, device="cuda"),
                          encoder_hidden_states=torch.randn((1, TEXT, 4096), generator=gen, device="cuda"),
                          timestep=torch.tensor([730.0], device="cuda"))
            tokens = latents[2] * (latents[3] // 2) * (latents[4] // 2)
        else:
            model = FluxTransformer2DModel(**FLUX_DEV)
            rows, cols = geometry[0] // 16, geometry[1] // 16
            ids = torch.zeros(rows, cols, 3, device="cuda")
            ids[..., 1] = torch.arange(rows, device="cuda", dtype=torch.float32)[:, None]
            ids[..., 2] = torch.arange(cols, device="cuda", dtype=torch.float32)[None, :]
            kwargs = dict(hidden_states=torch.randn((1, rows * cols, 64), generator=gen, device="cuda"),
                          encoder_hidden_states=torch.randn((1, TEXT, 4096), generator=gen, device="cuda"),
                          pooled_projections=torch.randn((1, 768), generator=gen, device="cuda"),
                          timestep=torch.tensor([0.73], device="cuda"), img_ids=ids.reshape(-1, 3),
                          txt_ids=torch.zeros(TEXT, 3, device="cuda"), guidance=torch.tensor([3.5], device="cuda"))
            tokens = rows * cols
        make_reference.randomize(model, gen)
    # The parameters in bf16; buffers (Wan's RoPE tables) stay as built, as from_pretrained
    # keeps them: tables rounded to bf16 would put an error into the peer that is not its own.
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    model = model.eval()
    kwargs = {k: (v.to(torch.bfloat16) if v.is_floating_point() and k not in ("img_ids", "txt_ids") else v)
              for k, v in kwargs.items()}
    return model, kwargs, tokens


def measure(model: torch.nn.Module, kwargs: dict, reps: int) -> tuple[torch.Tensor, list]:
    with torch.no_grad():
        return metered(model, lambda: model(**kwargs, return_dict=False)[0], reps)


def run_case(case: str, reps: int, budget: str | None) -> dict:
    import streamplan

    t0 = time.time()
    model, kwargs, tokens = build(case, torch.Generator("cuda").manual_seed(0))
    print(f"[bench_peers] {case}: built in {time.time() - t0:.0f} s", file=sys.stderr)
    peer_out, before = measure(model, kwargs, reps)
    handle = streamplan.apply(model, budget=budget)
    try:
        sp_out, sp_calls = measure(model, kwargs, reps)
        plan = handle.to_dict()
        fallbacks = [str(f) for f in handle.fallbacks]
    finally:
        streamplan.remove(model)
    _, after = measure(model, kwargs, reps)
    peer_ms = 0.5 * (statistics.median(c[0] for c in before) + statistics.median(c[0] for c in after))
    err = float((sp_out.double() - peer_out.double()).norm() / peer_out.double().norm())
    del model, kwargs
    torch.cuda.empty_cache()
    return {
        "case": case, "device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": tokens,
        "peer": "diffusers " + ("WanTransformer3DModel" if CASES[case][0] == "wan" else "FluxTransformer2DModel"),
        "peer_ms": peer_ms, "peer_peak_bytes": max(c[1] for c in before + after),
        "package_ms": statistics.median(c[0] for c in sp_calls), "package_peak_bytes": max(c[1] for c in sp_calls),
        "package_estimated_peak_bytes": plan["planned"]["estimated_peak_bytes"], "floor_bytes": plan["floor_bytes"],
        "package_budget": budget, "package_rel_l2_vs_peer": err, "fallbacks": fallbacks,
    }


def merge(peers_path: str, bench_path: str) -> int:
    with open(peers_path) as f:
        peers = {p["case"]: p for p in json.load(f)}
    with open(bench_path) as f:
        bench = json.load(f)
    merged = 0
    for entry in bench:
        if entry.get("kind"):  # residency, format and LoRA rows: other measurements of the case
            continue
        p = peers.get(entry["case"])
        if p is None:
            continue
        for key in ("peer", "peer_ms", "peer_peak_bytes", "package_ms", "package_peak_bytes", "package_rel_l2_vs_peer"):
            entry[key] = p[key]
        merged += 1
    with open(bench_path, "w") as f:
        json.dump(bench, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"merged the peers of {merged} cases into {bench_path}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", default=None, help="streamplan.apply budget (default: none, the lean default)")
    ap.add_argument("--out", help="write the results as JSON")
    ap.add_argument("--merge", nargs=2, metavar=("PEERS_JSON", "BENCH_JSON"), help="merge results and exit")
    a = ap.parse_args()
    if a.merge:
        return merge(*a.merge)

    cases = [c for c in a.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print(f"bench_peers: unknown case(s) {unknown}; known: {list(CASES)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_peers: needs a CUDA device", file=sys.stderr)
        return 1
    results = []
    for case in cases:
        results.append(run_case(case, a.reps, a.budget))
        write_json(a.out, results)  # after every case: a run cut short keeps what it measured
    G = float(1 << 30)
    print(f"{'case':18} {'peer ms':>9} {'pkg ms':>9} {'time':>6} {'peer GiB':>9} {'pkg GiB':>8} {'peak':>6} {'rel L2':>9} fallbacks")
    for r in results:
        print(f"{r['case']:18} {r['peer_ms']:9.1f} {r['package_ms']:9.1f} {r['package_ms'] / r['peer_ms']:6.3f} "
              f"{r['peer_peak_bytes'] / G:9.3f} {r['package_peak_bytes'] / G:8.3f} "
              f"{r['peer_peak_bytes'] / max(r['package_peak_bytes'], 1):6.2f} {r['package_rel_l2_vs_peer']:9.2e} "
              f"{len(r['fallbacks'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
