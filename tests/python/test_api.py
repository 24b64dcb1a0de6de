"""The package's API: attaching and detaching, errors that name what was wrong, and the plans
as text and as the JSON of `streamplan plan --explain --json`."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from conftest import flux_call, wan_call

import streamplan


def test_package_metadata() -> None:
    assert streamplan.__version__.count(".") == 2
    assert "sdpa" in streamplan.consumers()
    assert streamplan._C.torch_version == torch.__version__.split("+")[0]


def test_signature_and_handle(wan_module: Any) -> None:
    before = inspect.signature(wan_module.forward)
    handle = streamplan.apply(wan_module, budget="512MiB", consumer="math")
    assert inspect.signature(wan_module.forward) == before
    assert streamplan.handle_of(wan_module) is handle
    assert handle.consumer == "math" and handle.budget == "512MiB"
    assert handle.config["heads"] == 2 and handle.config["head_dim"] == 32
    assert "WanTransformer3DModel as" in repr(handle)
    handle.remove()
    assert streamplan.handle_of(wan_module) is None


def test_unsupported_module() -> None:
    with pytest.raises(ValueError, match="not supported.*WanTransformer3DModel"):
        streamplan.apply(torch.nn.Linear(4, 4))
    with pytest.raises(TypeError, match="module"):
        streamplan.apply("transformer")  # type: ignore[arg-type]


def test_attached_twice_and_removed_twice(wan_module: Any) -> None:
    streamplan.apply(wan_module)
    with pytest.raises(ValueError, match="attached already"):
        streamplan.apply(wan_module)
    streamplan.remove(wan_module)
    with pytest.raises(ValueError, match="not attached"):
        streamplan.remove(wan_module)


def test_bad_options_name_the_option(wan_module: Any) -> None:
    with pytest.raises(ValueError, match="budget.*12 parsecs|12 parsecs.*budget"):
        streamplan.apply(wan_module, budget="12 parsecs")
    with pytest.raises(ValueError, match="nonesuch"):
        streamplan.apply(wan_module, consumer="nonesuch")
    with pytest.raises(TypeError, match="budget"):
        streamplan.apply(wan_module, budget=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="token_chunk"):
        streamplan.apply(wan_module, token_chunk=-3)
    assert streamplan.handle_of(wan_module) is None and "forward" not in wan_module.__dict__


def test_unrecognizable_module(wan_module: Any) -> None:
    wan_module.register_parameter("stray", torch.nn.Parameter(torch.zeros(2)))
    with pytest.raises(streamplan.RecognizeError, match="stray"):
        streamplan.apply(wan_module)


def test_budget_below_the_smallest_peak(flux_module: Any) -> None:
    streamplan.apply(flux_module, budget=1024)
    with torch.no_grad(), pytest.raises(streamplan.BudgetError, match="smallest"):
        flux_module(**flux_call(flux_module))


def test_explain_and_to_dict(flux_module: Any) -> None:
    handle = streamplan.apply(flux_module, token_chunk=16)
    with pytest.raises(ValueError, match="no plan yet"):
        handle.explain()
    with torch.no_grad():
        flux_module(**flux_call(flux_module))
    text = handle.explain()
    assert "FluxTransformer2DModel as" in text and "geometry: txt 7, img 48 (fp32)" in text
    d = handle.to_dict()
    assert {"model", "tokens", "device", "dtype", "planned", "floor_bytes", "plan", "programs"} <= set(d)
    assert d["tokens"] == 55 and d["dtype"] == "fp32"
    assert d["planned"]["estimated_peak_bytes"] == handle.plans[0]["estimated_peak_bytes"] > 0
    assert d["plan"]["estimated_ms"] == handle.plans[0]["estimated_ms"] > 0
    assert d == handle.to_dict(handle.plans[0]["key"])
    # which weights each sublayer holds for the block and which it acquires per slab
    mlp = d["plan"]["blocks"][0]["sublayers"][-1]
    assert mlp["held_weights"] + mlp["slab_weights"] and all(
        w.startswith("double_blocks.0.") for w in mlp["held_weights"] + mlp["slab_weights"])
    assert "weights held for the block:" in text or "weights acquired per slab:" in text
    with pytest.raises(ValueError, match="no plan for it"):
        handle.to_dict("img 1 (fp64)")


def test_return_dict_and_output_class(wan_module: Any) -> None:
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    call = {**wan_call(wan_module), "return_dict": True}
    with torch.no_grad():
        reference = wan_module(**call)
        streamplan.apply(wan_module)
        out = wan_module(**call)
        streamplan.remove(wan_module)
    assert isinstance(out, Transformer2DModelOutput)
    assert out.sample.shape == reference.sample.shape and out.sample.dtype == reference.sample.dtype
    assert float((out.sample - reference.sample).norm() / reference.sample.norm()) <= 1e-4


def test_consumer_that_declares_nothing_fails_closed(flux_module: Any) -> None:
    """'whole' declares no capabilities: streamed Q is rejected, with the reasons in the plan,
    and the output is still the original's."""
    call = flux_call(flux_module)
    with torch.no_grad():
        reference = flux_module(**call)[0]
        handle = streamplan.apply(flux_module, consumer="whole", token_chunk=16)
        out = flux_module(**call)[0]
    assert float((out - reference).norm() / reference.norm()) <= 1e-4
    attn = handle.to_dict()["plan"]["blocks"][0]["sublayers"][0]
    streamed = next(t for t in attn["transformations"] if t["transformation"] == "global K/V + streamed Q")
    assert not streamed["chosen"]
    assert {r["code"] for r in streamed["rejections"]} >= {"consumer.bounded_q", "consumer.slab_output"}
    assert all(r["actual"] == "undeclared" for r in streamed["rejections"])
    assert "[consumer.bounded_q]" in handle.explain()
