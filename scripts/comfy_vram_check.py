#!/usr/bin/env python3
"""Whole models on an emulated small GPU: ComfyUI's own sampling, one process per configuration.

The model's random weights are saved in ComfyUI's layout (bf16), written as a comfy_quant fp8
checkpoint by `streamplan convert` (--cli) and loaded by ComfyUI's own loader
(tests/reference/comfy_formats.py), then sampled with comfy.sample.sample (CFG 5, --sampler,
--steps) in four configurations, each in a process of its own:

  a  ComfyUI alone under the cap (its estimate-based loading: what fits on the device, the rest
     cast layer by layer from host memory); an out-of-memory error is a row
  b  ComfyUI + the Streamplan Memory Planner (dense attention) under the cap
  c  ComfyUI + the planner + Streamplan Sparse Attention (KV 0.3, the first and last 2 steps 0.5)
     under the cap
  d  ComfyUI alone without the cap: the reference time and output
  e  (on request) ComfyUI alone without the cap in fp32, on the weights ComfyUI dequantized: how
     far ComfyUI's own reduced precision takes (d) from fp32 (d's rel L2 against e)
  f  (on request) ComfyUI alone without the cap, its initial noise perturbed by 1e-3 of its size
     (another Gaussian draw; about one bf16 rounding): how far (d) moves when anything before or
     inside it rounds otherwise (f's rel L2 against d; with fp8 activations a rounding that
     flips decides many later ones)

  wan      Wan 2.1 14B (--layers, default all 40), 81 frames at 1280 x 720
  minimax  MiniMax H3 (--layers, default all 50, and its text refiner), 10 s at 1376 x 768

The cap emulates a card of --cap-gib: before ComfyUI starts, the device memory beyond the cap
is taken by one allocation outside torch's caching allocator (cudaMalloc), so that what ComfyUI's
model management reads as free and total-less-used (cudaMemGetInfo) is what such a card has; its
reserve is a 12 GB card's (--reserve-vram 400 MiB); and the caching allocator may hold at most
the cap (torch.cuda.set_per_process_memory_fraction), so exceeding it is an out-of-memory error.
The peaks are the caching allocator's (the ballast allocation is not in them). A script does not
start ComfyUI's DynamicVRAM (comfy-aimdo; main.py does): the configurations run its
estimate-based loading, which the planner cooperates with. That loading pins the weights it
leaves in host memory up to ComfyUI's pinned-memory limit, which ComfyUI computes from the RAM
the system reports when it starts; on a machine whose memory grows as it is used (a VM) that is
not the machine's RAM, and --pinned-limit-gib sets the limit instead. The rows record the
reported RAM, the limit, and the model's pinned and pageable bytes in host memory at the end.

Per configuration: the time of each sampling step (from ComfyUI's pre_run, once it loaded the
model, to each of the sampler's callbacks, after a device synchronization; s/step is the mean
after the first, which also warms up kernels and, with the node, plans: the first is printed
beside it), the peak of the process's caching allocator (reserved and allocated), the output's
rel L2 against (d) and (e), and for b and c the planner's status text. The device's rates are
probed (`streamplan probe`, cached) before the first configuration.

    .venv/bin/python scripts/comfy_vram_check.py --model wan [--layers 40] [--cap-gib 12] [--out FILE]
    .venv/bin/python scripts/comfy_vram_check.py --model wan --tiny --device cpu   # the mechanics, on the CPU
    .venv/bin/python scripts/comfy_vram_check.py --model minimax --source-dir /dev/shm --prepare  # the checkpoint only

It needs what scripts/comfy_check.py needs (torch, streamplan, a ComfyUI tree, build/streamplan).
The checkpoints are kept in --work (default .deps/vram-check) and written once.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import comfy_check  # noqa: E402  (scripts/)
from comfy_check import torch  # noqa: E402

CONFIGS = {"a": "ComfyUI alone, capped", "b": "ComfyUI + the planner, dense, capped",
           "c": "ComfyUI + the planner, sparse 0.3, capped", "d": "ComfyUI alone, uncapped",
           "e": "ComfyUI alone, uncapped, fp32 (dequantized)",
           "f": "ComfyUI alone, uncapped, noise perturbed 1e-3"}
LAYERS = {"wan": 40, "minimax": 0}  # 0: the model's own count
GiB = float(1 << 30)


PROG = "comfy_vram_check"


def fail(message: str) -> NoReturn:
    comfy_check.fail(message, PROG)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = comfy_check._Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, choices=("wan", "minimax"))
    ap.add_argument("--layers", type=int, help="blocks (default: all: Wan 40, MiniMax H3 50)")
    ap.add_argument("--configs", default="d,a,b,c", help="comma-separated, of a, b, c, d, e, f (default: d,a,b,c)")
    ap.add_argument("--cap-gib", type=float, default=12.0, help="the emulated card's memory in GiB (default 12)")
    ap.add_argument("--steps", type=int, default=4, help="sampling steps (default 4)")
    ap.add_argument("--sampler", default="euler", choices=("euler", "res_multistep"))
    ap.add_argument("--tiny", action="store_true", help="test widths (the mechanics; with --device cpu)")
    ap.add_argument("--device", default="auto", help="cuda, cuda:N, cpu or auto")
    ap.add_argument("--cli", default=os.environ.get("STREAMPLAN_BIN", os.path.join(ROOT, "build", "streamplan")),
                    help="the streamplan command that writes the fp8 checkpoint")
    ap.add_argument("--comfyui", metavar="PATH", help="ComfyUI source tree (as comfy_check)")
    ap.add_argument("--work", default=os.path.join(ROOT, ".deps", "vram-check"), help="checkpoints and outputs")
    ap.add_argument("--source-dir", metavar="DIR",
                    help="MiniMax H3: where its bf16 source is written before conversion (default --work; "
                         "/dev/shm keeps the 66 GB of the whole model off the disk)")
    ap.add_argument("--out", metavar="FILE", help="write the rows as JSON")
    ap.add_argument("--pinned-limit-gib", type=float, metavar="GIB",
                    help="ComfyUI's pinned-memory limit (model_management.MAX_PINNED_MEMORY) in GiB, where the RAM "
                         "the system reports when ComfyUI starts is not the machine's (a VM whose memory grows as "
                         "it is used); default: ComfyUI's own, from the reported RAM")
    ap.add_argument("--prepare", action="store_true",
                    help="write the fp8 checkpoint into --work where it is missing, and stop (no sampling)")
    ap.add_argument("--run-config", choices=tuple(CONFIGS), help=argparse.SUPPRESS)  # one configuration, here
    a = ap.parse_args(argv)
    configs = a.configs.split(",")
    if not a.configs or any(c not in CONFIGS for c in configs):
        ap.error(f"--configs: expected a comma-separated list of {', '.join(CONFIGS)}, got '{a.configs}'")
    a.configs = list(dict.fromkeys(configs))
    if a.layers is None:
        a.layers = 2 if a.tiny else LAYERS[a.model]
    if a.layers < 0:
        ap.error(f"--layers: expected a count >= 1 (or 0: all), got {a.layers}")
    if a.steps < 1:
        ap.error(f"--steps: must be >= 1, got {a.steps}")
    if a.cap_gib <= 0:
        ap.error(f"--cap-gib: must be > 0, got {a.cap_gib}")
    if not os.access(a.cli, os.X_OK):
        ap.error(f"--cli {a.cli}: no streamplan command there (scripts/setup.sh builds build/streamplan)")
    if a.out:
        folder = os.path.dirname(os.path.abspath(a.out))
        if os.path.isdir(a.out) or not os.access(folder, os.W_OK):
            ap.error(f"--out {a.out}: cannot write there")
    return a


def tag(a: argparse.Namespace) -> str:
    return f"{a.model}{'-tiny' if a.tiny else ''}-{a.layers or 'all'}-{a.sampler}-{a.steps}"


def checkpoint(a: argparse.Namespace, comfy) -> Path:
    """The fp8 checkpoint, written once by `streamplan convert --to fp8` from random weights: at
    test widths ComfyUI's detection reads back (--tiny), the test models'; Wan 14B drawn on the
    device in bf16 (ComfyUI's WanModel); MiniMax H3 by `streamplan make-checkpoint` (bf16, written
    as it is drawn: 66 GB for the whole model) into --source-dir, removed once converted."""
    import comfy_formats

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    if a.tiny or a.model == "wan":
        dtype = torch.float32 if a.tiny else torch.bfloat16
        if not a.tiny:
            params = WAN_REST + WAN_BLOCK * a.layers
            fits(work, "the bf16 source and its fp8 conversion", 3 * params,
                 work.glob(f"wan-{a.layers}-bfloat16*.safetensors"))
        src = comfy_check.source_checkpoint(comfy, a.model, a.tiny, work, a.layers, dtype, a.device)
        return comfy_formats.convert(Path(a.cli), src, "fp8")
    out = work / f"minimax-{a.layers or 'all'}.fp8.safetensors"
    if out.exists():
        return out
    src = Path(a.source_dir or a.work) / f"minimax-{a.layers or 'all'}.bf16.safetensors"
    import minimax_h3

    params = sum(math.prod(s) for s in minimax_h3.tensor_shapes(comfy_check.h3_config(False, a.layers)).values())
    fits(src.parent, "the bf16 source", 2 * params + (params if src.parent == work else 0), [])
    fits(work, "the fp8 conversion", params + (2 * params if src.parent == work else 0), [])
    make = [a.cli, "make-checkpoint", "--family", "minimax-h3", "--dtype", "bf16", "--seed", "0", "--quiet",
            "--out", str(src)] + (["--layers", str(a.layers)] if a.layers else [])
    convert = [a.cli, "convert", *comfy_formats.FORMATS["fp8"].convert, str(src), str(out)]
    try:
        for cmd in (make, convert):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                fail(f"{' '.join(cmd)}: {r.stderr.strip()}")
    finally:
        src.unlink(missing_ok=True)
    return out


# Wan 2.1 14B's parameters: per block (self and cross attention, FFN, norms, modulation) and the rest.
WAN_BLOCK, WAN_REST = 351_000_000, 232_000_000


def fits(folder: Path, what: str, need: int, present) -> None:
    """An error before long work when `folder` has less free space than `need` bytes (files of
    `present` count as written already)."""
    folder.mkdir(parents=True, exist_ok=True)
    have = shutil.disk_usage(folder).free + sum(p.stat().st_size for p in present)
    if have < need:
        fail(f"{folder}: {what} need about {need / GiB:.1f} GiB, {have / GiB:.1f} GiB are free there")


def ballast(device, cap: int) -> int:
    """Takes the device memory beyond `cap` with one cudaMalloc outside torch's caching
    allocator, for the rest of the process; its bytes."""
    import ctypes

    torch.cuda.init()
    with torch.cuda.device(device):
        torch.empty(1, device=device)  # the context: the card's memory holds it too
        size = torch.cuda.mem_get_info(device)[1] - cap
        for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
            try:
                rt = ctypes.CDLL(name)
                break
            except OSError:
                rt = None
        if rt is None:
            fail("cannot load the CUDA runtime (libcudart) to take the memory beyond the cap")
        ptr = ctypes.c_void_p()
        err = rt.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(max(size, 0)))
        if err != 0:
            fail(f"cudaMalloc of {size} bytes beyond the {cap} bytes cap failed (error {err})")
        BALLAST.append(ptr)
        return size


BALLAST: list = []  # held for the process's life


def comfy_path(a: argparse.Namespace) -> None:
    """ComfyUI's tree and its dependencies' folder (COMFY_SITE) on sys.path."""
    tree = comfy_check.comfy_tree(a.comfyui)
    for p in (os.environ.get("COMFY_SITE", os.path.join(ROOT, ".deps", "comfy-site")), tree):
        if os.path.isdir(p) and p not in sys.path:
            sys.path.insert(0, p)


def run_config(a: argparse.Namespace) -> dict:
    """One configuration in this process: its row."""
    cuda = a.device.startswith("cuda")
    capped = a.run_config in ("a", "b", "c") and cuda
    comfy_path(a)
    import comfy.cli_args

    total = torch.cuda.get_device_properties(torch.device(a.device)).total_memory if cuda else 0
    cap = int(a.cap_gib * GiB)
    if capped:  # before model management reads the device
        comfy.cli_args.args.reserve_vram = 400 / 1024  # a 12 GB card's default reserve, in GiB
        ballast(torch.device(a.device), cap)
    comfy = comfy_check.comfy_import(a.device, a.comfyui)
    import comfy_formats

    from streamplan import comfy_nodes

    if capped:
        torch.cuda.set_per_process_memory_fraction(cap / total)
    import comfy.model_management as mm
    import psutil

    if a.pinned_limit_gib is not None:
        mm.MAX_PINNED_MEMORY = int(a.pinned_limit_gib * GiB)
    path = checkpoint(a, comfy)
    t0 = time.time()
    patcher = comfy_formats.load(comfy, path, comfy_formats.FORMATS["fp8"].load_dtype())
    if a.run_config == "e":
        patcher = comfy_formats.load(comfy, path, torch.float32, comfy_formats.dequantized_state_dict(patcher))
    load_s = time.time() - t0
    wrapper = None
    if a.run_config in ("b", "c"):
        patcher, _ = comfy_nodes.StreamplanMemoryPlanner().patch(patcher, "none", "comfy", False)
        if a.run_config == "c":
            patcher, _ = comfy_nodes.StreamplanSparseAttention().patch(patcher, 0.3, "auto")
        wrapper = comfy_nodes.planner_of(patcher)
    g = torch.Generator().manual_seed(2)
    if a.model == "minimax":
        noise = comfy_check.h3_latent(comfy, a.tiny, 1)
        latent = comfy.nested_tensor.NestedTensor([t * 0.0 for t in noise.unbind()])
        ctx = comfy_check.h3_config(a.tiny, a.layers).text_dim
    else:
        shape = (1, 16, 3, 8, 12) if a.tiny else (1, 16, 21, 90, 160)
        noise = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        latent = noise * 0.0
        ctx = 4096
    if a.run_config == "f":
        p = torch.Generator().manual_seed(3)
        bump = lambda t: t + 1e-3 * torch.randn(t.shape, generator=p, dtype=t.dtype)  # noqa: E731
        noise = (comfy.nested_tensor.NestedTensor([bump(t) for t in noise.unbind()]) if a.model == "minimax"
                 else bump(noise))
    positive = [[torch.randn(1, 512, ctx, generator=g), {}]]
    negative = [[torch.randn(1, 512, ctx, generator=g), {}]]
    marks: list[float] = []  # the steps' ends, after the start of the first (ComfyUI's pre_run, once loaded)

    def step(*_args) -> None:
        if cuda:
            torch.cuda.synchronize()
        marks.append(time.time())

    import comfy.patcher_extension as ext

    patcher.add_callback(ext.CallbacksMP.ON_PRE_RUN, step)

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    row = {"model": a.model, "layers": a.layers, "config": a.run_config, "what": CONFIGS[a.run_config],
           "cap_gib": a.cap_gib if capped else None, "steps": a.steps, "sampler": a.sampler,
           "device": torch.cuda.get_device_name() if cuda else "cpu", "checkpoint": path.name,
           "checkpoint_bytes": path.stat().st_size, "load_s": load_s, "host_ram_bytes": psutil.virtual_memory().total,
           "comfy_max_pinned_bytes": int(mm.MAX_PINNED_MEMORY)}
    start = time.time()
    try:
        out = comfy.sample.sample(patcher, noise, a.steps, 5.0, a.sampler, "simple", positive, negative, latent,
                                  disable_pbar=True, seed=4, callback=step)
        if cuda:
            torch.cuda.synchronize()
        torch.save(comfy_check.flat(out).cpu(), Path(a.work) / f"{tag(a)}-{a.run_config}.pt")
        row["oom"] = None
    except torch.OutOfMemoryError as e:
        row["oom"] = str(e).splitlines()[0][:300]
    times = [b - a_ for a_, b in zip(marks, marks[1:])]
    row.update(sample_s=time.time() - start, prepare_s=marks[0] - start if marks else None, step_s=times,
               peak_reserved_bytes=torch.cuda.max_memory_reserved() if cuda else None,
               peak_allocated_bytes=torch.cuda.max_memory_allocated() if cuda else None)
    # The model's weights in host memory at the end: (pinned, pageable) bytes.
    row["host_pinned_bytes"], row["host_pageable_bytes"] = comfy_nodes.host_bytes(patcher.model.diffusion_model)
    if wrapper is not None:
        row["status"] = wrapper.status()
        hs = list(wrapper.handles.values())
        row["planned_calls"], row["calls"] = sum(h.planned_calls for h in hs), sum(h.calls for h in hs)
    return row


def main() -> int:
    a = parse_args()
    if torch is None:
        fail(f"needs torch, which {sys.executable} cannot import; {comfy_check.VENV_HINT}")
    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {a.device}: torch sees no CUDA device here; use --device cpu with --tiny")
    if a.run_config:
        print("ROW " + json.dumps(run_config(a)), flush=True)
        return 0
    if a.prepare:
        comfy_path(a)
        t0 = time.time()
        path = checkpoint(a, comfy_check.comfy_import(a.device, a.comfyui))
        print(f"{path} ({path.stat().st_size / GiB:.1f} GiB, {time.time() - t0:.0f} s)")
        return 0
    rows = []
    if a.device.startswith("cuda"):  # the device's rates, measured once and cached, outside every timing
        subprocess.run([a.cli, "probe", "--device", a.device], stdout=subprocess.DEVNULL, check=False)
    for c in a.configs:
        (Path(a.work) / f"{tag(a)}-{c}.pt").unlink(missing_ok=True)
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--run-config", c]
        print(f"[comfy_vram_check] {tag(a)} {c}: {CONFIGS[c]}", file=sys.stderr, flush=True)
        r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        found = [line[4:] for line in r.stdout.splitlines() if line.startswith("ROW ")]
        if r.returncode != 0 or not found:
            rows.append({"model": a.model, "layers": a.layers, "config": c, "what": CONFIGS[c],
                         "failed": f"exit status {r.returncode}"})
            continue
        rows.append(json.loads(found[-1]))
        if a.out:  # as it goes: a run cut short keeps what finished
            with open(a.out, "w") as f:
                json.dump(rows, f, indent=1)
    def output(config: str):
        path = Path(a.work) / f"{tag(a)}-{config}.pt"
        return torch.load(path) if path.exists() else None  # this run's, or an earlier one's alike

    # Against (d), (e) fp32 and (f): ComfyUI's own output under a perturbed noise, the distance
    # any other rounding of the same sampling lands at.
    ref, fp32, moved = output("d"), output("e"), output("f")
    for r in rows:
        got = None if r.get("oom") or r.get("failed") else output(r["config"])
        r["rel_l2_vs_d"] = comfy_check.rel(got, ref)
        r["rel_l2_vs_e"] = comfy_check.rel(got, fp32)
        r["rel_l2_vs_f"] = comfy_check.rel(got, moved)
        if r.get("status"):
            print(f"[comfy_vram_check] {r['config']} status:\n{r['status']}", file=sys.stderr)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{'cfg':3} {'what':44} {'s/step':>8} {'first s':>8} {'reserved GiB':>12} {'allocated GiB':>13} "
          f"{'rel L2 vs d':>11} {'vs e (fp32)':>11} {'vs f':>9} planned")
    for r in rows:
        if r.get("failed"):
            print(f"{r['config']:3} {r['what']:44} failed: {r['failed']}")
            continue
        steps = r["step_s"]
        later = steps[1:] or steps  # the first step also warms up kernels (and plans, with the node)
        per = f"{sum(later) / len(later):8.2f}" if steps else "-".rjust(8)
        first = f"{steps[0]:8.2f}" if steps else "-".rjust(8)
        res = "-" if r["peak_reserved_bytes"] is None else f"{r['peak_reserved_bytes'] / GiB:.2f}"
        alloc = "-" if r["peak_allocated_bytes"] is None else f"{r['peak_allocated_bytes'] / GiB:.2f}"
        err = "-" if r["rel_l2_vs_d"] is None else f"{r['rel_l2_vs_d']:.2e}"
        err32 = "-" if r["rel_l2_vs_e"] is None else f"{r['rel_l2_vs_e']:.2e}"
        errf = "-" if r["rel_l2_vs_f"] is None else f"{r['rel_l2_vs_f']:.2e}"
        planned = f"{r['planned_calls']}/{r['calls']}" if "calls" in r else "-"
        print(f"{r['config']:3} {r['what']:44} {per} {first} {res:>12} {alloc:>13} {err:>11} {err32:>11} {errf:>9} {planned}"
              + (f"  out of memory: {r['oom'][:80]}" if r.get("oom") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
