"""Attention consumers written in Python: one that declares its capabilities runs per Q slab
and knows where each slab lies; one that declares nothing fails closed (streamed Q rejected,
the reasons in the plan) and still computes the original's output."""

from __future__ import annotations

import math
from typing import Any, Iterator

import pytest
import torch
from conftest import flux_call, rel_l2, run_wan, wan_call

import streamplan

Calls = list[tuple[int, int, int, int]]  # (layer, q_start, rows, q_total)


def _attention(calls: Calls) -> Any:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int, q_total: int, layer: int) -> torch.Tensor:
        calls.append((layer, q_start, q.shape[2], q_total))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return scores.softmax(-1) @ v

    return attend


@pytest.fixture
def registered() -> Iterator[Calls]:
    calls: Calls = []
    streamplan.register_consumer(
        "py-exact",
        _attention(calls),
        caps={"accepts_bounded_q": True, "requires_global_k": True, "requires_global_v": True,
              "slab_output": True, "dtypes": ["fp32", "bf16"]},
    )
    streamplan.register_consumer("py-undeclared", _attention(calls))
    yield calls
    streamplan.unregister_consumer("py-exact")
    streamplan.unregister_consumer("py-undeclared")


def test_python_consumer_in_a_pipeline(wan_pipe: Any, registered: Calls) -> None:
    assert {"py-exact", "py-undeclared", "sdpa"} <= set(streamplan.consumers())
    reference = run_wan(wan_pipe)
    handle = streamplan.apply(wan_pipe.transformer, consumer="py-exact", token_chunk=16)
    planned = run_wan(wan_pipe)
    streamplan.remove(wan_pipe.transformer)
    assert rel_l2(planned, reference) <= 1e-4
    assert handle.fallbacks == [] and handle.planned_calls == 6
    # Per call of the module: 2 blocks x (self, cross) attention, each in slabs of 16 of its 72 query rows.
    per_call = registered[: len(registered) // 6]
    starts = [(layer, start, rows) for layer, start, rows, total in per_call]
    assert all(total == 72 for *_, total in per_call)
    slabs = [(0, 16), (16, 16), (32, 16), (48, 16), (64, 8)]
    assert starts == [(layer, s, n) for layer in (0, 0, 1, 1) for s, n in slabs]


def test_python_consumer_that_declares_nothing(flux_module: Any, registered: Calls) -> None:
    call = flux_call(flux_module)
    with torch.no_grad():
        reference = flux_module(**call)[0]
        handle = streamplan.apply(flux_module, consumer="py-undeclared", token_chunk=16)
        out = flux_module(**call)[0]
    assert rel_l2(out, reference) <= 1e-4
    # Whole Q in one call per attention sublayer: 2 double + 2 single blocks over all 55 rows.
    assert [(layer, start, rows) for layer, start, rows, _ in registered] == [(b, 0, 55) for b in range(4)]
    attn = handle.to_dict()["plan"]["blocks"][0]["sublayers"][0]
    streamed = next(t for t in attn["transformations"] if t["transformation"] == "global K/V + streamed Q")
    assert not streamed["chosen"]
    codes = {r["code"]: r["actual"] for r in streamed["rejections"]}
    assert codes == {"consumer.bounded_q": "undeclared", "consumer.declares_global_k": "undeclared",
                     "consumer.declares_global_v": "undeclared", "consumer.slab_output": "undeclared",
                     "consumer.dtype": "not accepted"}
    assert "rejected by consumer 'py-undeclared'" in handle.explain()


def test_a_consumer_returning_the_wrong_slab_is_an_error(wan_module: Any) -> None:
    streamplan.register_consumer("py-wrong", lambda q, k, v, s, t, layer: q[..., :1], caps={})
    try:
        streamplan.apply(wan_module, consumer="py-wrong")
        with torch.no_grad(), pytest.raises(ValueError, match="py-wrong.*returned.*expected the Q slab"):
            wan_module(**wan_call(wan_module))
    finally:
        streamplan.remove(wan_module)
        streamplan.unregister_consumer("py-wrong")


def test_registration_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="registered already"):
        streamplan.register_consumer("sdpa", lambda *a: a[0])
    with pytest.raises(ValueError, match="unknown key 'bounded_q'"):
        streamplan.register_consumer("py-x", lambda *a: a[0], caps={"bounded_q": True})
    with pytest.raises(TypeError, match="caps\\['slab_output'\\]"):
        streamplan.register_consumer("py-x", lambda *a: a[0], caps={"slab_output": "yes"})
    with pytest.raises(ValueError, match="caps\\['dtypes'\\]"):
        streamplan.register_consumer("py-x", lambda *a: a[0], caps={"dtypes": ["int4"]})
    with pytest.raises(ValueError, match="caps\\['call_allocations'\\]: expected an int >= 1, got 0"):
        streamplan.register_consumer("py-x", lambda *a: a[0], caps={"call_allocations": 0})
    with pytest.raises(ValueError, match="no consumer 'py-x'"):
        streamplan.unregister_consumer("py-x")


@pytest.mark.parametrize("strided", [True, False])
def test_python_consumer_with_strided_heads(wan_pipe: Any, strided: bool) -> None:
    """A consumer that takes strided heads gets token-major views (and V without its
    head-major copy); one that does not gets contiguous head-major tensors. Both compute
    the original's output."""
    layouts: list[tuple[bool, bool, bool]] = []

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: Any) -> torch.Tensor:
        layouts.append((q.is_contiguous(), k.is_contiguous(), v.is_contiguous()))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    streamplan.register_consumer("py-strided", attend, caps={
        "accepts_bounded_q": True, "requires_global_k": True, "requires_global_v": True, "slab_output": True,
        "strided_heads": strided, "dtypes": ["fp32", "bf16"]})
    try:
        reference = run_wan(wan_pipe)
        handle = streamplan.apply(wan_pipe.transformer, consumer="py-strided", token_chunk=16)
        planned = run_wan(wan_pipe)
        programs = handle.to_dict()["programs"]
        streamplan.remove(wan_pipe.transformer)
    finally:
        streamplan.unregister_consumer("py-strided")
    assert rel_l2(planned, reference) <= 1e-4
    assert handle.fallbacks == [] and layouts
    # Several heads per row: token-major views are strided, head-major tensors contiguous.
    assert set(layouts) == ({(False, False, False)} if strided else {(True, True, True)})
    # V's slab buffer (projected, then copied head-major) exists only for head-major V.
    v_slabs = [b for p in programs for b in p["buffers"] if b["label"] == "v"]
    assert (v_slabs == []) == strided
    # V token-major [rows, heads * head_dim], or head-major [heads, rows, head_dim].
    assert {len(b["shape"]) for p in programs for b in p["buffers"] if b["label"] == "V"} == ({2} if strided else {3})
