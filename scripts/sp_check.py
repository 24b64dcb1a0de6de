"""Sequence parallel on several devices: one forward with CFG (a batch of two) of ComfyUI's Wan 2.1
(14B widths; --tiny: test widths), planned by streamplan on 1 rank and on N ranks, one process per
rank (NCCL on CUDA, gloo on the CPU), every rank holding the same random weights and inputs.

Per rank count it reports the median ms per forward (after a warm-up), the speed-up against one
rank, per rank the peak device memory (all of it, and above what the weights and inputs hold:
the activation peak; CUDA only), the plan's estimated activation peak and its exchanges, and the
output's rel L2 against the first rank count's. --shard-weights: on more than one rank the
module stays in host memory and each rank keeps 1/N of every block's weights on its GPU.

    .venv/bin/python scripts/sp_check.py [--tiny] [--layers 40] [--frames 81 --height 720 --width 1280]
        [--ranks 1,2] [--mode ulysses|ring] [--cfg-parallel] [--shard-weights] [--device cuda|cpu] [--reps 2]
        [--out FILE]

Needs ComfyUI's tree (as scripts/comfy_check.py finds it: COMFYUI_PATH, COMFY_SITE). Weights per rank: all
of them (replicated); a CUDA run needs one GPU per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import comfy_check  # noqa: E402  (scripts/)
from comfy_check import torch  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="sp_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="test widths (2 heads of 128) instead of Wan 14B's")
    ap.add_argument("--layers", type=int, default=40, help="blocks (default 40: the whole Wan 14B)")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--height", type=int, default=720)
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--ranks", default="1,2", help="comma-separated rank counts (default 1,2)")
    ap.add_argument("--mode", choices=("ulysses", "ring"), default="ulysses")
    ap.add_argument("--cfg-parallel", action="store_true", help="the two batch elements on two halves of the ranks")
    ap.add_argument("--shard-weights", action="store_true",
                    help="on more than one rank: each keeps 1/N of every block's weights (the module in host memory)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--reps", type=int, default=2, help="timed forwards after the warm-up (default 2)")
    ap.add_argument("--out", help="write the rows as JSON")
    a = ap.parse_args(argv)
    try:
        a.ranks = [int(r) for r in a.ranks.split(",")]
    except ValueError:
        ap.error(f"--ranks: expected comma-separated counts, got '{a.ranks}'")
    if not a.ranks or min(a.ranks) < 1:
        ap.error(f"--ranks: counts must be >= 1, got {a.ranks}")
    if a.device == "cuda" and max(a.ranks) > torch.cuda.device_count():
        ap.error(f"--ranks {max(a.ranks)}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    for name in ("layers", "reps", "frames", "height", "width"):
        if getattr(a, name) < 1:
            ap.error(f"--{name}: must be >= 1, got {getattr(a, name)}")
    if (a.frames - 1) % 4 or a.height % 16 or a.width % 16:
        ap.error(f"--frames/--height/--width: Wan takes 4k+1 frames and sides of multiples of 16, got "
                 f"{a.frames}x{a.height}x{a.width}")
    return a


def _rank(rank: int, world: int, a: argparse.Namespace, work: str) -> None:
    import torch.distributed as dist

    import make_reference
    import streamplan

    cuda = a.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:  # the machine's cores shared out over the ranks
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{work}/store-{world}", rank=rank,
                                world_size=world, device_id=device if cuda else None)
    try:
        comfy = comfy_check.comfy_import(a.device)
        cfg, cls = comfy_check.model_config(comfy, "wan", a.tiny, torch.bfloat16, a.layers)
        model = cls(cfg, device=device)
        make_reference.randomize(model.diffusion_model, torch.Generator(device).manual_seed(0))
        dm = model.diffusion_model.eval()
        shard = a.shard_weights and world > 1
        if shard:  # the module in host memory: the GPU holds the ranks' shares and two block slots
            dm.to("cpu")
            if cuda:
                torch.cuda.empty_cache()
        g = torch.Generator().manual_seed(1)
        latent = (2, 16, (a.frames - 1) // 4 + 1, a.height // 8, a.width // 8)
        x = torch.randn(latent, generator=g).to(device, torch.bfloat16)
        t = torch.tensor([500.0, 500.0], device=device)
        context = torch.randn(2, 512, cfg.unet_config["text_dim"], generator=g).to(device, torch.bfloat16)
        group = dist.group.WORLD if world > 1 else None
        handle = streamplan.apply(dm, process_group=group, sequence_parallel=a.mode,
                                  cfg_parallel=a.cfg_parallel and world > 1, shard_weights=shard,
                                  device=str(device) if shard else None)

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize()
            if group is not None:
                dist.barrier()

        with torch.no_grad():
            sync()
            held = torch.cuda.memory_allocated() if cuda else streamplan._C.cpu_allocated_bytes()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            out = dm(x, t, context)  # the warm-up: plans made, the link probed
            times = []
            for _ in range(a.reps):
                sync()
                t0 = time.perf_counter()
                out = dm(x, t, context)
                sync()
                times.append(time.perf_counter() - t0)
        row = {"ranks": world, "rank": rank, "ms": 1e3 * statistics.median(times), "ms_all": [1e3 * s for s in times],
               "held_bytes": held, "fallbacks": [f.code for f in handle.fallbacks],
               "estimated_peak_bytes": handle.plans[-1]["estimated_peak_bytes"],
               "sharded_bytes": list(handle.sharded_bytes),
               "explain": handle.explain()}
        if cuda:
            row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            row["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
            row["activation_peak_bytes"] = row["peak_allocated_bytes"] - held
        if rank == 0:
            torch.save(out.float().cpu(), os.path.join(work, f"out-{world}.pt"))
        with open(os.path.join(work, f"row-{world}-{rank}.json"), "w") as f:
            json.dump(row, f)
    finally:
        if world > 1:
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch.multiprocessing as mp

    rows = []
    with tempfile.TemporaryDirectory(prefix="sp_check-") as work:
        for world in a.ranks:
            mp.spawn(_rank, args=(world, a, work), nprocs=world, join=True)
            ranks = [json.load(open(os.path.join(work, f"row-{world}-{r}.json"))) for r in range(world)]
            out = torch.load(os.path.join(work, f"out-{world}.pt"))
            ref = torch.load(os.path.join(work, f"out-{a.ranks[0]}.pt"))
            row = {"ranks": world, "mode": a.mode, "cfg_parallel": a.cfg_parallel,
                   "shard_weights": a.shard_weights and world > 1,
                   "ms": max(r["ms"] for r in ranks), "per_rank": ranks,
                   "rel_l2_vs_first": float((out - ref).norm() / ref.norm()),
                   "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
                   "model": f"wan2.1 {'tiny' if a.tiny else '14B'}, {a.layers} layers, {a.frames}x{a.height}x{a.width}, "
                            "bf16, batch 2 (CFG)"}
            row["speedup"] = rows[0]["ms"] / row["ms"] if rows else 1.0
            rows.append(row)
            def gib(key: str) -> str:
                return ", ".join(f"{r[key] / 2**30:.3f}" for r in ranks if key in r) or "-"

            print(f"[sp_check] {world} rank(s): {row['ms']:.1f} ms, {row['speedup']:.2f}x, peak GiB per rank "
                  f"[{gib('peak_allocated_bytes')}], activation peak GiB per rank "
                  f"[{gib('activation_peak_bytes')}] (estimated [{gib('estimated_peak_bytes')}]), rel L2 vs "
                  f"{a.ranks[0]} rank(s) {row['rel_l2_vs_first']:.2e}", file=sys.stderr)
            if a.out:
                with open(a.out, "w") as f:
                    json.dump(rows, f, indent=1)
    print(json.dumps([{k: v for k, v in r.items() if k != "per_rank"} for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
