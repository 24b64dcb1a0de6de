"""streamplan's ComfyUI node (streamplan.comfy_nodes): its options without ComfyUI, and with a
ComfyUI tree the node on a ModelPatcher of ComfyUI's WanModel and Flux: the diffusion model
called as ComfyUI's sampler calls it (the clone's wrappers in transformer_options) runs planned
with ComfyUI's selected attention and answers what the unwrapped model answers; a weight that
ComfyUI patches at cast time is acquired through ComfyUI's patch function; another wrapper makes
the call run ComfyUI's chain, recorded; the original patcher is left without the wrapper.

The tests that need ComfyUI run on .deps/comfyui-full or, without it, the snapshot ../shared/comfyui-*;
without either they are skipped with the reason.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import rel_l2
from test_comfy_models import _patch, comfy, flux_call, make_flux, make_wan, run, wan_call  # noqa: F401

import streamplan
from streamplan import comfy_nodes

TOL = 1e-4


def test_budget_option() -> None:
    assert comfy_nodes.parse_budget("none") is None and comfy_nodes.parse_budget(" ") is None
    assert comfy_nodes.parse_budget("auto") == "auto" and comfy_nodes.parse_budget("12GiB") == "12GiB"
    with pytest.raises(ValueError, match="budget: '12 parsecs' is not"):
        comfy_nodes.parse_budget("12 parsecs")


def test_node_declaration() -> None:
    node = comfy_nodes.NODE_CLASS_MAPPINGS["StreamplanMemoryPlanner"]
    inputs = node.INPUT_TYPES()["required"]
    assert inputs["model"] == ("MODEL",) and node.RETURN_TYPES == ("MODEL", "STRING")
    assert node.RETURN_NAMES == ("model", "status")
    status = comfy_nodes.NODE_CLASS_MAPPINGS["StreamplanStatus"]
    assert status.RETURN_TYPES == ("STRING",) and status.INPUT_TYPES()["required"] == {"model": ("MODEL",)}
    assert comfy_nodes.NODE_DISPLAY_NAME_MAPPINGS["StreamplanStatus"] == "Streamplan Status"
    assert inputs["consumer"][0][0] == "comfy" and "sdpa" in inputs["consumer"][0]
    assert comfy_nodes.NODE_DISPLAY_NAME_MAPPINGS["StreamplanMemoryPlanner"] == "Streamplan Memory Planner"


@pytest.mark.parametrize("folder", [".", "comfyui"], ids=["repository", "comfyui"])
def test_loads_as_comfyui_loads_a_custom_node_folder(folder: str) -> None:
    """ComfyUI imports custom_nodes/<folder>/__init__.py as a package: a clone of the repository
    or the comfyui folder alone."""
    import importlib.util
    import os
    import sys

    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", folder))
    name = f"custom_node_{folder.strip('.') or 'repository'}"
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, "__init__.py"),
                                                  submodule_search_locations=[root])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    assert module.NODE_CLASS_MAPPINGS == comfy_nodes.NODE_CLASS_MAPPINGS


class Holder(torch.nn.Module):
    """What a ModelPatcher holds: a model with its diffusion model."""

    def __init__(self, dm: torch.nn.Module) -> None:
        super().__init__()
        self.diffusion_model = dm


def planner(comfy: Any, dm: torch.nn.Module, consumer: str = "comfy") -> tuple[Any, Any, list[str]]:
    """(the original patcher, the node's clone, what the node reported)."""
    import comfy.model_patcher as mp

    cpu = torch.device("cpu")
    patcher = mp.ModelPatcher(Holder(dm), load_device=cpu, offload_device=cpu)
    reports: list[str] = []
    clone, status = comfy_nodes.StreamplanMemoryPlanner().patch(patcher, "none", consumer, True, unique_id="7")
    assert status.startswith(f"streamplan: {type(dm).__name__}, weights ") and f"consumer {consumer}" in status
    for w in clone.wrappers["diffusion_model"]["streamplan"]:
        w.report = reports.append
    return patcher, clone, reports


def sampled(clone: Any, call: Any, **options: Any) -> torch.Tensor:
    """A call as ComfyUI's sampler makes it: the patcher's wrappers in transformer_options."""
    args, kwargs = call()
    kwargs["transformer_options"] = {"wrappers": clone.wrappers, **options}
    with torch.no_grad():
        return clone.model.diffusion_model(*args, **kwargs)


def wrapper_of(clone: Any) -> comfy_nodes.PlannerWrapper:
    return clone.wrappers["diffusion_model"]["streamplan"][0]


@pytest.mark.parametrize("make,call", [(make_wan, wan_call), (make_flux, flux_call)], ids=["wan", "flux"])
def test_node_runs_the_sampler_call_planned(comfy: Any, make: Any, call: Any) -> None:
    dm = make(comfy)
    want = run(dm, call())
    patcher, clone, reports = planner(comfy, dm)
    got = sampled(clone, call)
    h = wrapper_of(clone).handles[(id(dm), None, None, None)]
    try:
        assert h.planned_calls == h.calls == 1 and h.fallbacks == [] and h.consumer == "comfy"
        err = rel_l2(got, want)
        print(f"node on {type(dm).__name__}: rel L2 {err:.3e}")
        assert err <= TOL
        assert reports and "estimated peak" in reports[0] and "weights held for the block" in reports[0]
        assert "streamplan" not in patcher.wrappers.get("diffusion_model", {})  # the clone only
        assert "forward" not in dm.__dict__  # nothing monkeypatched
    finally:
        streamplan.remove(dm)


def test_node_runs_comfys_pytorch_attention_through_the_sdpa_kernel_choice(comfy: Any, monkeypatch: Any) -> None:
    """Where ComfyUI's selected attention is its PyTorch one, the node's calls run PyTorch's SDPA
    through the sdpa consumer's kernel choice (on the CPU: PyTorch's own), planned, with the
    answer of ComfyUI's own forward; the status names the kernel."""
    from comfy.ldm.modules import attention

    monkeypatch.setattr(attention, "optimized_attention", attention.attention_pytorch)
    dm = make_wan(comfy)
    want = run(dm, wan_call())
    _, clone, _ = planner(comfy, dm)
    got = sampled(clone, wan_call)
    w = wrapper_of(clone)
    h = w.handles[(id(dm), None, None, None)]
    try:
        assert h.planned_calls == h.calls == 1 and h.fallbacks == [] and h.consumer == "comfy"
        assert rel_l2(got, want) <= TOL
        status = w.status()
        assert "attention kernel on cpu, torch.float32, head_dim " in status, status
        assert "PyTorch's SDPA as ATen's own choice" in status, status
    finally:
        streamplan.remove(dm)


def test_node_with_a_weight_patched_at_cast(comfy: Any) -> None:
    dm = make_wan(comfy)
    _patch(dm)
    want = run(dm, wan_call())  # ComfyUI's own cast applies the patch
    _, clone, _ = planner(comfy, dm, consumer="sdpa")
    got = sampled(clone, wan_call)
    h = wrapper_of(clone).handles[(id(dm), None, None, None)]
    try:
        assert h.planned_calls == 1 and rel_l2(got, want) <= TOL
    finally:
        streamplan.remove(dm)


def test_another_wrapper_runs_comfys_chain(comfy: Any) -> None:
    import comfy.patcher_extension as ext

    dm = make_flux(comfy)
    want = run(dm, flux_call())
    _, clone, reports = planner(comfy, dm)
    seen = []

    def other(executor: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(1)
        return executor(*args, **kwargs)

    clone.add_wrapper_with_key(ext.WrappersMP.DIFFUSION_MODEL, "other", other)
    got = sampled(clone, flux_call)
    h = wrapper_of(clone).handles[(id(dm), None, None, None)]
    try:
        assert h.planned_calls == 0 and [f.code for f in h.fallbacks] == ["wrappers"] and seen == [1]
        assert torch.equal(got, want) and "fallback wrappers" in reports[-1]
    finally:
        streamplan.remove(dm)


def test_attention_override_falls_back_for_attention_only(comfy: Any) -> None:
    """Another node's attention override that declares nothing: the call still plans, the
    override runs as the consumer, streamed Q is rejected with the reason, and the answer is
    what ComfyUI computes with the override."""
    dm = make_wan(comfy)
    calls = []

    def override(func: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(args[0].shape)
        return func(*args, **kwargs)

    args, kwargs = wan_call()
    with torch.no_grad():
        want = dm(*args, **{**kwargs, "transformer_options": {"optimized_attention_override": override}})
    n_original = len(calls)
    _, clone, reports = planner(comfy, dm)
    w = wrapper_of(clone)
    w.token_chunk = 16  # a few rows per slab: what the plan bounds shows on this tiny model
    got = sampled(clone, wan_call, optimized_attention_override=override)
    try:
        h = w.handles[(id(dm), id(override), None, None)]
        assert h.planned_calls == 1 and h.fallbacks == [] and h.consumer == "comfy-override"
        assert len(calls) > n_original  # the override ran inside the planned call
        err = rel_l2(got, want)
        print(f"attention override: rel L2 {err:.3e}")
        assert err <= TOL
        plan = h.to_dict()["plan"]
        chosen = lambda part, name: next(t for t in part["transformations"] if t["transformation"] == name)  # noqa: E731
        attn, ffn = plan["blocks"][0]["sublayers"][0], plan["blocks"][0]["sublayers"][-1]
        streamed = chosen(attn, "global K/V + streamed Q")
        assert not streamed["chosen"] and "consumer.bounded_q" in {r["code"] for r in streamed["rejections"]}
        # attention only: the MLP and the final layer are still bounded
        assert chosen(ffn, "token-chunked MLP")["chosen"] and ffn["token_chunk"] == 16
        assert chosen(plan["final_layer"], "bounded final layer")["chosen"]
        assert "attention override" in reports[-1]
    finally:
        assert streamplan.handle_of(dm) is None  # the override's handle is the node's own: nothing attached


def test_sparse_node_declaration_and_settings() -> None:
    basic = comfy_nodes.NODE_CLASS_MAPPINGS["StreamplanSparseAttention"].INPUT_TYPES()["required"]
    advanced = comfy_nodes.NODE_CLASS_MAPPINGS["StreamplanSparseAttentionAdvanced"].INPUT_TYPES()["required"]
    assert basic["kv_budget"][1]["default"] == 0.3 and basic["backend"][0] == ["auto", "sparse", "int8", "dense"]
    assert set(advanced) - set(basic) == {"early_steps", "early_kv", "late_steps", "late_kv"}
    assert comfy_nodes.NODE_DISPLAY_NAME_MAPPINGS["StreamplanSparseAttention"] == "Streamplan Sparse Attention"
    with pytest.raises(ValueError, match="backend: 'sage' is not one of auto, sparse, int8, dense"):
        comfy_nodes.SparseSettings(backend="sage")
    with pytest.raises(ValueError, match="budget"):
        comfy_nodes.SparseSettings(kv_budget=1.5)
    # The step of a call: the schedule's sigma nearest the call's (the last sigma ends the run).
    schedule = torch.tensor([1.0, 0.8, 0.6, 0.4, 0.2, 0.1, 0.0])
    assert comfy_nodes.sampler_step({"sample_sigmas": schedule, "sigmas": torch.tensor([0.6])}) == (2, 6)
    assert comfy_nodes.sampler_step({"sample_sigmas": schedule, "sigmas": torch.tensor([0.1001])}) == (5, 6)
    assert comfy_nodes.sampler_step({"sigmas": torch.tensor([0.6])}) is None


def sparse_model(comfy: Any, dm: torch.nn.Module, backend: str, planner_first: bool | None) -> Any:
    """A patcher with the Sparse Attention node (advanced, default windows) and, before or after
    it, the Memory Planner (None: none)."""
    import comfy.model_patcher as mp

    cpu = torch.device("cpu")
    m = mp.ModelPatcher(Holder(dm), load_device=cpu, offload_device=cpu)
    sparse = comfy_nodes.StreamplanSparseAttentionAdvanced()
    if planner_first:
        m, _ = comfy_nodes.StreamplanMemoryPlanner().patch(m, "none", "comfy", False)
    m, status = sparse.patch(m, 0.3, backend, 2, 0.5, 2, 0.5)
    assert status.startswith("streamplan: sparse attention, video KV budget 0.3 (first 2 steps 0.5, last 2 steps 0.5)")
    if planner_first is False:
        m, _ = comfy_nodes.StreamplanMemoryPlanner().patch(m, "none", "comfy", False)
    assert len(m.wrappers["diffusion_model"]["streamplan"]) == 1  # one planner, whichever node came first
    assert isinstance(m.model_options["transformer_options"][comfy_nodes.SPARSE_KEY], comfy_nodes.SparseSettings)
    return m


@pytest.mark.parametrize("planner_first", [None, True, False], ids=["alone", "after-planner", "before-planner"])
def test_sparse_node_auto_falls_back_to_dense_where_no_backend_runs(comfy: Any, planner_first: bool | None) -> None:
    """On the CPU neither sparse nor int8 passes (CUDA kernels): "auto" runs dense attention,
    planned, with the exact answer, and the status says why each backend was passed over."""
    dm = make_wan(comfy)
    want = run(dm, wan_call())
    m = sparse_model(comfy, dm, "auto", planner_first)
    schedule = torch.tensor([1.0, 0.7, 0.4, 0.0])
    got = sampled(m, wan_call, sample_sigmas=schedule, sigmas=torch.tensor([0.7]),
                  **{comfy_nodes.SPARSE_KEY: m.model_options["transformer_options"][comfy_nodes.SPARSE_KEY]})
    w = wrapper_of(m)
    try:
        h = w.handles[(id(dm), None, None, None)]
        assert h.planned_calls == h.calls == 1 and h.fallbacks == [] and h.consumer == "comfy"
        assert rel_l2(got, want) <= TOL
        status = w.status()
        print(status)
        assert "sparse attention (auto) on cpu, torch.float32: backend comfy" in status, status
        assert "sparse: not used: consumer 'sparse'" in status and "int8: not used: consumer 'int8'" in status, status
        assert "video KV budget" not in status  # no routed call
    finally:
        streamplan.remove(dm) if streamplan.handle_of(dm) else None


def test_sparse_node_explicit_backend_must_run(comfy: Any) -> None:
    dm = make_wan(comfy)
    m = sparse_model(comfy, dm, "sparse", None)
    with pytest.raises(RuntimeError, match="sparse attention backend 'sparse' was asked for and cannot run: consumer "
                                           "'sparse'"):
        sampled(m, wan_call, **{comfy_nodes.SPARSE_KEY: m.model_options["transformer_options"][comfy_nodes.SPARSE_KEY]})


def test_sparse_kv_budget_follows_the_sampler_step(comfy: Any) -> None:
    """With the sparse backend chosen, each call's KV budget is its step's: the first and last 2
    of 6 steps at 0.5, the middle ones at the video budget (the wrapper's choice alone; the
    sparse kernels run on CUDA)."""
    dm = make_wan(comfy)
    m = sparse_model(comfy, dm, "auto", None)
    w = wrapper_of(m)
    settings = m.model_options["transformer_options"][comfy_nodes.SPARSE_KEY]
    w.backends[("auto", "cpu", torch.float32)] = ("sparse", ["sparse: self-test passed (set by the test)"])
    schedule = torch.tensor([1.0, 0.9, 0.7, 0.5, 0.3, 0.1, 0.0])
    args, kwargs = wan_call()
    got = []
    for sigma in schedule[:-1]:
        opts = {"sample_sigmas": schedule, "sigmas": sigma.reshape(1)}
        got.append(w.sparse_consumer(settings, dm, args, kwargs, opts))
    assert got == [("sparse", 0.5), ("sparse", 0.5), ("sparse", 0.3), ("sparse", 0.3), ("sparse", 0.5), ("sparse", 0.5)]
    assert w.sparse_consumer(settings, dm, args, kwargs, {}) == ("sparse", 0.3)  # outside a sampler: the video budget
    assert sorted(w.step_budgets["sparse"]) == [(-1, 0)] + [(s, 6) for s in range(6)]


def test_residency_is_off_under_dynamic_vram(comfy: Any) -> None:
    """Under ComfyUI's DynamicVRAM the weights are paged in by comfy-aimdo: the Residency node
    says it does not run and names the switch; the planner streams nothing by itself there."""
    import comfy.model_patcher as mp

    class Dynamic(mp.ModelPatcher):
        def is_dynamic(self) -> bool:
            return True

    dm = make_wan(comfy)
    cpu = torch.device("cpu")
    patcher = Dynamic(Holder(dm), load_device=cpu, offload_device=cpu)
    m, status = comfy_nodes.StreamplanResidency().patch(patcher, "auto", "auto")
    assert "--disable-dynamic-vram" in status, status
    assert comfy_nodes.RESIDENCY_KEY not in m.model_options.get("transformer_options", {})
    planned, _ = comfy_nodes.StreamplanMemoryPlanner().patch(patcher, "none", "comfy", False)
    w = comfy_nodes.planner_of(planned)
    assert w.host_dynamic and w.residency(dm, (), {}, {comfy_nodes.RESIDENCY_KEY: comfy_nodes.ResidencySettings()}) is None
    plain, _ = comfy_nodes.StreamplanMemoryPlanner().patch(mp.ModelPatcher(Holder(dm), load_device=cpu,
                                                                          offload_device=cpu), "none", "comfy", False)
    assert not comfy_nodes.planner_of(plain).host_dynamic
