"""What the Python benchmarks (scripts/bench_package.py, bench_peers.py, bench_minimax.py,
soak_package.py) share: the per-call time and activation peak of a module's forward, one
warm-up then timed calls, the diffusers Wan 2.1 14B configuration, and writing results."""

from __future__ import annotations

import json
import os

import torch


# diffusers' WanTransformer3DModel at Wan 2.1 14B's widths (num_layers given per use).
WAN14B = dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
              out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, cross_attn_norm=True,
              qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None,
              rope_max_seq_len=1024)


def add_wan_run_args(ap, layers: int, reps: int) -> None:
    """The options of a benchmark of the Wan 14B transformer: --layers, the video geometry
    (--frames, --height, --width; 81 x 1280 x 720 by default), --reps and --out."""
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--height", type=int, default=720)
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--out", help="write the results as JSON")


def wan14b_transformer(layers: int, config: dict | None = None) -> torch.nn.Module:
    """diffusers' WanTransformer3DModel at WAN14B widths (or `config`'s, e.g. the tests' tiny
    make_reference.WAN_CONFIG) with `layers` layers and seeded random fp32 weights
    (tests/reference/make_reference.py's randomization), in eval mode on the CPU."""
    import make_reference
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel(**{**(config or WAN14B), "num_layers": layers})
    make_reference.randomize(model, torch.Generator().manual_seed(0))
    return model.eval()


def metered(module: torch.nn.Module, call, reps: int):
    """call() once (a warm-up, and a planned module's plan of this geometry), then `reps` times,
    each call of module's forward metered: (the last call's result, [(ms, peak bytes)])."""
    meter = Meter(module)
    try:
        call()
        meter.calls.clear()
        out = None
        for _ in range(reps):
            out = call()
    finally:
        meter.detach()
    return out, meter.calls


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
