"""diffusers' WanPipeline and FluxPipeline with streamplan attached to their transformers:
the latents equal the unpatched pipeline's, the weights are the module's own tensors, and after
remove() the module computes exactly what it did before."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import make_flux_pipeline, rel_l2, run_flux, run_wan

import streamplan

TOL = 1e-4


def _planned_vs_original(pipe: Any, run: Any, **options: Any) -> tuple[float, streamplan.Handle]:
    reference = run(pipe)
    handle = streamplan.apply(pipe.transformer, **options)
    try:
        planned = run(pipe)
    finally:
        streamplan.remove(pipe.transformer)
    assert planned.shape == reference.shape
    assert torch.isfinite(planned).all()
    return rel_l2(planned, reference), handle


@pytest.mark.parametrize("options", [{}, {"token_chunk": 16}, {"budget": "auto"}], ids=["default", "chunk16", "auto"])
def test_wan_pipeline_latents_match(wan_pipe: Any, options: dict[str, Any]) -> None:
    run = lambda p: run_wan(p, videos=2)  # noqa: E731  CFG: two calls of batch 2 per step
    err, handle = _planned_vs_original(wan_pipe, run, **options)
    print(f"wan {options}: rel L2 {err:.3e}")
    assert err <= TOL
    assert handle.fallbacks == []
    assert handle.planned_calls == handle.calls == 2 * 3
    assert handle.family == "wan2.1" and handle.layout == "diffusers"
    assert len(handle.plans) == 1 and handle.plans[0]["calls"] == 2 * 3 * 2


@pytest.mark.parametrize("options", [{}, {"token_chunk": 16}], ids=["default", "chunk16"])
def test_flux_pipeline_latents_match(flux_pipe: Any, options: dict[str, Any]) -> None:
    run = lambda p: run_flux(p, images=2)  # noqa: E731  true CFG: two calls of batch 2 per step
    err, handle = _planned_vs_original(flux_pipe, run, **options)
    print(f"flux-dev {options}: rel L2 {err:.3e}")
    assert err <= TOL
    assert handle.fallbacks == []
    assert handle.planned_calls == handle.calls == 2 * 3
    assert handle.family == "flux1" and handle.variant != ""


def test_flux_schnell_pipeline_latents_match() -> None:
    pipe = make_flux_pipeline("schnell")
    err, handle = _planned_vs_original(pipe, lambda p: run_flux(p, true_cfg=1.0), token_chunk=16)
    print(f"flux-schnell: rel L2 {err:.3e}")
    assert err <= TOL
    assert handle.fallbacks == [] and handle.planned_calls == 3


@pytest.mark.parametrize("which", ["wan", "flux"])
def test_remove_restores_the_original_forward(wan_pipe: Any, flux_pipe: Any, which: str) -> None:
    pipe, run = (wan_pipe, run_wan) if which == "wan" else (flux_pipe, run_flux)
    module = pipe.transformer
    before = run(pipe)
    handle = streamplan.apply(module, token_chunk=16)
    run(pipe)
    assert handle.planned_calls > 0
    streamplan.remove(module)
    assert "forward" not in module.__dict__ and streamplan.handle_of(module) is None
    after = run(pipe)
    assert torch.equal(after, before)


@pytest.mark.parametrize("which", ["wan", "flux"])
def test_weights_are_the_modules_own_tensors(wan_pipe: Any, flux_pipe: Any, which: str) -> None:
    pipe, run = (wan_pipe, run_wan) if which == "wan" else (flux_pipe, run_flux)
    module = pipe.transformer
    pointers = {n: t.data_ptr() for n, t in module.state_dict().items()}
    handle = streamplan.apply(module)
    run(pipe)
    # Every weight matrix the planner reads is a module tensor, by data pointer; what it holds
    # as copies are only vectors and the one swapped modulation matrix of Flux's final layer.
    storage = handle._attached.storage()
    module_pointers = set(pointers.values())
    for name, ptrs in storage.items():
        assert ptrs and all(p in module_pointers for p in ptrs), name
    copied = dict(handle.copies)
    for name in copied:
        assert name.endswith(".bias") or name == "final_layer.adaLN_modulation.1.weight", name
    matrices = [n for n in storage if n.endswith(".weight") and "norm" not in n]
    assert len(matrices) >= 10
    # The module's parameters are untouched.
    assert {n: t.data_ptr() for n, t in module.state_dict().items()} == pointers


@pytest.mark.parametrize("which", ["wan", "flux"])
def test_in_place_updates_of_parameters_are_seen(wan_pipe: Any, flux_pipe: Any, which: str) -> None:
    pipe, run = (wan_pipe, run_wan) if which == "wan" else (flux_pipe, run_flux)
    module = pipe.transformer
    state = {n: t.clone() for n, t in module.state_dict().items()}
    name = "blocks.0.attn1.to_v.weight" if which == "wan" else "transformer_blocks.0.attn.to_k.bias"
    try:
        handle = streamplan.apply(module)
        planned = run(pipe)
        with torch.no_grad():
            module.get_parameter(name).mul_(1.5)  # in place: the planner reads the same storage
        planned_changed = run(pipe)
        streamplan.remove(module)
        original_changed = run(pipe)
    finally:
        module.load_state_dict(state)
    assert rel_l2(planned_changed, planned) > 1e-3
    assert rel_l2(planned_changed, original_changed) <= TOL
    assert handle.fallbacks == []


def test_replaced_storage_attaches_again(wan_pipe: Any) -> None:
    module = wan_pipe.transformer
    state = {n: t.clone() for n, t in module.state_dict().items()}
    p = module.get_parameter("blocks.1.ffn.net.2.weight")
    try:
        handle = streamplan.apply(module)
        run_wan(wan_pipe)
        p.data = p.data * 0.5  # a new storage under the same parameter
        planned = run_wan(wan_pipe)
        streamplan.remove(module)
        original = run_wan(wan_pipe)
    finally:
        p.data = state["blocks.1.ffn.net.2.weight"].clone()
    assert rel_l2(planned, original) <= TOL
    assert handle.fallbacks == []


def test_each_geometry_gets_its_plan(flux_pipe: Any) -> None:
    handle = streamplan.apply(flux_pipe.transformer)
    run_flux(flux_pipe, true_cfg=1.0)
    run_flux(flux_pipe, true_cfg=1.0, height=64, width=64)
    run_flux(flux_pipe, true_cfg=1.0)
    keys = [p["key"] for p in handle.plans]
    assert len(keys) == 2 and keys[0] != keys[1]
    assert [p["calls"] for p in handle.plans] == [6, 3]
    assert "img 48" in keys[0] and "img 16" in keys[1]
