"""Sequence parallel on several devices: one forward of ComfyUI's Wan 2.1 with CFG (a batch of two;
14B widths) or of ComfyUI's MiniMax H3 (one video + audio element; its widths; --tiny: test widths),
planned by streamplan on 1 rank and on N ranks, one process per rank (NCCL on CUDA, gloo on the
CPU), every rank holding the same random weights and inputs.

Per rank count it reports the median ms per forward (after a warm-up) against the plans'
estimate, the speed-up against one rank, and per rank (CUDA only) the timed forwards' device
memory peak: all of it, and above what they found allocated (the weights, the inputs and what
the warm-up left: caches, workspaces, the last output), the activation peak, beside the plan's
estimate; the largest rank's as ratios of the first rank count's; the warm-up's own peak; the
device memory in use after them (the allocator's reserve, the CUDA context, NCCL's buffers); the
plan's exchanges; and the output's rel L2 against the first rank count's.
--weights replicated,sharded: each rank count above one runs once per arrangement (one rank runs
once); sharded: the module stays in host memory and each rank keeps 1/N of every block's weights
on its GPU. --comm-time: one more forward under the profiler, per rank the time of its NCCL
kernels (which includes waiting for the other ranks). --kernels: likewise, per rank its CUDA kernels'
time and count by kind (attention, GEMMs, copies, NCCL, other). --device-memory SIZE: the module stays in
host memory and each rank's calls hold at most SIZE on its device; the planner arranges the
weights (kept, streamed from host memory, or on more than one rank sharded) and the row says how.

    .venv/bin/python scripts/sp_check.py [--model wan|minimax] [--tiny] [--layers N]
        [--frames F --height H --width W] [--ranks 1,2] [--mode ulysses|ring] [--cfg-parallel]
        [--weights replicated,sharded | --device-memory SIZE] [--device cuda|cpu] [--one-gpu]
        [--consumer NAME] [--kv-budget F] [--budget SIZE] [--split-budget SIZE] [--reps 2] [--comm-time]
        [--kernels] [--vs-comfy] [--solo]
        [--link-rate GB/s] [--out FILE]

--one-gpu puts every rank on cuda:0 and exchanges over gloo (through host memory): what a split
computes with a CUDA-only consumer (int8, sparse), on a machine with one GPU; its times are not
a split's.
--solo runs, per rank count, its first rank (the most rows) alone on the first device, in a
process group of that many ranks whose exchanges complete at once: from each other rank it
receives a copy of what it sends that rank (rows of the model's own kind, so that the kernels
reading them run as on the rows the rank would get), copied on its device. Its rows give a
rank's own work at that count, its time and its peaks, without the link's; its plans price the
link at --link-rate (default 200 GB/s). Its output is not the model's, so it is not compared.

Wan: 40 layers, 81 frames at 1280 x 720 by default. MiniMax H3: 50 blocks, 72 latent frames
(10 s) at 1376 x 768, its audio latent of the same length. Needs ComfyUI's tree (as
scripts/comfy_check.py finds it: COMFYUI_PATH, COMFY_SITE). A CUDA run needs one GPU per rank.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
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
    ap.add_argument("--model", choices=("wan", "minimax"), default="wan")
    ap.add_argument("--tiny", action="store_true", help="test widths (2 heads of 128) instead of the model's")
    ap.add_argument("--layers", type=int, help="blocks (default: the whole model, Wan 14B 40, H3 50)")
    ap.add_argument("--frames", type=int, help="Wan: frames (default 81); H3: latent frames (default 72: 10 s)")
    ap.add_argument("--height", type=int, help="default: Wan 720, H3 768")
    ap.add_argument("--width", type=int, help="default: Wan 1280, H3 1376")
    ap.add_argument("--ranks", default="1,2", help="comma-separated rank counts (default 1,2)")
    ap.add_argument("--mode", choices=("ulysses", "ring"), default="ulysses")
    ap.add_argument("--cfg-parallel", action="store_true", help="the two batch elements on two halves of the ranks")
    ap.add_argument("--weights", default="replicated",
                    help="comma-separated arrangements run on each rank count above one: replicated (every rank holds "
                         "the module on its device), sharded (each keeps 1/N of every block's weights; the module in "
                         "host memory); default replicated")
    ap.add_argument("--comm-time", action="store_true",
                    help="one more forward under the profiler: per rank its NCCL kernels' time (CUDA, NCCL)")
    ap.add_argument("--kernels", action="store_true",
                    help="one more forward under the profiler: per rank its CUDA kernels' time by kind (attention, "
                         "GEMMs, copies, NCCL, other)")
    ap.add_argument("--device-memory", help="per rank, e.g. 40GiB: the weights arranged under it (the module in host "
                    "memory)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--one-gpu", action="store_true",
                    help="every rank on cuda:0, exchanging over gloo: a split's arithmetic on one GPU, not its speed")
    ap.add_argument("--solo", action="store_true",
                    help="per rank count its first rank alone, receiving copies of what it sends: a rank's own time "
                         "and peaks without the link's")
    ap.add_argument("--link-rate", type=float,
                    help="GB/s each rank sends and receives, which the plans price the exchanges at (default: "
                         "measured; with --solo 200)")
    ap.add_argument("--consumer", default="sdpa", help="the attention consumer (default sdpa; int8, sparse: CUDA)")
    ap.add_argument("--budget", help="each rank's activation budget (e.g. 1.3GiB; default: the planner's default policy)")
    ap.add_argument("--split-budget",
                    help="each rank's activation budget at the rank counts above one, instead of --budget (e.g. "
                         "1.25GiB: one rank under the default policy, a split under a share of its memory)")
    ap.add_argument("--kv-budget", type=float, default=1.0, help="with --consumer sparse: the video KV budget")
    ap.add_argument("--reps", type=int, default=2, help="timed forwards after the warm-up (default 2)")
    ap.add_argument("--vs-comfy", action="store_true",
                    help="also ComfyUI's own forward on one device (first rank count's rank 0), each row's rel L2 "
                         "against it")
    ap.add_argument("--out", help="write the rows as JSON")
    a = ap.parse_args(argv)
    wan = a.model == "wan"
    for name, default in (("layers", 40 if wan else 50), ("frames", 81 if wan else 72), ("height", 720 if wan else 768),
                          ("width", 1280 if wan else 1376)):
        if getattr(a, name) is None:
            setattr(a, name, default)
    a.weights = a.weights.split(",")
    if not a.weights or any(w not in ("replicated", "sharded") for w in a.weights) or len(set(a.weights)) < len(a.weights):
        ap.error(f"--weights: expected replicated and/or sharded, comma-separated, got '{','.join(a.weights)}'")
    if "sharded" in a.weights and a.device_memory:
        ap.error("--weights sharded and --device-memory: give one (under --device-memory the planner chooses)")
    if a.comm_time and (a.device != "cuda" or a.one_gpu):
        ap.error("--comm-time: measures NCCL kernels, so needs --device cuda without --one-gpu")
    if a.kernels and a.device != "cuda":
        ap.error("--kernels: measures CUDA kernels, so needs --device cuda")
    if a.solo:
        given = [name for name, on in (("--weights sharded", "sharded" in a.weights), ("--device-memory", a.device_memory),
                                       ("--cfg-parallel", a.cfg_parallel), ("--comm-time", a.comm_time),
                                       ("--vs-comfy", a.vs_comfy), ("--one-gpu", a.one_gpu)) if on]
        if given:  # each needs what the other ranks send: weights, outputs, or the link itself
            ap.error(f"--solo: runs one rank without the others' data, so not with {', '.join(given)}")
    if a.link_rate is not None and not a.link_rate > 0:
        ap.error(f"--link-rate: GB/s, > 0, got {a.link_rate}")
    if a.solo and a.link_rate is None:
        a.link_rate = 200.0  # the planner's own default for a GPU without a measurement
    if a.cfg_parallel and not wan:
        ap.error("--cfg-parallel: the MiniMax H3 call holds one batch element")
    try:
        a.ranks = [int(r) for r in a.ranks.split(",")]
    except ValueError:
        ap.error(f"--ranks: expected comma-separated counts, got '{a.ranks}'")
    if not a.ranks or min(a.ranks) < 1:
        ap.error(f"--ranks: counts must be >= 1, got {a.ranks}")
    if a.one_gpu and a.device != "cuda":
        ap.error("--one-gpu: applies to --device cuda")
    if a.kv_budget != 1.0 and a.consumer != "sparse":
        ap.error(f"--kv-budget {a.kv_budget}: applies to --consumer sparse only")
    if a.device == "cuda" and not (a.one_gpu or a.solo) and max(a.ranks) > torch.cuda.device_count():
        ap.error(f"--ranks {max(a.ranks)}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    for name in ("layers", "reps", "frames", "height", "width"):
        if getattr(a, name) < 1:
            ap.error(f"--{name}: must be >= 1, got {getattr(a, name)}")
    if wan and ((a.frames - 1) % 4 or a.height % 16 or a.width % 16):
        ap.error(f"--frames/--height/--width: Wan takes 4k+1 frames and sides of multiples of 16, got "
                 f"{a.frames}x{a.height}x{a.width}")
    if not wan and (a.height % 32 or a.width % 32):
        ap.error(f"--height/--width: H3 takes sides of multiples of 32 (latent 16, patch 2), got {a.height}x{a.width}")
    return a


def _model(a: argparse.Namespace, device: torch.device, weights_on: torch.device) -> tuple[torch.nn.Module, tuple, dict,
                                                                                          str]:
    """The family's ComfyUI module in bf16 with random weights (drawn on `device`, held on
    `weights_on`), one call's (args, kwargs) on `device`, and what it is."""
    import importlib

    import make_reference

    comfy = comfy_check.comfy_import(a.device)
    g = torch.Generator().manual_seed(1)
    if a.model == "wan":
        cfg, cls = comfy_check.model_config(comfy, "wan", a.tiny, torch.bfloat16, a.layers)
        dm = cls(cfg, device=weights_on).diffusion_model
        latent = (2, 16, (a.frames - 1) // 4 + 1, a.height // 8, a.width // 8)
        x = torch.randn(latent, generator=g).to(device, torch.bfloat16)
        t = torch.tensor([500.0, 500.0], device=device)
        context = torch.randn(2, 512, cfg.unet_config["text_dim"], generator=g).to(device, torch.bfloat16)
        what = (f"wan2.1 {'tiny' if a.tiny else '14B'}, {a.layers} layers, {a.frames}x{a.height}x{a.width}, bf16, "
                "batch 2 (CFG)")
        kwargs = {}
    else:
        import minimax_h3

        cfg = comfy_check.h3_config(a.tiny, a.layers)
        mod, ops = importlib.import_module("comfy.ldm.minimax.model"), importlib.import_module("comfy.ops")
        dm = mod.MiniMaxH3Model(**minimax_h3.comfy_kwargs(cfg), dtype=torch.bfloat16, device=weights_on,
                                operations=ops.disable_weight_init).to(weights_on)
        audio = max(1, round(405 * a.frames / 72))  # the audio latent of the video's length (10 s: 405)
        video = torch.randn(1, cfg.latent_channels, a.frames, a.height // 16, a.width // 16, generator=g)
        x = [video.to(device, torch.bfloat16),
             torch.randn(1, cfg.audio_channels, 2, audio, generator=g).to(device, torch.bfloat16)]
        t = torch.tensor([700.0], device=device)
        context = torch.randn(1, 512, cfg.text_dim, generator=g).to(device, torch.bfloat16)
        what = (f"minimax-h3 {'tiny' if a.tiny else ''}, {a.layers} blocks, {a.frames} latent frames at "
                f"{a.width}x{a.height}, audio {audio}, bf16, batch 1").replace(" ,", ",")
        kwargs = {"transformer_options": {}, "minimax_payload": {}}
    make_reference.randomize(dm, torch.Generator(device).manual_seed(0))
    if a.model == "minimax":  # a buffer, not a parameter: ComfyUI leaves it to the checkpoint
        dm.rope.inv_freq.copy_(minimax_h3.rope_inv_freq(cfg))
    return dm.eval().requires_grad_(False), (x, t, context), kwargs, what


def _budget(a: argparse.Namespace, world: int) -> str | None:
    """Each rank's activation budget at `world` ranks: --split-budget above one rank, else --budget."""
    return a.split_budget if world > 1 and a.split_budget else a.budget


def _flat(out) -> torch.Tensor:
    """A forward's output as one fp32 tensor on the CPU (H3's video and audio one after another)."""
    if isinstance(out, (list, tuple)):
        return torch.cat([o.float().flatten().cpu() for o in out])
    return out.float().cpu()


def _rank(rank: int, world: int, weights: str, a: argparse.Namespace, work: str) -> None:
    import torch.distributed as dist

    import streamplan

    cuda = a.device == "cuda"
    device = torch.device("cuda", 0 if a.one_gpu or a.solo else rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:  # the machine's cores shared out over the ranks
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if world > 1 and a.solo:
        _solo_group(world)
    elif world > 1:
        nccl = cuda and not a.one_gpu
        # A rank waiting longer than any step here takes (building the model, one forward) is a hang:
        # it fails after 5 minutes instead of the default 10.
        dist.init_process_group("nccl" if nccl else "gloo", init_method=f"file://{work}/store-{world}-{weights}",
                                rank=rank, world_size=world, device_id=device if nccl else None,
                                timeout=datetime.timedelta(seconds=300))
    try:
        shard = weights == "sharded" and world > 1
        host = shard or bool(a.device_memory)  # the module in host memory: the GPU holds what the plan arranges
        comfy_first = a.vs_comfy and world == a.ranks[0] and rank == 0  # ComfyUI's forward, before it is attached
        dm, args, kwargs, what = _model(a, device, torch.device("cpu") if host and not comfy_first else device)

        def forward():
            fresh = {k: dict(v) for k, v in kwargs.items()}  # ComfyUI writes into them
            return dm(*args, **fresh)

        if comfy_first:
            with torch.no_grad():
                torch.save(_flat(forward()), os.path.join(work, "comfy.pt"))
            if host:
                dm.to("cpu")
            if cuda:
                torch.cuda.empty_cache()
        group = dist.group.WORLD if world > 1 else None
        handle = streamplan.apply(dm, process_group=group, sequence_parallel=a.mode, budget=_budget(a, world),
                                  cfg_parallel=a.cfg_parallel and world > 1,
                                  shard_weights=shard if world > 1 and not a.device_memory else None,
                                  device_memory=a.device_memory, device=str(device) if host else None,
                                  consumer=a.consumer, **({"kv_budget": a.kv_budget} if a.consumer == "sparse" else {}),
                                  link_rate=a.link_rate * 1e9 if a.link_rate and world > 1 else None)

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize()
            if group is not None:
                dist.barrier()

        def allocated() -> int:
            return torch.cuda.memory_allocated() if cuda else streamplan._C.cpu_allocated_bytes()

        mem = {}
        with torch.no_grad():
            sync()
            before = allocated()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            out = forward()  # the warm-up: plans made, the link probed, workspaces and caches allocated
            sync()
            held = allocated()
            if cuda:
                mem["warmup_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            times = []
            for _ in range(a.reps):
                sync()
                t0 = time.perf_counter()
                out = forward()
                sync()
                times.append(time.perf_counter() - t0)
            if cuda:  # the timed forwards: their high-water mark, and above what they found allocated
                mem["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
                mem["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
                mem["activation_peak_bytes"] = mem["peak_allocated_bytes"] - held
                free, total = torch.cuda.mem_get_info()  # beside the allocator's: the context, NCCL's buffers
                mem["device_used_bytes"] = total - free
            profiled = a.kernels or (a.comm_time and world > 1)
            kernel_ms = _kernel_ms(forward, sync) if profiled else None
            comm_ms = (kernel_ms if isinstance(kernel_ms, str) else kernel_ms["nccl"]["ms"]) \
                if a.comm_time and world > 1 else None
        forwards = 1 + a.reps + profiled  # the plans' calls: every forward made
        row = {"ranks": world, "rank": rank, "ms": 1e3 * statistics.median(times), "ms_all": [1e3 * s for s in times],
               "before_bytes": before, "held_bytes": held, "fallbacks": [f.code for f in handle.fallbacks],
               "estimated_peak_bytes": handle.plans[-1]["estimated_peak_bytes"],
               "estimated_ms": sum(p["estimated_ms"] * p["calls"] for p in handle.plans) / forwards,
               "nccl_ms": comm_ms, "kernel_ms": kernel_ms if a.kernels else None,
               "sharded_bytes": list(handle.sharded_bytes), "residency": handle.residency, "model": what,
               "explain": handle.explain(), **mem}
        if rank == 0:
            torch.save(_flat(out), os.path.join(work, f"out-{world}-{weights}.pt"))
        with open(os.path.join(work, f"row-{world}-{weights}-{rank}.json"), "w") as f:
            json.dump(row, f)
    finally:
        if world > 1:
            dist.destroy_process_group()


def _solo_group(world: int) -> None:
    """The default process group: `world` ranks of which this process is rank 0, alone. Each
    all-to-all completes at once, the part from each other rank a copy of the part sent to it
    (repeated where it is shorter); reductions, broadcasts and barriers leave their tensors as
    they are."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import _create_work_from_future

    def done(result):
        fut = torch.futures.Future()
        fut.set_result(result)
        return _create_work_from_future(fut)

    class Solo(dist.ProcessGroup):
        def getBackendName(self) -> str:  # noqa: N802  (c10d's name)
            return "solo"

        def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
            out, src = output.view(-1), input.reshape(-1)
            got = list(output_split_sizes) or [out.numel() // world] * world
            sent = list(input_split_sizes) or [src.numel() // world] * world
            at, start = 0, 0
            for n, m in zip(got, sent):
                if n and src.numel():
                    piece = src[start:start + n] if start + n <= src.numel() else \
                        src.repeat(-(-(start + n) // src.numel()))[start:start + n]
                    out[at:at + n].copy_(piece)
                at, start = at + n, start + m
            return done([output])

        def allreduce(self, tensors, opts=None):
            return done(tensors)

        def broadcast(self, tensors, opts=None):
            return done(tensors)

        def barrier(self, opts=None):
            return done([])

    dist.Backend.register_backend("solo", lambda store, rank, size, timeout: Solo(rank, size), devices=["cpu", "cuda"])
    dist.init_process_group("solo", store=dist.HashStore(), rank=0, world_size=world)


# Kernel kinds by name, the first that matches: NCCL's, attention's (flash, cuDNN's SDPA, the
# int8 and sparse consumers'), matmuls', copies (ATen's copy and cat kernels, memcpy).
_KINDS = (("nccl", re.compile(r"nccl", re.I)),
          ("attention", re.compile(r"fmha|flash|attn|attention|sdpa", re.I)),
          ("gemm", re.compile(r"gemm|nvjet|xmma|cutlass|matmul|s16816|wgmma", re.I)),
          ("copy", re.compile(r"copy|memcpy|memset|cat_?array", re.I)))


def kernel_kind(name: str) -> str:
    """A CUDA kernel's kind by its name: the first of _KINDS that matches, else "other"."""
    return next((k for k, pat in _KINDS if pat.search(name)), "other")


def _kernel_ms(forward, sync) -> dict | str:
    """One forward under the profiler: its CUDA kernels' own time in ms and their count by kind
    (_KINDS, else "other"; NCCL's include waiting for the other ranks), or why it was not measured."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            forward()
            sync()
        kinds = {k: {"ms": 0.0, "launches": 0} for k, _ in _KINDS + (("other", None),)}
        for e in prof.key_averages():
            # kernels and copies on the device; a record_function's range there spans its kernels
            if (e.self_device_time_total <= 0 or e.device_type != torch.autograd.DeviceType.CUDA
                    or e.is_user_annotation):
                continue
            kind = kernel_kind(e.key)
            kinds[kind]["ms"] += e.self_device_time_total / 1e3
            kinds[kind]["launches"] += e.count
        return kinds
    except Exception as e:  # the row keeps its other figures
        return f"not measured: {e!r}"


def _runs(a: argparse.Namespace) -> list[tuple[int, str]]:
    """(rank count, weights) in the order they run: one rank once, each larger count per arrangement
    (under --device-memory the planner's)."""
    if a.device_memory:
        return [(w, "planned") for w in a.ranks]
    return [(w, arr) for w in a.ranks for arr in (a.weights if w > 1 else ["replicated"])]


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch.multiprocessing as mp

    rows, runs = [], _runs(a)
    first = runs[0]  # the rank count and weights every row is compared with
    with tempfile.TemporaryDirectory(prefix="sp_check-") as work:
        for world, weights in runs:
            started = 1 if a.solo else world  # --solo: the first rank alone
            mp.spawn(_rank, args=(world, weights, a, work), nprocs=started, join=True)
            ranks = [json.load(open(os.path.join(work, f"row-{world}-{weights}-{r}.json"))) for r in range(started)]
            out = torch.load(os.path.join(work, f"out-{world}-{weights}.pt"))
            ref = torch.load(os.path.join(work, f"out-{first[0]}-{first[1]}.pt"))
            row = {"ranks": world, "weights": weights, "mode": a.mode, "cfg_parallel": a.cfg_parallel,
                   "consumer": a.consumer, "kv_budget": a.kv_budget, "budget": _budget(a, world), "one_gpu": a.one_gpu,
                   "solo": a.solo,
                   "device_memory": a.device_memory, "ms": max(r["ms"] for r in ranks),
                   "estimated_ms": max(r["estimated_ms"] for r in ranks), "per_rank": ranks,
                   # a solo rank's output holds rows it never received
                   "rel_l2_vs_first": None if a.solo and world > 1 else float((out - ref).norm() / ref.norm()),
                   "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
                   "model": ranks[0]["model"]}
            if a.vs_comfy:
                comfy_out = torch.load(os.path.join(work, "comfy.pt"))
                row["rel_l2_vs_comfy"] = float((out - comfy_out).norm() / comfy_out.norm())
            row["speedup"] = rows[0]["ms"] / row["ms"] if rows else 1.0
            for key in ("peak_allocated_bytes", "activation_peak_bytes"):  # the largest rank's against one rank's
                if key in ranks[0]:
                    row[key] = max(r[key] for r in ranks)
                    row[key.replace("_bytes", "_ratio")] = row[key] / rows[0][key] if rows else 1.0
            rows.append(row)

            def gib(key: str) -> str:
                return ", ".join(f"{r[key] / 2**30:.3f}" for r in ranks if key in r) or "-"

            ratios = (f" (x{row['peak_allocated_ratio']:.2f} and x{row['activation_peak_ratio']:.2f} of "
                      f"{first[0]} rank(s))" if "peak_allocated_ratio" in row else "")
            comm = [r["nccl_ms"] for r in ranks if r["nccl_ms"] is not None]
            comm = [f"{c:.1f}" if isinstance(c, float) else c for c in comm]
            print(f"[sp_check] {world} rank(s), {weights}: {row['ms']:.1f} ms (estimated {row['estimated_ms']:.1f}), "
                  f"{row['speedup']:.2f}x, peak GiB per rank [{gib('peak_allocated_bytes')}] (device memory in use "
                  f"[{gib('device_used_bytes')}]), activation peak GiB per "
                  f"rank [{gib('activation_peak_bytes')}] (estimated [{gib('estimated_peak_bytes')}]){ratios}, "
                  + (f"NCCL kernel ms per rank [{', '.join(comm)}], " if comm else "")
                  + (f"rel L2 vs {first[0]} rank(s) {row['rel_l2_vs_first']:.2e}" if row["rel_l2_vs_first"] is not None
                     else "alone (each exchange copied what it sent), output not compared")
                  + (f", vs ComfyUI's own forward {row['rel_l2_vs_comfy']:.2e}" if a.vs_comfy else ""), file=sys.stderr)
            for r in ranks:
                k = r.get("kernel_ms")
                if k:
                    print(f"[sp_check]   rank {r['rank']} kernels: " + (k if isinstance(k, str) else ", ".join(
                        f"{kind} {v['ms']:.1f} ms ({v['launches']})" for kind, v in k.items() if v["launches"])
                        + f"; {sum(v['ms'] for v in k.values()):.1f} ms in all"), file=sys.stderr)
            for line in ranks[0]["explain"].splitlines():
                if line.lstrip().startswith(("sequence parallel:", "weights:")):
                    print(f"[sp_check]   {line.strip()}", file=sys.stderr)
            if a.out:
                with open(a.out, "w") as f:
                    json.dump(rows, f, indent=1)
    print(json.dumps([{k: v for k, v in r.items() if k != "per_rank"} for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
