"""Weight residency from Python: `apply(..., device_memory=, resident_blocks=)` streams the
blocks' weights from host memory and gives the all-resident output exactly; what does not fit,
or cannot stream, is an error naming it."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch
from conftest import flux_call, make_flux_transformer, wan_call
from test_lora import wan_lora

import streamplan


def _planned(module: Any, call: dict[str, Any], **options: Any) -> tuple[torch.Tensor, streamplan.Handle]:
    handle = streamplan.apply(module, **options)
    with torch.no_grad():
        out = module(**call)
        again = module(**call)  # the rotation carries over from call to call
    streamplan.remove(module)
    assert torch.equal(out[0], again[0])
    return out[0], handle


@pytest.mark.parametrize("resident", [1, 2, "auto"])
def test_streamed_equals_resident_exactly(wan_module: Any, resident: Any) -> None:
    call = wan_call(wan_module)
    reference, _ = _planned(wan_module, call)
    out, handle = _planned(wan_module, call, resident_blocks=resident)
    assert torch.equal(out, reference)
    r = handle.residency
    assert r is not None and handle.streams and handle.fallbacks == []
    layers = handle.config["layers"]
    if resident != "auto":
        assert r["resident_blocks"] <= resident and len(r["streamed_blocks"]) == layers - r["kept_blocks"]
        assert (r["slots"] > 0) == (resident < layers)


def test_device_memory_picks_more_kept_blocks_as_it_grows() -> None:
    module = make_flux_transformer("dev")
    call = flux_call(module)
    reference, _ = _planned(module, call)
    kept = []
    for size in (300_000, 400_000, "1GiB"):  # the test model's blocks weigh about 0.1 MiB each
        out, handle = _planned(module, call, device_memory=size)
        assert torch.equal(out, reference)
        r = handle.residency
        assert r["device_memory_bytes"] == (size if isinstance(size, int) else streamplan._C.parse_budget(size))
        assert r["planned_device_bytes"] <= r["device_memory_bytes"]
        kept.append(r["kept_blocks"])
    assert kept == sorted(kept) and kept[-1] > kept[0]
    assert handle.to_dict()["residency"]["kept_blocks"] == kept[-1]


def test_lora_streams_with_its_blocks(wan_module: Any) -> None:
    lora = (wan_lora(wan_module, "trainer", 4, seed=1), 0.8)
    call = wan_call(wan_module)
    reference, _ = _planned(wan_module, call, lora=[lora])
    out, handle = _planned(wan_module, call, lora=[lora], resident_blocks=1)
    assert torch.equal(out, reference) and handle.lora["adapters"] > 0


def test_hooked_weights_stream_and_the_hook_runs_on_the_streamed_copy(wan_module: Any) -> None:
    """A weight hook on every block's attention weights: under resident_blocks the hooked weights
    stream in their stored form and the hook gets the streamed copy, the same output as with
    every weight resident; the module's own tensors are left as they are."""
    call = wan_call(wan_module)
    names = [n for n, t in wan_module.state_dict().items() if ".attn1." in n and n.endswith(".weight") and t.dim() == 2]
    assert len(names) >= 8, names
    seen: list[tuple[str, str]] = []

    def hook(name: str, w: torch.Tensor) -> torch.Tensor:
        seen.append((name, str(w.device)))
        return w * 1.25

    before = {n: t.clone() for n, t in wan_module.state_dict().items() if n in names}
    plain, _ = _planned(wan_module, call)
    reference, _ = _planned(wan_module, call, weight_hook=hook, hooked=names)
    seen.clear()
    out, handle = _planned(wan_module, call, weight_hook=hook, hooked=names, resident_blocks=1)
    assert handle.streams and handle.fallbacks == [] and len(handle.residency["streamed_blocks"]) >= 1
    assert torch.equal(out, reference) and not torch.allclose(out, plain)
    assert {n for n, _ in seen} == set(names)
    assert all(torch.equal(wan_module.state_dict()[n], t) for n, t in before.items())


def test_device_memory_too_small_names_the_smallest(wan_module: Any) -> None:
    streamplan.apply(wan_module, device_memory=4096)
    with torch.no_grad(), pytest.raises(streamplan.DeviceMemoryError, match="smallest device memory that works is"):
        wan_module(**wan_call(wan_module))


def test_bad_residency_options_name_the_option(wan_module: Any) -> None:
    for bad, match in (({"device_memory": "8 parsecs"}, "device_memory"), ({"device_memory": -1}, "device_memory"),
                       ({"resident_blocks": 0}, "resident_blocks"), ({"resident_blocks": "many"}, "resident_blocks")):
        with pytest.raises(ValueError, match=match):
            streamplan.apply(wan_module, **bad)
    with pytest.raises(TypeError, match="device_memory"):
        streamplan.apply(wan_module, device_memory=1.5)  # type: ignore[arg-type]
    if torch.cuda.is_available():  # a device other than the module's: only where one exists
        with pytest.raises(ValueError, match="device: cuda:0, but the module's tensors are on cpu.*only with device_memory"):
            streamplan.apply(wan_module, device="cuda")
    with pytest.raises(ValueError, match="device.*'meta'"):
        streamplan.apply(wan_module, device="meta", resident_blocks=1)
    assert streamplan.handle_of(wan_module) is None and "forward" not in wan_module.__dict__


def test_a_call_that_cannot_run_planned_raises_instead_of_falling_back(wan_module: Any) -> None:
    handle = streamplan.apply(wan_module, resident_blocks=1)
    call = {**wan_call(wan_module), "attention_kwargs": {"scale": 0.5}}
    with torch.no_grad(), pytest.raises(RuntimeError, match="lora_scale.*cannot run instead"):
        wan_module(**call)
    assert [f.code for f in handle.fallbacks] == ["lora_scale"]


def test_remove_gives_the_handle_and_its_streamed_weights_back(wan_module: Any) -> None:
    handle = streamplan.apply(wan_module, resident_blocks=1)
    with torch.no_grad():
        wan_module(**wan_call(wan_module))
    gone = weakref.ref(handle)
    streamplan.remove(wan_module)
    assert handle.residency is not None  # the plans stay readable
    gc.disable()
    try:
        del handle  # no reference cycle keeps it (nor its buffers) alive
        assert gone() is None
    finally:
        gc.enable()
