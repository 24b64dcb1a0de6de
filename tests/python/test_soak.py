"""A long session: 300 consecutive calls of a tiny planned module through streamplan.apply, on
random geometries (frame counts, CFG batch 1 or 2). Every call answers what the module's own
forward answers, returns all the memory it took (the CPU allocator's, from torch.profiler's
memory events), and the plan cache stays within its bound (streamplan.PLAN_CACHE_SIZE plans,
the least recently used evicted)."""

from __future__ import annotations

import random
import time

import torch
from conftest import make_wan_transformer, rel_l2, wan_call
from test_interruptions import run

import streamplan

CALLS = 300


def test_300_calls_return_their_memory_and_keep_the_cache_bounded() -> None:
    module, reference = make_wan_transformer(), make_wan_transformer()  # the same weights
    rng = random.Random(7)
    # More geometries than the cache holds, so that it evicts: frames 1..(2 x size) x batch 1, 2.
    frames = list(range(1, 2 * streamplan.PLAN_CACHE_SIZE + 1))
    handle = streamplan.apply(module, token_chunk=24)
    kept, sizes, checked, host = [], [], 0, []
    assert handle.last_host_ms is None
    before = streamplan._C.cpu_allocated_bytes()
    probe = torch.empty(1000)  # the count sees a tensor made now
    assert streamplan._C.cpu_allocated_bytes() - before == probe.nbytes
    del probe
    for i in range(CALLS):
        f, b = rng.choice(frames), rng.choice((1, 2))
        call = wan_call(module, batch=b)
        call["hidden_states"] = torch.randn((b, module.config.in_channels, f, 4, 6),
                                            generator=torch.Generator().manual_seed(i))
        before = streamplan._C.cpu_allocated_bytes()
        t = time.perf_counter()
        run(module, call)
        wall_ms = 1e3 * (time.perf_counter() - t)
        host.append((handle.last_host_ms, wall_ms))
        kept.append(streamplan._C.cpu_allocated_bytes() - before)
        sizes.append(len(handle.plans))
        if i % 25 == 0:  # the answer, against the module's own forward
            assert rel_l2(run(module, call), run(reference, call)) <= 1e-4, (i, f, b)
            checked += 1
    assert kept == [0] * CALLS, [(i, k) for i, k in enumerate(kept) if k][:10]
    assert max(sizes) == streamplan.PLAN_CACHE_SIZE == sizes[-1], max(sizes)
    assert handle.fallbacks == [] and handle.planned_calls == handle.calls == CALLS + checked
    # streamplan's own host time of each call: measured, and a part of the call's wall time.
    assert all(0 < h < w for h, w in host), [(i, hw) for i, hw in enumerate(host) if not 0 < hw[0] < hw[1]][:5]
