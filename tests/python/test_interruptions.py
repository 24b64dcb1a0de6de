"""A planned call interrupted by an exception (in a weight hook, in a Python attention consumer,
ComfyUI's InterruptProcessingException, KeyboardInterrupt) leaves the module usable: the
exception reaches the caller unchanged, the memory the call took is returned, and the next call
is correct. Two modules attached in one process plan, run and release independently.

Memory is what a window of calls allocated on the CPU and did not free (0 when everything was
returned), as streamplan's counting CPU allocator counts it.
"""

from __future__ import annotations

import gc
import math
from typing import Any, Callable, Iterator

import pytest
import torch
from conftest import make_wan_transformer, rel_l2, wan_call

import streamplan


def kept_bytes(fn: Callable[[], Any]) -> int:
    """Bytes of CPU tensors that fn() made and had not freed when it returned (its result
    dropped), as streamplan's counting CPU allocator counts them."""
    gc.collect()  # what earlier code left for the collector goes before, not inside, the window
    before = streamplan._C.cpu_allocated_bytes()
    fn()
    gc.collect()
    return streamplan._C.cpu_allocated_bytes() - before


def run(module: Any, call: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return module(**call)[0]


class Boom(Exception):
    pass


def raising_once(after: int, fire: Callable[[], None]) -> Callable[[], None]:
    """A function that calls fire() (which raises) on its `after`-th call (from 1), and never again."""
    count = [0]

    def tick() -> None:
        count[0] += 1
        if count[0] == after:
            fire()

    return tick


def raise_(e: BaseException) -> None:
    raise e


def attend_exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int, q_total: int,
                 layer: int) -> torch.Tensor:
    return ((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])).softmax(-1) @ v


@pytest.fixture(scope="module")
def comfy_mm() -> Iterator[Any]:
    import comfy_tree

    with comfy_tree.isolated(comfy_tree.FULL_SITE, comfy_tree.FULL_TREE):
        comfy_tree.wan_flux_modules()
        import comfy.model_management as mm

        yield mm


KINDS = ["weight_hook", "consumer", "keyboard_interrupt", "comfy_interrupt"]


@pytest.mark.parametrize("kind", KINDS)
def test_interrupted_call_leaves_the_module_usable(kind: str, request: pytest.FixtureRequest) -> None:
    fire: Callable[[], None]
    if kind == "comfy_interrupt":  # as ComfyUI raises it when the user cancels the prompt
        mm = request.getfixturevalue("comfy_mm")
        fire = lambda: (mm.interrupt_current_processing(True), mm.throw_exception_if_processing_interrupted())  # noqa: E731
        want_type: type[BaseException] = mm.InterruptProcessingException
    elif kind == "keyboard_interrupt":
        fire, want_type = (lambda: raise_(KeyboardInterrupt())), KeyboardInterrupt
    else:
        fire, want_type = (lambda: raise_(Boom(kind))), Boom
    module = make_wan_transformer()
    call = wan_call(module)
    reference = run(module, call)
    armed: list[Callable[[], None]] = [lambda: None]

    def hook(name: str, t: torch.Tensor) -> torch.Tensor:
        if kind == "weight_hook":
            armed[0]()
        return t

    def attend(*args: Any) -> torch.Tensor:
        if kind != "weight_hook":
            armed[0]()
        return attend_exact(*args)

    streamplan.register_consumer("py-interrupted", attend, caps={"accepts_bounded_q": True, "slab_output": True,
                                                                   "dtypes": ["fp32"]})
    try:
        handle = streamplan.apply(module, consumer="py-interrupted", token_chunk=16, weight_hook=hook)
        first = run(module, call)  # the plan made, the memory it keeps between calls taken
        assert rel_l2(first, reference) <= 1e-4 and handle.planned_calls == 1
        # raised in the middle of the call: the 5th weight acquired / the 3rd attention slab
        armed[0] = raising_once(5 if kind == "weight_hook" else 3, fire)
        caught: list[BaseException] = []

        def interrupted() -> None:
            try:
                run(module, call)
            except BaseException as e:  # noqa: BLE001 - the test checks it below
                caught.append(type(e))
        # nothing kept (earlier tests' memory may go meanwhile: at most 0)
        assert kept_bytes(interrupted) <= 0
        assert caught == [want_type], caught
        after: list[torch.Tensor] = []
        assert kept_bytes(lambda: after.append(run(module, call).clone()) and None) <= after[0].nbytes
        assert rel_l2(after[0], reference) <= 1e-4
        assert handle.calls == 3 and handle.planned_calls == 2 and handle.fallbacks == []
        streamplan.remove(module)
        assert torch.equal(run(module, call), reference)
    finally:
        streamplan.unregister_consumer("py-interrupted")


def test_two_handles_plan_run_and_release_independently() -> None:
    a, b = make_wan_transformer(seed=0), make_wan_transformer(seed=1)
    call_a, call_b = wan_call(a), wan_call(b, batch=2)
    want_a, want_b = run(a, call_a), run(b, call_b)
    ha = streamplan.apply(a, token_chunk=16)
    hb = streamplan.apply(b)
    for _ in range(2):  # interleaved calls of the two
        assert rel_l2(run(a, call_a), want_a) <= 1e-4
        assert rel_l2(run(b, call_b), want_b) <= 1e-4
    assert (ha.calls, hb.calls) == (2, 2) and ha.planned_calls == 2 and hb.planned_calls == 2
    # one plan each, for its own options (token_chunk 16 against none) and batch (1 against 2)
    assert [p["calls"] for p in ha.plans] == [2] and [p["calls"] for p in hb.plans] == [4]
    assert ha.plans[0]["estimated_peak_bytes"] < hb.plans[0]["estimated_peak_bytes"]
    streamplan.remove(a)
    assert streamplan.handle_of(a) is None and streamplan.handle_of(b) is hb
    assert torch.equal(run(a, call_a), want_a)
    assert rel_l2(run(b, call_b), want_b) <= 1e-4 and hb.calls == 3
    streamplan.remove(b)
    assert torch.equal(run(b, call_b), want_b)
