"""streamplan attached to ComfyUI's WanModel and Flux on tiny random weights, fp32 on the CPU:
the planned call answers what the original forward answers (rel L2 1e-4, same shape and dtype),
for batches of 2 with per-element timesteps (a CFG batch), on the module's own parameters;
each call ComfyUI's planned forward does not model runs the original with its fallback code;
remove() restores the original forward bit for bit.

Needs a ComfyUI source tree (.deps/comfyui-full, else the snapshot ../shared/comfyui-*) with what
its imports need (requirements.txt, or under .deps/comfy-site); without them every test is skipped
with the reason.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from conftest import make_reference, rel_l2

import streamplan

import comfy_tree  # noqa: E402  (tests/reference, on the path through conftest)

TOL = 1e-4


@pytest.fixture(scope="module")
def comfy() -> Any:
    with comfy_tree.isolated(comfy_tree.FULL_SITE, comfy_tree.FULL_TREE):
        yield comfy_tree.wan_flux_modules()


def make_wan(comfy: Any) -> torch.nn.Module:
    wan, _, ops = comfy
    m = wan.WanModel(model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=64, ffn_dim=96, freq_dim=32, text_dim=32,
                     out_dim=16, num_heads=2, num_layers=2, qk_norm=True, cross_attn_norm=True, eps=1e-6,
                     operations=ops.disable_weight_init, dtype=torch.float32, device="cpu")
    make_reference.randomize(m, torch.Generator().manual_seed(0))
    return m.eval().requires_grad_(False)


def make_flux(comfy: Any, guidance: bool = True) -> torch.nn.Module:
    _, flux, ops = comfy
    # Newer trees' FluxParams also name the text positions' rope axes (none for Flux.1, as
    # ComfyUI's model detection sets it)
    newer = {"txt_ids_dims": []} if "txt_ids_dims" in getattr(flux.FluxParams, "__dataclass_fields__", {}) else {}
    m = flux.Flux(in_channels=16, out_channels=16, vec_in_dim=24, context_in_dim=32, hidden_size=32, mlp_ratio=4.0,
                  num_heads=2, depth=2, depth_single_blocks=2, axes_dim=[4, 6, 6], theta=10000, patch_size=2,
                  qkv_bias=True, guidance_embed=guidance, operations=ops.disable_weight_init, dtype=torch.float32,
                  device="cpu", **newer)
    make_reference.randomize(m, torch.Generator().manual_seed(1))
    return m.eval().requires_grad_(False)


def wan_call(**extra: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 16, 3, 8, 12, generator=g)
    return (x, torch.tensor([730.0, 730.0]), torch.randn(2, 7, 32, generator=g)), {"transformer_options": {}, **extra}


def flux_call(**extra: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 16, 12, generator=g)
    kwargs = {"y": torch.randn(2, 24, generator=g), "guidance": torch.tensor([3.5, 3.5]), "transformer_options": {}}
    return (x, torch.tensor([0.73, 0.4]), torch.randn(2, 5, 32, generator=g)), {**kwargs, **extra}


def run(m: torch.nn.Module, call: tuple[tuple[Any, ...], dict[str, Any]]) -> torch.Tensor:
    args, kwargs = call
    with torch.no_grad():
        return m(*args, **{k: (dict(v) if isinstance(v, dict) else v) for k, v in kwargs.items()})


def attached(m: torch.nn.Module, fn: Callable[[torch.nn.Module], Any], **options: Any) -> tuple[Any, Any]:
    handle = streamplan.apply(m, **options)
    try:
        return handle, fn(m)
    finally:
        streamplan.remove(m)


@pytest.mark.parametrize("options", [{}, {"token_chunk": 23}], ids=["default", "chunk23"])
def test_wan_planned_matches_original(comfy: Any, options: dict[str, Any]) -> None:
    m = make_wan(comfy)
    want = run(m, wan_call())
    pointers = {n: p.data_ptr() for n, p in m.named_parameters()}
    handle, got = attached(m, lambda m: run(m, wan_call()), **options)
    assert handle.fallbacks == [] and handle.planned_calls == handle.calls == 1
    assert handle.family == "wan2.1" and handle.layout == "original"
    assert got.shape == want.shape and got.dtype == want.dtype
    err = rel_l2(got, want)
    print(f"ComfyUI WanModel {options}: rel L2 {err:.3e}")
    assert err <= TOL
    assert {n: p.data_ptr() for n, p in m.named_parameters()} == pointers  # the parameters, not copies


@pytest.mark.parametrize("guidance", [True, False], ids=["dev", "schnell"])
def test_flux_planned_matches_original(comfy: Any, guidance: bool) -> None:
    m = make_flux(comfy, guidance)
    call = flux_call() if guidance else flux_call(guidance=None)
    want = run(m, call)
    handle, got = attached(m, lambda m: run(m, call), token_chunk=16)
    assert handle.fallbacks == [] and handle.planned_calls == handle.calls == 1
    assert handle.family == "flux1"
    assert got.shape == want.shape and got.dtype == want.dtype
    err = rel_l2(got, want)
    print(f"ComfyUI Flux guidance={guidance}: rel L2 {err:.3e}")
    assert err <= TOL


def test_flux_without_pooled_vector(comfy: Any) -> None:
    m = make_flux(comfy)
    call = flux_call(y=None)
    want = run(m, call)
    handle, got = attached(m, lambda m: run(m, call))
    assert handle.fallbacks == [] and rel_l2(got, want) <= TOL


def assert_falls_back(m: torch.nn.Module, call: tuple[tuple[Any, ...], dict[str, Any]], code: str) -> None:
    """The call runs the original forward, recorded with `code` (and nothing else)."""
    handle = streamplan.apply(m)
    try:
        try:
            run(m, call)  # the original's own answer (or its own error) for this call
        except Exception:  # noqa: BLE001 - the original may reject what it is given; the record is the point
            pass
    finally:
        streamplan.remove(m)
    assert handle.planned_calls == 0 and [f.code for f in handle.fallbacks] == [code], handle.fallbacks
    print(f"{type(m).__name__} {code}: {handle.fallbacks[0].reason}")


def _patch(m: torch.nn.Module) -> list[int]:
    """Weights patched at cast time, as ComfyUI applies a LoRA under low-VRAM loading: a scaled
    weight and a shifted bias (in place on the copy ComfyUI's cast hands over). Returns the
    patch functions' call counter."""
    calls = [0]

    def scale(w: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return w.mul_(1.01)

    layer = m.blocks[0].self_attn.q if hasattr(m, "blocks") else m.double_blocks[0].img_attn.qkv
    layer.weight_function = [scale]
    layer.bias_function = [lambda b: b + 0.01]
    return calls


@pytest.mark.parametrize("make,call", [(make_wan, wan_call), (make_flux, flux_call)], ids=["wan", "flux"])
def test_weights_patched_at_cast_go_through_comfy_patch_path(comfy: Any, make: Any, call: Any) -> None:
    m = make(comfy)
    weights = {n: t.clone() for n, t in m.state_dict().items()}
    handle = streamplan.apply(m)
    try:
        plain = run(m, call())  # attached before ComfyUI patches anything: no hook yet
        calls = _patch(m)
        want = m.__class__.forward(m, *call()[0], **call()[1])  # the original, through ComfyUI's cast
        got = run(m, call())  # the patches are seen: attached again, with ComfyUI's patch path
    finally:
        streamplan.remove(m)
    assert handle.fallbacks == [] and handle.planned_calls == 2
    err = rel_l2(got, want)
    print(f"{type(m).__name__} with weight_function: rel L2 {err:.3e} (unpatched {rel_l2(plain, want):.3e})")
    assert err <= TOL < rel_l2(plain, want)
    assert calls[0] >= 2  # the original's cast and the planned acquire both patched
    assert all(torch.equal(weights[n], t) for n, t in m.state_dict().items())  # the module's weights untouched


# (module, fallback code) -> what the call changes: keyword arguments, and "timestep_2d",
# "odd" (a side the patch does not divide), "txt_ids_dims" (set on the model's params).
FALLBACKS = {
    ("wan", "image_conditioning"): dict(clip_fea=torch.zeros(2, 257, 1280)),
    ("wan", "condition_frames"): dict(time_dim_concat=torch.zeros(2, 16, 1, 8, 12)),
    ("wan", "per_token_timestep"): dict(timestep_2d=True),
    ("wan", "block_patch"): dict(transformer_options={"patches_replace": {"dit": {("double_block", 0): lambda a, b: b}}}),
    ("wan", "attention_override"): dict(transformer_options={"optimized_attention_override": lambda *a, **k: None}),
    ("wan", "wrappers"): dict(transformer_options={"wrappers": {"diffusion_model": {"x": [lambda e, *a, **k: e(*a, **k)]}}}),
    ("wan", "arguments"): dict(odd=True),
    ("flux", "reference_latents"): dict(ref_latents=[torch.zeros(1, 16, 16, 12)]),
    ("flux", "controlnet"): dict(control={"input": [], "output": []}),
    ("flux", "attention_mask"): dict(attention_mask=torch.ones(2, 5 + 48, 5 + 48, dtype=torch.bool)),
    ("flux", "patches"): dict(transformer_options={"patches": {"post_input": [lambda a: a]}}),
    ("flux", "arguments"): dict(guidance=None),
    ("flux", "config"): dict(txt_ids_dims=[2]),
}


@pytest.mark.parametrize("which,code", sorted(FALLBACKS), ids=[f"{w}-{c}" for w, c in sorted(FALLBACKS)])
def test_fallbacks(comfy: Any, which: str, code: str) -> None:
    m = make_wan(comfy) if which == "wan" else make_flux(comfy)
    spec = dict(FALLBACKS[(which, code)])
    args, kwargs = wan_call() if which == "wan" else flux_call()
    if spec.pop("timestep_2d", False):
        args = (args[0], torch.full((2, 72), 730.0), args[2])
    if spec.pop("odd", False):
        args = (args[0][..., :11], *args[1:])
    if "txt_ids_dims" in spec:  # text positions on a rope axis (the newer Flux variants' models)
        if not hasattr(m.params, "txt_ids_dims"):
            pytest.skip("this ComfyUI tree's FluxParams has no txt_ids_dims")
        m.params.txt_ids_dims = spec.pop("txt_ids_dims")
    kwargs.update(spec)
    assert_falls_back(m, (args, kwargs), code)


@pytest.mark.parametrize("make,call", [(make_wan, wan_call), (make_flux, flux_call)], ids=["wan", "flux"])
def test_remove_restores_the_original_forward(comfy: Any, make: Any, call: Any) -> None:
    m = make(comfy)
    before = run(m, call())
    streamplan.apply(m)
    run(m, call())
    streamplan.remove(m)
    assert "forward" not in m.__dict__
    assert torch.equal(run(m, call()), before)
