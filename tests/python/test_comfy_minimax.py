"""streamplan attached to ComfyUI's MiniMaxH3Model (text to video + audio) on tiny random weights
in the real layout, fp32 on the CPU: the planned call answers what the original forward answers
(video and audio within rel L2 1e-4, in the original's form), the sampler's audio carry is kept,
what the planned forward does not model runs the original with a fallback, and remove() restores
the original forward bit for bit.

Needs a ComfyUI source tree with comfy/ldm/minimax/model.py (.deps/comfyui, else the snapshot
../shared/comfyui-*) and comfy_kitchen (requirements.txt); without them every test is skipped
with the reason.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import pytest
import torch
from conftest import rel_l2

import streamplan

import comfy_tree  # noqa: E402  (tests/reference, on the path through conftest)
import minimax_h3 as h3  # noqa: E402

TOL = 1e-4
MIXED_TAGS = torch.tensor([1, 1, 0, 0, 0, 1, 2, 2, 1])  # video-tagged pads and an audio span in the text


@pytest.fixture(scope="module")
def comfy() -> Any:
    with comfy_tree.isolated(comfy_tree.EXTRA_SITE, comfy_tree.COMFY_TREE):
        yield comfy_tree.minimax_h3_modules()


def attached(m: Any, call: Any, **options: Any) -> tuple[Any, Any]:
    """(handle, what call(m) gives) with streamplan attached to m, removed again after."""
    handle = streamplan.apply(m, **options)
    try:
        return handle, call(m)
    finally:
        streamplan.remove(m)


def build(comfy: Any, cfg: h3.H3Config, seed: int = 3) -> torch.nn.Module:
    """ComfyUI's MiniMaxH3Model with the weights of h3.make_state_dict(cfg), as ComfyUI holds them."""
    model, ops = comfy
    sd = h3.make_state_dict(cfg, seed=seed)
    m = model.MiniMaxH3Model(**h3.comfy_kwargs(cfg), dtype=torch.float32, device="cpu",
                             operations=ops.disable_weight_init)
    heads = {k for k in sd if k.startswith(("final_layer.video_out.", "final_layer.audio_out."))}
    missing, unexpected = m.load_state_dict({k: v for k, v in sd.items() if k not in heads}, strict=False)
    assert not unexpected and sorted(missing) == sorted(heads)
    for k in heads:  # a PDD bank is n heads tall: assigned as ComfyUI's loader assigns it
        head = m.final_layer.video_out if ".video_out." in k else m.final_layer.audio_out
        setattr(head, k.rsplit(".", 1)[1], torch.nn.Parameter(sd[k].clone(), requires_grad=False))
    return m.eval().requires_grad_(False)


def call_args(m: torch.nn.Module, cfg: h3.H3Config, sigma: float = 0.7, tags: torch.Tensor | None = None,
              refined: bool = False, seed: int = 4, **extra: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """One call as ComfyUI's sampler makes it: (x, timestep, context), transformer_options, payload."""
    inp = h3.random_inputs(cfg, seed=seed)
    context = inp["text"][None]
    if refined:  # what ComfyUI's extra_conds hands the model: the refined text
        with torch.no_grad():
            context = m.preprocess_text_embeds(context)
    payload = dict(extra.pop("payload", {}))
    if tags is not None:
        payload["text_token_tags"] = tags
    x = [inp["video"][None], inp["audio"][None]]
    kwargs = {"transformer_options": extra.pop("transformer_options", {}), "minimax_payload": payload, **extra}
    return (x, torch.tensor([sigma * 1000.0]), context), kwargs


def run(m: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    # transformer_options and the payload are fresh per call (the original writes into them)
    kwargs = {k: (dict(v) if isinstance(v, dict) else v) for k, v in kwargs.items()}
    with torch.no_grad():
        out = m(*args, **kwargs)
    assert isinstance(out, list) and len(out) == 2
    return out


CASES = {
    "plain": (h3.TINY, dict(sigma=0.7), {}),
    "plain-tags-refined": (h3.TINY, dict(sigma=0.05, tags=MIXED_TAGS, refined=True), {}),
    "sigma1-tags": (h3.TINY, dict(sigma=1.0, tags=MIXED_TAGS), {}),
    "curve": (replace(h3.TINY, curve_grid=17, time_dim=8, freq_dim=0, time_hidden=0), dict(sigma=0.4), {}),
    "gate_compress-chunk23": (replace(h3.TINY, gate_compress=True), dict(sigma=0.63, tags=MIXED_TAGS),
                              {"token_chunk": 23}),
    "sampler_carry": (h3.TINY, dict(sigma=0.6, tags=MIXED_TAGS,
                                    payload={"audio_scale": h3.SHIFT_VIDEO / h3.SHIFT_AUDIO}), {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_planned_matches_original(comfy: Any, case: str) -> None:
    cfg, call, options = CASES[case]
    comfy_tree.skip_unless_h3_builds(comfy[0], cfg.gate_compress, cfg.pdd_heads)
    m = build(comfy, cfg)
    args, kwargs = call_args(m, cfg, **call)
    want = run(m, args, kwargs)
    handle, got = attached(m, lambda m: run(m, args, kwargs), **options)
    assert handle.fallbacks == [] and handle.planned_calls == handle.calls == 1
    assert handle.family == "minimax-h3"
    for name, g, w in zip(("video", "audio"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        err = rel_l2(g, w)
        print(f"minimax-h3 {case} {name} {list(w.shape)}: rel L2 {err:.3e}")
        assert err <= TOL


def test_bf16_model_with_its_fp32_island_held_in_bf16(comfy: Any) -> None:
    """A bf16 model whose patch projections and output heads (fp32 in ComfyUI's own build) are
    held in bf16, as ComfyUI's mixed-precision loader holds a quantized file's unquantized layers,
    cast to fp32 per call: the planned call runs them the same way, as close to an fp32 model of
    the same weights as the original is."""
    m = build(comfy, h3.TINY)
    args, kwargs = call_args(m, h3.TINY, tags=MIXED_TAGS)
    m16 = build(comfy, h3.TINY).to(torch.bfloat16)
    for mod in m16.modules():
        if hasattr(mod, "comfy_cast_weights"):
            mod.comfy_cast_weights = True  # the weight cast to the input's dtype per call
    m.load_state_dict({k: v.float() for k, v in m16.state_dict().items()})
    want32 = run(m, args, kwargs)
    args16 = ([t.to(torch.bfloat16) for t in args[0]], args[1], args[2].to(torch.bfloat16))
    own = run(m16, args16, kwargs)
    handle, got = attached(m16, lambda mm: run(mm, args16, kwargs))
    assert handle.fallbacks == [] and handle.planned_calls == handle.calls == 1
    for name, g, o, w in zip(("video", "audio"), got, own, want32):
        assert g.dtype == o.dtype == torch.bfloat16
        err, own_err = rel_l2(g.float(), w), rel_l2(o.float(), w)
        print(f"bf16 {name}: planned {err:.3e}, original {own_err:.3e} against fp32")
        assert err <= 2 * own_err + 1e-3


def test_remove_restores_the_original_forward(comfy: Any) -> None:
    m = build(comfy, h3.TINY)
    args, kwargs = call_args(m, h3.TINY, tags=MIXED_TAGS)
    before = run(m, args, kwargs)
    handle = streamplan.apply(m)
    run(m, args, kwargs)
    assert handle.planned_calls == 1
    streamplan.remove(m)
    assert "forward" not in m.__dict__ and streamplan.handle_of(m) is None
    after = run(m, args, kwargs)
    assert all(torch.equal(a, b) for a, b in zip(after, before))


def test_modulation_weights_stay_in_host_memory_where_the_device_memory_is_short(comfy: Any) -> None:
    """Every block's adaln projection is read only by the prologue (the modulation rows of each
    call): with room they are kept on the device; at the smallest device memory that plans they
    stay in host memory and are copied as the prologue reads them, the answer unchanged."""
    m = build(comfy, h3.TINY)
    args, kwargs = call_args(m, h3.TINY, tags=MIXED_TAGS)
    want = run(m, args, kwargs)

    def planned(device_memory: int) -> tuple[Any, list[torch.Tensor]] | None:
        try:
            return attached(m, lambda m: run(m, args, kwargs), device_memory=device_memory)
        except streamplan.DeviceMemoryError:
            return None

    roomy = planned(1 << 34)
    assert roomy is not None
    r = roomy[0].residency
    assert r["prologue_bytes"] > 0 and not r["prologue_copied"] and r["fixed_bytes"] > r["prologue_bytes"], r
    lo, hi = 1, r["planned_device_bytes"]  # lo fails, hi plans
    assert planned(lo) is None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if planned(mid) is not None else (mid, hi)
    handle, got = planned(hi)
    r = handle.residency
    assert r["prologue_copied"] and r["planned_device_bytes"] <= hi, r
    assert "copied to the device as the prologue reads them" in r["explain"], r["explain"]
    for g, w in zip(got, want):
        assert rel_l2(g, w) <= TOL


def test_one_plan_per_geometry(comfy: Any) -> None:
    m = build(comfy, h3.TINY)
    handle = streamplan.apply(m)
    try:
        for sigma in (0.9, 0.5):  # two steps of one geometry: one plan, two calls
            run(m, *call_args(m, h3.TINY, sigma=sigma))
    finally:
        streamplan.remove(m)
    assert handle.planned_calls == 2 and len(handle.plans) == 1 and handle.plans[0]["calls"] == 2


def _block_replace(args: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    return extra["original_block"](args)


def _mask(m: torch.nn.Module, cfg: h3.H3Config, value: float) -> torch.Tensor:
    v = h3.random_inputs(cfg)["video"]
    mask = torch.full((1, 1, *v.shape[1:]), value)
    mask[..., : v.shape[1] // 2, :, :] = 1.0
    return mask


FALLBACKS = {
    "denoise_mask": (h3.TINY, lambda m: dict(denoise_mask=_mask(m, h3.TINY, 0.5))),
    "audio_denoise_mask": (h3.TINY, lambda m: dict(audio_denoise_mask=torch.zeros(1, 1, 2 * 5))),
    "block_patch": (h3.TINY, lambda m: dict(
        transformer_options={"patches_replace": {"dit": {("double_block", 1): _block_replace}}})),
    "pdd_heads": (replace(h3.TINY, pdd_heads=5),
                  lambda m: dict(transformer_options={"sample_sigmas": torch.tensor([1.0, 0.9, 0.7, 0.4, 0.0])})),
    "sigma_shift": (h3.TINY, lambda m: dict(transformer_options={"minimax_h3_sigma_shift_audio": 5.0})),
    "attention_override": (h3.TINY, lambda m: dict(
        transformer_options={"optimized_attention_override": lambda *a, **k: None})),
}


def _outcome(m: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The call's answer, or the type and message of what it raised."""
    try:
        return run(m, args, kwargs)
    except Exception as e:  # noqa: BLE001  the original may refuse the call: the fallback must too
        return type(e), str(e)


@pytest.mark.parametrize("code", sorted(FALLBACKS))
def test_fallback_runs_the_original(comfy: Any, code: str) -> None:
    cfg, extra = FALLBACKS[code]
    m = build(comfy, cfg)
    args, kwargs = call_args(m, cfg, tags=MIXED_TAGS, **extra(m))
    want = _outcome(m, args, kwargs)
    handle, got = attached(m, lambda m: _outcome(m, args, kwargs))
    if code.endswith("denoise_mask") and not comfy_tree.h3_forward_takes(comfy[0], code):
        # A tree whose forward takes no masks leaves them to the sampler: the network ignores
        # one passed among **kwargs, and so does the planned forward.
        assert handle.fallbacks == [] and handle.planned_calls == 1
        assert max(rel_l2(g, w) for g, w in zip(got, want)) <= TOL
        return
    if isinstance(want, list):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    else:
        assert got == want
    assert handle.planned_calls == 0 and handle.calls == 1
    assert [f.code for f in handle.fallbacks] == [code.replace("audio_", "")]
    print(f"{code}: {handle.fallbacks[0].reason}")


def test_mask_that_masks_nothing_runs_planned(comfy: Any) -> None:
    m = build(comfy, h3.TINY)
    args, kwargs = call_args(m, h3.TINY, denoise_mask=_mask(m, h3.TINY, 1.0),
                             audio_denoise_mask=torch.ones(1, 1, 2 * 5))
    want = run(m, args, kwargs)
    handle, got = attached(m, lambda m: run(m, args, kwargs))
    assert handle.fallbacks == [] and handle.planned_calls == 1
    assert max(rel_l2(g, w) for g, w in zip(got, want)) <= TOL


def test_keyframe_condition_rows_fall_back(comfy: Any) -> None:
    cfg = h3.TINY
    m = build(comfy, cfg)
    v = h3.random_inputs(cfg, seed=7)["video"][None, :, :1]  # the first latent frame as a keyframe
    payload = {"keyframes": [{"resolved_frame_index": 0, "latent": v}], "cond_video_latents": [v]}
    args, kwargs = call_args(m, cfg, payload=payload)
    want = _outcome(m, args, kwargs)
    handle, got = attached(m, lambda m: _outcome(m, args, kwargs))
    assert isinstance(want, list) and all(torch.equal(g, w) for g, w in zip(got, want))
    assert [f.code for f in handle.fallbacks] == ["condition_rows"] and handle.planned_calls == 0
