"""Weights through a host's weight hook (streamplan.apply(weight_hook=...)): the planned forward
computes with what the hook returns, equal to the original forward on a module whose weights
were patched in place; the module's own tensors stay untouched; a hook that returns the wrong
thing, or names a tensor the module lacks, is a clear error naming the weight."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from conftest import flux_call, make_flux_transformer, make_wan_transformer, rel_l2, wan_call

import streamplan

TOL = 1e-4


def lora_deltas(module: torch.nn.Module, names: list[str], rank: int = 2, seed: int = 5) -> dict[str, torch.Tensor]:
    """A rank-`rank` update B @ A of each named 2-D weight, of a tenth of its scale."""
    g = torch.Generator().manual_seed(seed)
    sd = module.state_dict()
    out = {}
    for n in names:
        w = sd[n]
        b = torch.randn(w.shape[0], rank, generator=g)
        a = torch.randn(rank, w[0].numel(), generator=g)
        out[n] = (0.1 * w.std() / rank ** 0.5 * (b @ a)).reshape(w.shape).to(w.dtype)
    return out


def patched_copy(module: torch.nn.Module, deltas: dict[str, torch.Tensor]) -> torch.nn.Module:
    ref = copy.deepcopy(module)
    with torch.no_grad():
        for n, d in deltas.items():
            ref.get_parameter(n).add_(d)
    return ref


class Hook:
    """Adds each weight's delta; counts its calls per name."""

    def __init__(self, deltas: dict[str, torch.Tensor]):
        self.deltas, self.calls = deltas, {}

    def __call__(self, name: str, t: torch.Tensor) -> torch.Tensor:
        self.calls[name] = self.calls.get(name, 0) + 1
        return t + self.deltas[name] if name in self.deltas else t


def _check(module: torch.nn.Module, call: dict[str, Any], names: list[str], hooked: list[str] | None,
           **options: Any) -> None:
    deltas = lora_deltas(module, names)
    with torch.no_grad():
        want = patched_copy(module, deltas)(**call)[0]
        unpatched = module(**call)[0]
    before = {n: t.clone() for n, t in module.state_dict().items()}
    hook = Hook(deltas)
    handle = streamplan.apply(module, weight_hook=hook, hooked=hooked, **options)
    try:
        with torch.no_grad():
            got = module(**call)[0]
    finally:
        streamplan.remove(module)
    assert handle.fallbacks == [] and handle.planned_calls == 1
    assert handle.streams == bool(options)
    err = rel_l2(got, want)
    print(f"{type(module).__name__} hooked {len(names)} weights: rel L2 {err:.3e} (unpatched {rel_l2(unpatched, want):.3e})")
    assert err <= TOL < rel_l2(unpatched, want)
    assert set(names) <= set(hook.calls)  # every patched weight went through the hook
    assert all(torch.equal(before[n], t) for n, t in module.state_dict().items())  # the module is untouched


def test_wan_lora_through_the_hook() -> None:
    m = make_wan_transformer()
    names = [n for n, p in m.named_parameters() if p.dim() == 2 and n.startswith("blocks.")]
    _check(m, wan_call(m, batch=2), names, hooked=names)


def test_flux_every_tensor_through_the_hook() -> None:
    m = make_flux_transformer("dev")
    # diffusers' split q/k/v are parts of the fused canonical projections: each part is hooked
    names = [n for n, p in m.named_parameters() if p.dim() == 2 and ".attn." in n]
    _check(m, flux_call(m), names, hooked=None)


def test_flux_every_tensor_through_the_hook_while_the_blocks_stream() -> None:
    """Streamed, the hook gets each module tensor cut back out of the stored canonical weight
    where the run reads it: q/k/v rows of the fused projections (streamed blocks), and the final
    layer's modulation with its halves exchanged back (resident)."""
    m = make_flux_transformer("dev")
    names = [n for n, p in m.named_parameters() if p.dim() == 2 and (".attn." in n or n.startswith("norm_out."))]
    assert "norm_out.linear.weight" in names
    _check(m, flux_call(m), names, hooked=None, resident_blocks=1)


def test_the_plan_places_the_hooked_slices() -> None:
    m = make_wan_transformer()
    call = wan_call(m)
    peaks, placed, transient = [], [], []
    for hook in (None, lambda name, t: t):
        handle = streamplan.apply(m, weight_hook=hook)
        try:
            with torch.no_grad():
                m(**call)
            doc = handle.to_dict()
        finally:
            streamplan.remove(m)
        peaks.append(doc["planned"]["estimated_peak_bytes"])
        placed.append([b["label"] for p in doc["programs"] for b in p["buffers"] if b["role"] == "W" and b["bytes"] > 0])
        transient.append({s["what"]: s.get("transient_bytes", 0) for p in doc["programs"] for s in p["steps"]
                          if s["kind"] == "acquire"})
    # without a hook every weight is a view of the module's tensor; with one, each acquired
    # slice has its place in the arena, the whole weight is the acquire's transient (what the
    # hook returns and its assembly: 2 x 96 x 64 fp32), and the estimate counts both
    assert placed[0] == [] and "weight blocks.0.ffn.0.weight [0, +96)" in placed[1]
    assert set(transient[0].values()) == {0}
    assert transient[1]["acquire weight blocks.0.ffn.0.weight [0, +96)"] == 2 * 96 * 64 * 4
    assert peaks[1] > peaks[0]


@pytest.mark.parametrize("bad, match", [
    (lambda name, t: t[:1], "returned .* expected a 16- or 32-bit floating-point tensor of"),
    (lambda name, t: "not a tensor", "returned str, not a tensor"),
], ids=["shape", "type"])
def test_a_bad_hook_names_the_weight(bad: Any, match: str) -> None:
    m = make_wan_transformer()
    name = "blocks.0.ffn.net.0.proj.weight"
    handle = streamplan.apply(m, weight_hook=bad, hooked=[name])
    try:
        with pytest.raises(ValueError, match=f"weight hook: for '{name}' it {match}"):
            with torch.no_grad():
                m(**wan_call(m))
    finally:
        streamplan.remove(m)
    assert handle.planned_calls == 0


def test_hooked_names_must_be_the_modules() -> None:
    m = make_wan_transformer()
    with pytest.raises(ValueError, match="weight hook: the module has no tensor 'blocks.9.nothing.weight'"):
        streamplan.apply(m, weight_hook=lambda n, t: t, hooked=["blocks.9.nothing.weight"])
    with pytest.raises(TypeError, match="weight_hook: expected a function"):
        streamplan.apply(m, weight_hook=3)
    with pytest.raises(ValueError, match="hooked: names are given but no weight_hook"):
        streamplan.apply(m, hooked=["proj_out.weight"])
    assert streamplan.handle_of(m) is None
