#!/usr/bin/env python3
"""A long session through `streamplan.apply` on a GPU: 1,000 consecutive calls of
diffusers' Wan transformer on random geometries; the memory must stay flat and the plan cache
bounded. tests/python/test_soak.py is the CPU version (300 calls of a tiny module).

diffusers' WanTransformer3DModel at Wan 2.1 14B's widths with 2 layers and seeded random bf16
weights (tests/reference/make_reference.py's randomization). Each call draws (--seed) a latent
frame count (1..6 at 480x832: latents 60 x 104, 1,560 to 9,360 tokens a video), a batch of 1 or
2 (CFG) and a text length (512 down to 192 tokens). A plan's geometry is its tokens per video
and text length (the batch elements run one by one), so 6 x 6 = 36 geometries: more than the
plan cache holds (streamplan.PLAN_CACHE_SIZE, 32), which therefore evicts. A call's inputs are
made just before it and dropped after it.

    python3 scripts/soak_package.py --out OUT/soak.json
    python3 scripts/soak_package.py --calls 300 --frames-choices 1,3,5,7 --height 720 --width 1280
    python3 scripts/soak_package.py --device cpu --tiny --calls 60 --check-every 20   (smoke test)

A warm-up call at the largest geometry (planned, then the module's own forward) comes first;
then the baseline: what is allocated and reserved with the weights in place. After each call,
synchronized: the allocated and reserved bytes above the baseline, the call's peak above it
(max_memory_allocated: inputs, activations, output), its wall time and the plans cached. The
first call and every --check-every calls, the module's own forward (the class's forward, called
past the handle, whose plans stay as they are) on the same inputs is the reference of the
call's output (rel L2). On the GPU it runs in a private pool of the caching allocator
(torch.cuda.MemPool), left out of the allocated and reserved bytes, so that its memory neither
counts in nor mixes with the planned calls'. With --device cpu the memory is what streamplan's
counting CPU allocator holds (streamplan._C.cpu_allocated_bytes(); no reserved bytes or peak);
--tiny takes the tests' tiny widths (make_reference.WAN_CONFIG) and a tiny geometry.

Fails (exit status 1, the JSON written all the same) where a call leaves allocated bytes
behind (none may stay), the reserved bytes grow past call 100's by more than
--reserved-slack-mib, the cache holds more than PLAN_CACHE_SIZE plans, a call runs unplanned
(handle.fallbacks) or a check's rel L2 exceeds --max-error. Prints a short table last.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import random
import statistics
import sys
import time
from typing import Any, Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MIB = float(1 << 20)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
MILESTONES = (1, 100, 300, 1000)  # the calls the summary shows (the last call where fewer)
RESERVED_FROM = 100  # reserved bytes may not grow past this call's (the warm-up of the allocator's cache)
# The geometry drawn from (latent frames, text lengths) at the real widths and with --tiny.
REAL = dict(height=480, width=832, frames_choices="1,2,3,4,5,6", text_choices="512,448,384,320,256,192")
TINY = dict(height=64, width=96, frames_choices=",".join(map(str, range(1, 25))), text_choices="7,5,3",
            token_chunk=24)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the tests' tiny widths and geometry (a smoke test)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--check-every", type=int, default=100, help="a reference check every N calls (0: none)")
    ap.add_argument("--height", type=int, help=f"pixels (default {REAL['height']}; --tiny {TINY['height']})")
    ap.add_argument("--width", type=int, help=f"pixels (default {REAL['width']}; --tiny {TINY['width']})")
    ap.add_argument("--frames-choices", help=f"latent frame counts drawn from (default {REAL['frames_choices']}; "
                                             "--tiny 1..24)")
    ap.add_argument("--text-choices", help=f"text lengths drawn from (default {REAL['text_choices']}; "
                                           f"--tiny {TINY['text_choices']})")
    ap.add_argument("--batch-choices", default="1,2", help="batch sizes drawn from (2: CFG; default 1,2)")
    ap.add_argument("--seed", type=int, default=7, help="of the geometries (the inputs: the call's number)")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), help="default bf16 on cuda, fp32 on cpu")
    ap.add_argument("--budget", default=None, help="streamplan.apply budget (default: none, the lean default)")
    ap.add_argument("--token-chunk", type=int, help="streamplan.apply token_chunk (default: chosen; --tiny 24)")
    ap.add_argument("--max-error", type=float, help="largest rel L2 of a check (default 5e-2 in bf16, 1e-4 in fp32)")
    ap.add_argument("--reserved-slack-mib", type=float, default=64.0,
                    help="how far the reserved bytes may grow past call 100's (default 64)")
    ap.add_argument("--out", help="write the results as JSON")
    a = ap.parse_args()
    for k, v in (TINY if a.tiny else REAL).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.dtype = a.dtype or ("bf16" if a.device == "cuda" else "fp32")
    a.max_error = a.max_error if a.max_error is not None else (5e-2 if a.dtype == "bf16" else 1e-4)
    return a


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return float((x - ref).norm() / ref.norm())


def run(forward: Callable[..., Any], call: dict[str, Any]) -> torch.Tensor:
    """The video output of one call, as tests/python/test_interruptions.py's run."""
    with torch.no_grad():
        return forward(**call)[0]


class Counters:
    """The memory counters: the CUDA caching allocator's (the reference's private pool left out),
    or on the CPU streamplan's counting allocator's (no reserved bytes or peak)."""

    def __init__(self, device: str):
        import streamplan

        self.cuda = device == "cuda"
        self.pool = torch.cuda.MemPool() if self.cuda else None
        self.pool_bytes = (0, 0)  # what the reference's pool holds: allocated, reserved
        self.cpu_bytes = streamplan._C.cpu_allocated_bytes  # installs the counting allocator now
        self.cpu_bytes()

    def reference(self) -> contextlib.AbstractContextManager:
        """Where the reference's allocations go."""
        return torch.cuda.use_mem_pool(self.pool) if self.cuda else contextlib.nullcontext()

    def after_reference(self) -> None:
        if self.cuda:
            segments = self.pool.snapshot(include_traces=False)
            self.pool_bytes = (sum(s["allocated_size"] for s in segments), sum(s["total_size"] for s in segments))

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def start(self) -> None:
        """Before a call: its peak counts from now."""
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def now(self) -> tuple[int, int | None]:
        """(allocated, reserved) bytes once the device is done."""
        if not self.cuda:
            return self.cpu_bytes(), None
        self.sync()
        return (torch.cuda.memory_allocated() - self.pool_bytes[0],
                torch.cuda.memory_reserved() - self.pool_bytes[1])

    def peak(self) -> int | None:
        return torch.cuda.max_memory_allocated() if self.cuda else None


def make_call(module: torch.nn.Module, geometry: dict[str, Any], a: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The arguments of one call, as WanPipeline passes them, seeded by `seed`."""
    c, b, dtype = module.config, geometry["batch"], DTYPES[a.dtype]
    gen = torch.Generator(a.device).manual_seed(seed)
    latents = (b, c.in_channels, geometry["frames"], a.height // 8, a.width // 8)
    return {
        "hidden_states": torch.randn(latents, generator=gen, device=a.device, dtype=dtype),
        "timestep": torch.full((b,), geometry["timestep"], device=a.device),
        "encoder_hidden_states": torch.randn((b, geometry["text"], c.text_dim), generator=gen, device=a.device,
                                             dtype=dtype),
        "return_dict": False,
    }


def geometries(a: argparse.Namespace, tokens_per_frame: int) -> list[dict[str, Any]]:
    rng = random.Random(a.seed)
    frames, batches, texts = ints(a.frames_choices), ints(a.batch_choices), ints(a.text_choices)
    out = []
    for _ in range(a.calls):
        f, b, t = rng.choice(frames), rng.choice(batches), rng.choice(texts)
        out.append({"frames": f, "batch": b, "text": t, "timestep": round(rng.uniform(1.0, 999.0), 1),
                    "tokens": b * f * tokens_per_frame})
    return out


def main() -> int:
    a = parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("soak_package: needs a CUDA device (or --device cpu)", file=sys.stderr)
        return 1

    import make_reference
    import streamplan
    from bench_meter import wan14b_transformer, write_json

    counters = Counters(a.device)
    t0 = time.time()
    module = wan14b_transformer(a.layers, make_reference.WAN_CONFIG if a.tiny else None).to(a.device, DTYPES[a.dtype])
    print(f"[soak] {a.layers} layers built in {time.time() - t0:.0f} s", file=sys.stderr)
    own = functools.partial(type(module).forward, module)  # the module's own forward, past the handle
    _, ph, pw = module.config.patch_size
    tokens_per_frame = (a.height // 8 // ph) * (a.width // 8 // pw)
    draws = geometries(a, tokens_per_frame)
    handle = streamplan.apply(module, budget=a.budget, token_chunk=a.token_chunk)

    def check(out: torch.Tensor, call: dict[str, Any]) -> float:
        with counters.reference():
            err = rel_l2(out, run(own, call))
        counters.after_reference()
        return err

    # The warm-up (library workspaces, the allocator's cache), at the largest geometry.
    largest = {"frames": max(ints(a.frames_choices)), "batch": max(ints(a.batch_choices)),
               "text": max(ints(a.text_choices)), "timestep": 500.0}
    before_warmup, _ = counters.now()
    call = make_call(module, largest, a, seed=0)
    warmup_error = check(run(module, call), call)
    del call
    base_alloc, base_reserved = counters.now()
    print(f"[soak] warm-up: rel L2 {warmup_error:.2e}; {len(draws)} calls", file=sys.stderr)

    cols: dict[str, list] = {k: [] for k in ("allocated_bytes", "reserved_bytes", "peak_bytes", "ms", "host_ms",
                                             "plans", "new_plan")}
    checks, failures = [], []
    keys = {p["key"] for p in handle.plans}
    seen = set(keys)
    t_run = time.time()
    for n, g in enumerate(draws, 1):
        try:
            call = make_call(module, g, a, seed=n)
            counters.start()
            t = time.perf_counter()
            out = run(module, call)
            counters.sync()
            ms = 1e3 * (time.perf_counter() - t)
            peak = counters.peak()
            if n == 1 or (a.check_every > 0 and n % a.check_every == 0):
                checks.append({"call": n, **g, "rel_l2": check(out, call)})
            del out, call
            allocated, reserved = counters.now()
        except Exception as e:  # noqa: BLE001  (recorded; the calls so far are written)
            failures.append(f"call {n} ({g}) raised {type(e).__name__}: {e}")
            break
        now = {p["key"] for p in handle.plans}
        cols["allocated_bytes"].append(allocated - base_alloc)
        cols["reserved_bytes"].append(None if reserved is None else reserved - base_reserved)
        cols["peak_bytes"].append(None if peak is None else peak - base_alloc)
        cols["ms"].append(ms)
        cols["host_ms"].append(handle.last_host_ms)
        cols["plans"].append(len(now))
        cols["new_plan"].append(bool(now - keys))
        keys = now
        seen |= now
        if n % 100 == 0:
            print(f"[soak] {n} calls, {time.time() - t_run:.0f} s", file=sys.stderr)
    done = len(cols["ms"])
    for k in ("frames", "batch", "text", "tokens", "timestep"):
        cols[k] = [g[k] for g in draws[:done]]

    # What must hold.
    alloc, res = cols["allocated_bytes"], cols["reserved_bytes"]
    kept = [(n, x) for n, x in enumerate(alloc, 1) if x != 0]
    if kept:
        failures.append(f"allocated bytes not back at the baseline after {len(kept)} of {done} calls "
                        f"(call, bytes): {kept[:5]}")
    growth = None
    if counters.cuda and done:
        ref = min(RESERVED_FROM, done)
        growth = max(res[ref - 1:]) - res[ref - 1]
        if growth > a.reserved_slack_mib * MIB:
            worst = ref + res[ref - 1:].index(max(res[ref - 1:]))
            failures.append(f"reserved bytes grew {growth / MIB:.1f} MiB past call {ref}'s (at call {worst}), "
                            f"more than --reserved-slack-mib {a.reserved_slack_mib:g}")
    if max(cols["plans"], default=0) > streamplan.PLAN_CACHE_SIZE:
        failures.append(f"the plan cache held {max(cols['plans'])} plans, more than PLAN_CACHE_SIZE "
                        f"{streamplan.PLAN_CACHE_SIZE}")
    fallbacks = [str(f) for f in handle.fallbacks]
    if fallbacks:
        failures.append(f"{len(fallbacks)} calls ran the module's own forward: {fallbacks[:3]}")
    if not handle.planned_calls == handle.calls == done + 1:  # + the warm-up
        failures.append(f"{handle.planned_calls} of {handle.calls} calls planned, {done + 1} made (with the warm-up)")
    bad = [c for c in checks if not c["rel_l2"] <= a.max_error]
    if bad or not warmup_error <= a.max_error:
        failures.append(f"rel L2 above --max-error {a.max_error:g}: warm-up {warmup_error:.2e}, "
                        f"{[(c['call'], c['rel_l2']) for c in bad]}")

    made = 1 + sum(cols["new_plan"])  # the warm-up's too
    marks = sorted({n for n in MILESTONES if n <= done} | ({done} if done else set()))
    timed = [ms for ms, new in zip(cols["ms"], cols["new_plan"]) if not new]
    # streamplan's own host time on a plan-cache hit, against the call's time.
    host = [(h, ms) for h, ms, new in zip(cols["host_ms"], cols["ms"], cols["new_plan"]) if not new and h is not None]
    summary = {
        "calls": done,
        "at_calls": {str(n): {k: cols[k][n - 1] for k in ("allocated_bytes", "reserved_bytes", "peak_bytes", "plans")}
                     for n in marks},
        "max_allocated_above_baseline_bytes": max(alloc, default=None),
        "reserved_growth_bytes": growth, "reserved_growth_from_call": min(RESERVED_FROM, done),
        "reserved_slack_bytes": int(a.reserved_slack_mib * MIB),
        "max_peak_bytes": max((p for p in cols["peak_bytes"] if p is not None), default=None),
        "median_ms": statistics.median(cols["ms"]) if done else None,
        "median_ms_without_planning": statistics.median(timed) if timed else None,
        "median_host_ms_without_planning": statistics.median(h for h, _ in host) if host else None,
        "median_host_share_without_planning": statistics.median(h / ms for h, ms in host) if host else None,
        "max_host_share_without_planning": max((h / ms for h, ms in host), default=None),
        "checks": checks, "warmup_rel_l2": warmup_error,
        "max_rel_l2": max([c["rel_l2"] for c in checks] + [warmup_error]),
        "plan_cache_size": streamplan.PLAN_CACHE_SIZE, "max_plans": max(cols["plans"], default=0),
        "plans_made": made, "evictions": made - len(keys), "geometries_seen": len(seen),
        "retries": [p["retry"] for p in handle.plans if p["retry"]],
        "handle_calls": handle.calls, "planned_calls": handle.planned_calls, "fallbacks": fallbacks,
        "warmup_kept_bytes": base_alloc - before_warmup,
        "reference_pool_bytes": dict(zip(("allocated", "reserved"), counters.pool_bytes)),
        "failures": failures, "passed": not failures,
    }
    doc = {
        "device": torch.cuda.get_device_name() if counters.cuda else "cpu", "torch": torch.__version__,
        "streamplan": streamplan.__version__,
        "model": f"diffusers WanTransformer3DModel, {'tiny' if a.tiny else 'Wan 2.1 14B'} widths, {a.layers} layers",
        "config": {**vars(a), "tokens_per_frame": tokens_per_frame, "dtype": a.dtype},
        "baseline": {"allocated_bytes": base_alloc, "reserved_bytes": base_reserved},
        "wall_s": time.time() - t0, "summary": summary, "per_call": cols,
    }
    write_json(a.out, doc)
    print_table(summary, a)
    for f in failures:
        print(f"FAILED: {f}")
    if failures:
        print(f"soak_package: {len(failures)} check(s) failed", file=sys.stderr)
    return 1 if failures else 0


def print_table(s: dict[str, Any], a: argparse.Namespace) -> None:
    def mib(v: int | None) -> str:
        return f"{'n/a':>12}" if v is None else f"{v / MIB:12.3f}"

    print(f"{'call':>6} {'alloc MiB':>12} {'reserved MiB':>12} {'peak MiB':>12} {'plans':>6}  (above the baseline)")
    for n, m in s["at_calls"].items():
        print(f"{n:>6} {mib(m['allocated_bytes'])} {mib(m['reserved_bytes'])} {mib(m['peak_bytes'])} {m['plans']:6}")
    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1f} ms"

    growth = ("n/a" if s["reserved_growth_bytes"] is None else
              f"{s['reserved_growth_bytes'] / MIB:.1f} MiB (limit {a.reserved_slack_mib:g})")
    print(f"median {ms(s['median_ms'])} a call ({ms(s['median_ms_without_planning'])} without planning); "
          f"max rel L2 {s['max_rel_l2']:.2e} (the warm-up and {len(s['checks'])} checks; limit {a.max_error:g})")
    print(f"plan cache max {s['max_plans']} of {s['plan_cache_size']} ({s['plans_made']} plans made, "
          f"{s['evictions']} evicted, {s['geometries_seen']} geometries); reserved growth after call "
          f"{s['reserved_growth_from_call']}: {growth}; {s['planned_calls']} of {s['handle_calls']} calls "
          f"planned, {len(s['fallbacks'])} fallbacks")
    if s["median_host_ms_without_planning"] is not None:
        print(f"host time of streamplan per call without planning: median {ms(s['median_host_ms_without_planning'])}, "
              f"{100 * s['median_host_share_without_planning']:.2f}% of the call (at most "
              f"{100 * s['max_host_share_without_planning']:.2f}%)")

if __name__ == "__main__":
    sys.exit(main())
