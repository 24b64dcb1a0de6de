"""The package's messages name the Python arguments (not the command's options), say each
thing once, and a call under autograd that runs the original forward warns once per module."""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
import torch
from conftest import flux_call, wan_call

import streamplan


def _message(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(excinfo.value)
    assert "--" not in text, text  # no command-line option names
    return text


def test_budget_error_names_the_argument_once(wan_module: Any) -> None:
    for bad, why in (("abc", "no number"), ("8 parsecs", "unknown unit 'parsecs'"), ("0", "a budget must be positive")):
        with pytest.raises(ValueError) as e:
            streamplan.apply(wan_module, budget=bad)
        text = _message(e)
        assert re.fullmatch(rf"budget: cannot use '{bad}': {re.escape(why)} \(expected bytes, .*\)", text), text
        assert streamplan.handle_of(wan_module) is None


def test_device_memory_error_names_the_argument_once(wan_module: Any) -> None:
    with pytest.raises(ValueError) as e:
        streamplan.apply(wan_module, device_memory="8 parsecs")
    text = _message(e)
    expected = r"device_memory: cannot use '8 parsecs': unknown unit 'parsecs' \(expected bytes, .*\)"
    assert re.fullmatch(expected, text), text


def test_a_budget_below_the_smallest_peak_says_budget_once(flux_module: Any) -> None:
    streamplan.apply(flux_module, budget=1024)
    with torch.no_grad(), pytest.raises(streamplan.BudgetError) as e:
        flux_module(**flux_call(flux_module))
    text = _message(e)
    assert re.match(r"budget [0-9.]+ [A-Za-z]+ is below the smallest achievable peak ", text), text
    assert "budget: budget" not in text, text


def test_device_error_names_the_argument(wan_module: Any) -> None:
    with pytest.raises(ValueError) as e:
        streamplan.apply(wan_module, device="bogus")
    assert _message(e) == "device: expected cpu, cuda, cuda:N or auto, got 'bogus'"
    assert streamplan.handle_of(wan_module) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")
def test_device_error_without_cuda_names_the_argument(wan_module: Any) -> None:
    for kwargs in ({"device": "cuda"}, {"device": "cuda", "device_memory": "1GiB"}):
        with pytest.raises(ValueError) as e:
            streamplan.apply(wan_module, **kwargs)
        assert _message(e) == "device='cuda': no CUDA device is available in this build or machine"


def test_kv_budget_errors_name_the_arguments() -> None:
    with pytest.raises(ValueError) as e:
        streamplan.kv_budget_at(0, 10, 1.5)
    assert _message(e) == "budget: a fraction in (0, 1], got 1.500000"
    with pytest.raises(ValueError) as e:
        streamplan.kv_budget_at(0, 10, 0.5, early_kv=0)
    assert _message(e) == "early_kv: a fraction in (0, 1], got 0.000000"
    with pytest.raises(ValueError) as e:
        streamplan.kv_budget_at(11, 10, 0.3)
    assert _message(e) == "step=11 of steps=10: expected 0 <= step < steps"


def _autograd_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "fallback autograd" in str(w.message)]


def test_autograd_fallback_warns_once_per_module(wan_module: Any, flux_module: Any) -> None:
    call = wan_call(wan_module)
    handle = streamplan.apply(wan_module)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                wan_module(**call)  # gradients enabled, the parameters require grad
        assert [f.code for f in handle.fallbacks] == ["autograd"] * 3 and handle.planned_calls == 0
        reason = handle.fallbacks[0].reason
        assert reason.startswith("gradients are enabled and ") and "requires grad" in reason, reason
        assert _autograd_warnings(caught) == [
            f"streamplan: WanTransformer3DModel ({handle.variant}) runs its original forward, not the planned one "
            f"(fallback autograd): {reason}"]
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            wan_module(**call)
        assert handle.planned_calls == 1 and _autograd_warnings(caught) == []
    finally:
        streamplan.remove(wan_module)

    # Another module warns for itself; here an input requires grad, no parameter does.
    flux_module.requires_grad_(False)
    call = flux_call(flux_module)
    call["hidden_states"].requires_grad_(True)
    handle = streamplan.apply(flux_module)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            flux_module(**call)
            flux_module(**call)
        assert [f.code for f in handle.fallbacks] == ["autograd"] * 2
        assert "argument hidden_states requires grad" in handle.fallbacks[0].reason
        assert _autograd_warnings(caught) == [
            f"streamplan: FluxTransformer2DModel ({handle.variant}) runs its original forward, not the planned "
            f"one (fallback autograd): {handle.fallbacks[0].reason}"]
    finally:
        streamplan.remove(flux_module)
