"""What the Python benchmarks (scripts/bench_package.py, bench_peers.py, bench_minimax.py)
share: the per-call time and activation peak of a module's forward, and writing results."""

from __future__ import annotations

import json
import os

import torch


def write_json(path: str | None, obj) -> None:
    """Writes obj to path (its folder made first); nothing where path is None."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


class Meter:
    """Wraps a module's forward (whatever it is now): time and activation peak of every call.

    The time is the device time between CUDA events around the call; the peak is the caching
    allocator's peak above what was allocated when the call began (weights, inputs, caller state).
    """

    def __init__(self, module: torch.nn.Module):
        self.module, self.inner, self.calls = module, module.forward, []
        self.own = "forward" in module.__dict__  # replaced on the instance already (streamplan.apply)

        def forward(*args, **kwargs):
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = self.inner(*args, **kwargs)
            stop.record()
            torch.cuda.synchronize()
            self.calls.append((start.elapsed_time(stop), torch.cuda.max_memory_allocated() - base))
            return out

        module.forward = forward

    def detach(self) -> None:
        if self.own:
            self.module.forward = self.inner
        else:
            del self.module.forward  # the class's forward again
