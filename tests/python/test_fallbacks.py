"""Each reason a call runs the module's original forward: the call's result is the original's
(or the original's own error), and handle.fallbacks records the code and the reason."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from conftest import flux_call, wan_call

import streamplan


def _original(module: Any, call: dict[str, Any], grad: bool = False) -> Any:
    with torch.set_grad_enabled(grad):
        return module(**call)


def _falls_back(module: Any, call: dict[str, Any], code: str, grad: bool = False) -> streamplan.Fallback:
    """The call gives exactly the original's output and records one fallback of `code`."""
    reference = _original(module, call, grad)
    handle = streamplan.apply(module)
    try:
        out = _original(module, call, grad)
    finally:
        streamplan.remove(module)
    assert torch.equal(out[0], reference[0])
    assert [f.code for f in handle.fallbacks] == [code], handle.fallbacks
    assert handle.planned_calls == 0 and handle.calls == 1
    return handle.fallbacks[0]


def _raises_as_original(module: Any, call: dict[str, Any], code: str) -> streamplan.Fallback:
    """The original raises on this call; so does the attached module, recording the fallback."""
    with pytest.raises(Exception) as original:
        _original(module, call)
    handle = streamplan.apply(module)
    try:
        with pytest.raises(type(original.value)):
            _original(module, call)
    finally:
        streamplan.remove(module)
    assert [f.code for f in handle.fallbacks] == [code], handle.fallbacks
    return handle.fallbacks[0]


def test_planned_direct_call_for_comparison(wan_module: Any, flux_module: Any) -> None:
    """The calls below run planned when they carry nothing extra (rel L2 to the original)."""
    for module, call in ((wan_module, wan_call(wan_module, 2)), (flux_module, flux_call(flux_module, 2))):
        reference = _original(module, call)[0]
        handle = streamplan.apply(module)
        out = _original(module, call)[0]
        streamplan.remove(module)
        assert handle.planned_calls == 1 and handle.fallbacks == []
        err = float((out.double() - reference.double()).norm() / reference.double().norm())
        assert err <= 1e-4, err


def test_lora_scale_wan(wan_module: Any) -> None:
    f = _falls_back(wan_module, {**wan_call(wan_module), "attention_kwargs": {"scale": 0.5}}, "lora_scale")
    assert "scale" in f.reason and "0.5" in f.reason


def test_lora_scale_flux(flux_module: Any) -> None:
    _falls_back(flux_module, {**flux_call(flux_module), "joint_attention_kwargs": {"scale": 0.7}}, "lora_scale")


def test_attention_mask(flux_module: Any) -> None:
    call = flux_call(flux_module)
    tokens = call["hidden_states"].shape[1] + call["encoder_hidden_states"].shape[1]
    mask = torch.ones((1, 1, tokens, tokens), dtype=torch.bool)
    f = _falls_back(flux_module, {**call, "joint_attention_kwargs": {"attention_mask": mask}}, "attention_mask")
    assert "attention_mask" in f.reason


def test_controlnet_residuals(flux_module: Any) -> None:
    call = flux_call(flux_module)
    dim = flux_module.config.num_attention_heads * flux_module.config.attention_head_dim
    residual = 0.1 * torch.randn((1, call["hidden_states"].shape[1], dim), generator=torch.Generator().manual_seed(5))
    f = _falls_back(flux_module, {**call, "controlnet_block_samples": [residual]}, "controlnet")
    assert "ControlNet" in f.reason


def test_ip_adapter_embeddings(flux_module: Any) -> None:
    call = {**flux_call(flux_module), "joint_attention_kwargs": {"ip_adapter_image_embeds": [torch.zeros(1, 4)]}}
    _raises_as_original(flux_module, call, "ip_adapter")


def test_unknown_attention_kwargs(wan_module: Any) -> None:
    f = _falls_back(wan_module, {**wan_call(wan_module), "attention_kwargs": {"frobnicate": 1}}, "attention_kwargs")
    assert "frobnicate" in f.reason


def test_image_conditioning(wan_module: Any) -> None:
    call = {**wan_call(wan_module), "encoder_hidden_states_image": torch.zeros(1, 4, 32)}
    _raises_as_original(wan_module, call, "image_conditioning")


def test_per_token_timestep(wan_module: Any) -> None:
    call = wan_call(wan_module)
    tokens = 3 * (8 // 2) * (12 // 2)
    call["timestep"] = torch.linspace(700.0, 760.0, tokens)[None]
    f = _falls_back(wan_module, call, "per_token_timestep")
    assert str([1, tokens]) in f.reason


def test_arguments_that_do_not_fit(wan_module: Any) -> None:
    call = wan_call(wan_module)
    del call["encoder_hidden_states"]
    f = _raises_as_original(wan_module, call, "arguments")
    assert "encoder_hidden_states" in f.reason


def test_autograd(wan_module: Any) -> None:
    f = _falls_back(wan_module, wan_call(wan_module), "autograd", grad=True)
    assert "torch.no_grad()" in f.reason


def test_hooks_on_submodules(wan_module: Any) -> None:
    seen: list[int] = []
    hook = wan_module.blocks[1].register_forward_hook(lambda m, i, o: seen.append(1))
    f = _falls_back(wan_module, wan_call(wan_module), "hooks")
    hook.remove()
    assert "blocks.1" in f.reason and len(seen) == 2


def test_changed_attention_processor(wan_module: Any) -> None:
    attn = wan_module.blocks[0].attn1
    other: Callable[..., Any] = type("OtherProcessor", (type(attn.processor),), {})()
    reference = _original(wan_module, wan_call(wan_module))
    handle = streamplan.apply(wan_module)
    attn.set_processor(other)
    out = _original(wan_module, wan_call(wan_module))
    streamplan.remove(wan_module)
    assert [f.code for f in handle.fallbacks] == ["attention_processor"]
    assert "blocks.0.attn1" in handle.fallbacks[0].reason and "OtherProcessor" in handle.fallbacks[0].reason
    assert torch.equal(out[0], reference[0])


def test_module_changed_beyond_recognition(wan_module: Any) -> None:
    call = wan_call(wan_module)
    reference = _original(wan_module, call)
    handle = streamplan.apply(wan_module)
    wan_module.register_parameter("extra", torch.nn.Parameter(torch.zeros(3)))
    out = _original(wan_module, call)
    out_again = _original(wan_module, call)
    del wan_module.extra
    planned = _original(wan_module, call)  # recognized as attached again: planned
    streamplan.remove(wan_module)
    assert torch.equal(out[0], reference[0]) and torch.equal(out_again[0], reference[0])
    assert [f.code for f in handle.fallbacks] == ["module_changed", "module_changed"]
    assert "extra" in handle.fallbacks[0].reason
    assert handle.planned_calls == 1
    assert float((planned[0] - reference[0]).norm() / reference[0].norm()) <= 1e-4
