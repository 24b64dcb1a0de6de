"""Every weight format ComfyUI loads, through ComfyUI's own loader, sampled by ComfyUI with and
without streamplan's node: tiny WanModel, Flux and MiniMaxH3Model checkpoints (fp32, random) are
written in each format by `streamplan convert`, loaded by comfy.sd.load_diffusion_model_state_dict,
and run by ComfyUI's sampler (comfy.sample.sample, 2 steps; MiniMax H3 on its joint video + audio
latent, whose audio the sampler carries on the video schedule). Each planned call runs with no fallback and its output agrees with
ComfyUI's own: on the CPU within 2x ComfyUI's own error against an fp32 model holding the same
dequantized weights (and 1e-5, fp32's noise). A layout streamplan does not run falls back with
its name; LoRA loaded by ComfyUI's loader on quantized weights runs planned too.

The dimensions are ComfyUI's detection's smallest: heads of 128 (Wan, Flux), Flux's 24 heads
given to its detection as hidden // 128 (the only change to ComfyUI's loading).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import rel_l2

import comfy_formats as cf  # noqa: E402  (tests/reference, on the path through conftest)
import comfy_tree  # noqa: E402
import make_reference  # noqa: E402
import minimax_h3 as h3  # noqa: E402

import streamplan
from streamplan import _module_state, comfy_nodes

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("STREAMPLAN_CLI", ROOT / "build" / "streamplan"))
FORMATS = cf.FORMATS
H3_TINY = h3.COMFY_TINY
FLOOR = 1e-5


@pytest.fixture(scope="module")
def comfy() -> Any:
    with comfy_tree.isolated(comfy_tree.FULL_SITE, comfy_tree.FULL_TREE):
        comfy_tree.wan_flux_modules()
        try:
            import comfy.sample
            import comfy.sd
            import comfy.utils
            import comfy.model_detection
            import comfy.ldm.minimax.model  # noqa: F401
        except Exception as e:  # noqa: BLE001 - an incomplete tree: say so rather than pass
            pytest.skip(f"cannot import ComfyUI's loader and sampler from {comfy_tree.FULL_TREE}: {e!r}")
        yield comfy


@pytest.fixture(scope="module")
def tiny_detection(comfy: Any) -> Any:
    """ComfyUI's model detection, with Flux's heads counted as hidden // 128 (it fixes 24)."""
    md = comfy.model_detection
    original = md.detect_unet_config

    def detect(state_dict: Any, key_prefix: str, metadata: Any = None) -> Any:
        cfg = original(state_dict, key_prefix, metadata=metadata)
        if cfg and cfg.get("image_model") == "flux":
            cfg["num_heads"] = cfg["hidden_size"] // 128
        return cfg

    md.detect_unet_config = detect
    try:
        yield
    finally:
        md.detect_unet_config = original


def _source(comfy: Any, family: str, tmp: Path) -> Path:
    """An fp32 random checkpoint of the family in its original layout."""
    path = tmp / f"{family}.safetensors"
    if path.exists():
        return path
    import comfy.ops as ops
    from safetensors.torch import save_file

    if family == "minimax-h3":
        sd = h3.make_state_dict(H3_TINY, seed=3)
    else:
        if family == "wan":
            import comfy.ldm.wan.model as wm

            m = wm.WanModel(model_type="t2v", patch_size=(1, 2, 2), text_len=512, in_dim=16, dim=256, ffn_dim=512,
                            freq_dim=256, text_dim=4096, out_dim=16, num_heads=2, num_layers=2, qk_norm=True,
                            cross_attn_norm=True, eps=1e-6, operations=ops.disable_weight_init, dtype=torch.float32,
                            device="cpu")
        else:
            import comfy.ldm.flux.model as fm

            m = fm.Flux(in_channels=16, out_channels=16, vec_in_dim=768, context_in_dim=64, hidden_size=256,
                        mlp_ratio=4.0, num_heads=2, depth=1, depth_single_blocks=1, axes_dim=[16, 56, 56],
                        theta=10000, patch_size=2, qkv_bias=True, guidance_embed=False, txt_ids_dims=[],
                        operations=ops.disable_weight_init, dtype=torch.float32, device="cpu")
        make_reference.randomize(m, torch.Generator().manual_seed(1))
        sd = {k: v.detach().contiguous() for k, v in m.state_dict().items()}
    save_file(sd, str(path))
    return path


def _convert(src: Path, fmt: str) -> Path:
    return cf.convert(CLI, src, fmt)


def _load(comfy: Any, path: Path, dtype: torch.dtype | None, state_dict: dict | None = None) -> Any:
    return cf.load(comfy, path, dtype, state_dict)


def _sample(comfy: Any, mp: Any, family: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    if family == "minimax-h3":
        # the joint latent as ComfyUI's EmptyMiniMaxH3LatentAV makes it (video, audio), 5 frames
        import comfy.nested_tensor

        latent = comfy.nested_tensor.NestedTensor((torch.zeros(1, 24, 2, 4, 6), torch.zeros(1, 32, 2, 8)))
        noise = comfy.nested_tensor.NestedTensor([torch.randn(t.shape, generator=g) for t in latent.unbind()])
        context = torch.randn(1, 9, H3_TINY.text_dim, generator=g)
        out = comfy.sample.sample(mp, noise, 2, 2.0, "euler", "simple", [[context, {}]],
                                  [[torch.zeros_like(context), {}]], latent, denoise=1.0, seed=0, disable_pbar=True)
        return torch.cat([t.flatten().float() for t in out.unbind()])
    if family == "wan":
        latent = torch.zeros(1, 16, 3, 8, 12)
        context = torch.randn(1, 7, 4096, generator=g)
        positive, negative = [[context, {}]], [[torch.zeros_like(context), {}]]
    else:
        latent = torch.zeros(1, 16, 16, 12)
        context = torch.randn(1, 5, 64, generator=g)
        pooled = torch.randn(1, 768, generator=g)
        positive = [[context, {"pooled_output": pooled}]]
        negative = [[torch.zeros_like(context), {"pooled_output": torch.zeros_like(pooled)}]]
    noise = torch.randn(latent.shape, generator=g)
    return comfy.sample.sample(mp, noise, 2, 2.0, "euler", "simple", positive, negative, latent, denoise=1.0,
                               seed=0, disable_pbar=True).float()


def _call_wan(comfy: Any, mp: Any, family: str) -> torch.Tensor:
    """One call of the WanModel as ComfyUI's sampler makes it (the patcher's wrappers in
    transformer_options), without loading the model again."""
    g = torch.Generator().manual_seed(6)
    x, ctx = torch.randn(1, 16, 3, 8, 12, generator=g), torch.randn(1, 7, 4096, generator=g)
    opts = {**mp.model_options.get("transformer_options", {}), "wrappers": mp.wrappers}
    with torch.no_grad():
        return mp.model.diffusion_model(x, torch.tensor([700.0]), ctx, transformer_options=opts).float()


def _with_node(comfy: Any, mp: Any) -> tuple[Any, comfy_nodes.PlannerWrapper, str]:
    patched, status = comfy_nodes.StreamplanMemoryPlanner().patch(mp, "none", "sdpa", False)
    wrapper = comfy_nodes.planner_of(patched)
    assert wrapper is not None
    return patched, wrapper, status


@pytest.mark.parametrize("family", ["wan", "flux", "minimax-h3"])
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_format_runs_planned_and_agrees(comfy: Any, tiny_detection: Any, tmp_path_factory: Any, family: str,
                                        fmt: str) -> None:
    tmp = tmp_path_factory.getbasetemp() / "comfy-formats"
    tmp.mkdir(exist_ok=True)
    path = _convert(_source(comfy, family, tmp), fmt)
    mp = _load(comfy, path, FORMATS[fmt].load_dtype())
    held = comfy_nodes.weight_formats(mp.model.diffusion_model)
    reference = _sample(comfy, _load(comfy, path, None, cf.dequantized_state_dict(mp)), family)
    own = _outcome(lambda: _sample(comfy, mp, family))
    patched, wrapper, status = _with_node(comfy, mp)
    planned = _sample(comfy, patched, family)
    text = wrapper.status()
    print(f"\n{family} {fmt}: held {held}\n{status}\n{text}")
    handles = list(wrapper.handles.values())
    assert handles and not wrapper.refused, text
    h = handles[0]
    assert h.fallbacks == [] and h.planned_calls == h.calls >= 1, text
    # attached once: the metadata ComfyUI's state_dict makes anew per call is not a change
    assert h._attaches == 1 and h.calls > 1, (h._attaches, h.calls)
    # and the state_dict fingerprint, where the cheap check cannot decide, sees no change either
    assert h._state.fingerprint == _module_state.fingerprint(h.module, h._state.fingerprint[-1])
    quantized = [f for f in held if f != "dense"]
    assert quantized, f"{fmt}: ComfyUI holds no quantized weight: {held}"
    formats = {f for p in h.plans for f, _n, _provider in p["formats"]}
    assert set(quantized) <= formats, (held, formats)
    err = rel_l2(planned, reference)
    if not isinstance(own, torch.Tensor):
        # ComfyUI's own forward refuses this model as loaded (MiniMax H3 with its norm weights in
        # fp8: comfy_kitchen's fused RMSNorm + RoPE takes 16/32-bit scales only): no peer error.
        print(f"  ComfyUI's own run raised {own[0].__name__}: {own[1][:160]}; planned error {err:.3e}")
        assert err <= FLOOR
        return
    comfy_err = rel_l2(own, reference)
    print(f"  error vs fp32 of the dequantized weights: ComfyUI {comfy_err:.3e}, planned {err:.3e}")
    assert err <= max(2 * comfy_err, FLOOR)


def _outcome(fn: Any) -> Any:
    """fn()'s answer, or the type and message of what it raised (ComfyUI's own may refuse a call)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the fallback must give the same outcome
        return type(e), str(e)


def test_unsupported_layout_falls_back_naming_it(comfy: Any, tiny_detection: Any, tmp_path_factory: Any) -> None:
    """A weight in a layout streamplan does not run (nvfp4, as ComfyUI's quant_ops holds it):
    every call runs ComfyUI's own forward, recorded with the weight and the layout named."""
    tmp = tmp_path_factory.getbasetemp() / "comfy-formats"
    tmp.mkdir(exist_ok=True)
    mp = _load(comfy, _convert(_source(comfy, "wan", tmp), "fp8"), None)
    import comfy.quant_ops as quant_ops

    lin = mp.model.diffusion_model.blocks[0].ffn[0]
    w = quant_ops.QuantizedTensor.from_float(lin.weight.dequantize(), "TensorCoreNVFP4Layout")
    lin.weight = torch.nn.Parameter(w, requires_grad=False)
    lin.quant_format, lin.layout_type = "nvfp4", "TensorCoreNVFP4Layout"
    patched, wrapper, status = _with_node(comfy, mp)
    assert "weight_format" in status and "TensorCoreNVFP4Layout" in status, status
    want = _outcome(lambda: _sample(comfy, mp, "wan"))
    got = _outcome(lambda: _sample(comfy, patched, "wan"))
    assert torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want
    (_module, why, calls), = wrapper.refused.values()
    assert why.code == "weight_format" and "blocks.0.ffn.0.weight" in why.reason and len(calls) >= 1
    assert "TensorCoreNVFP4Layout" in wrapper.status() and not wrapper.handles


def test_fp8_activations_are_quantized_at_comfyuis_input_scale(comfy: Any, tiny_detection: Any,
                                                               tmp_path_factory: Any, monkeypatch: Any) -> None:
    """Where ComfyUI runs fp8 e4m3 layers as fp8 matmuls (a device with fp8 compute), it quantizes
    their activations per tensor with the layer's input_scale, else 1: the node reads that scale
    beside the module's tensors for exactly those layers. A layer with its own input_scale keeps
    it; where ComfyUI dequantizes (no fp8 compute: this CPU) there is none; a layer whose
    checkpoint asks for a full-precision matmul falls back, named."""
    import comfy.model_management as mm

    from streamplan import _comfy

    tmp = tmp_path_factory.getbasetemp() / "comfy-formats"
    tmp.mkdir(exist_ok=True)
    path = _convert(_source(comfy, "wan", tmp), "fp8")
    assert _comfy.WanModel.host_tensors(_load(comfy, path, None).model.diffusion_model) == {}
    monkeypatch.setattr(mm, "supports_fp8_compute", lambda *a, **k: True)
    dm = _load(comfy, path, None).model.diffusion_model
    fp8 = [n for n, m in dm.named_modules()
           if isinstance(getattr(m, "weight", None), torch.Tensor) and _comfy.weight_format(m.weight)[0] == "fp8-e4m3"]
    scales = _comfy.WanModel.host_tensors(dm)
    assert len(fp8) >= 10 and sorted(scales) == sorted(f"{n}.input_scale" for n in fp8), (fp8, sorted(scales))
    assert all(v.dtype == torch.float32 and v.item() == 1.0 for v in scales.values())
    lin = dm.blocks[0].ffn[0]
    lin.register_parameter("input_scale", torch.nn.Parameter(torch.tensor(0.5), requires_grad=False))
    scales = _comfy.WanModel.host_tensors(dm)
    assert "blocks.0.ffn.0.input_scale" not in scales and len(scales) == len(fp8) - 1
    assert "blocks.0.ffn.0.input_scale" in dm.state_dict()  # read with the module's own tensors
    assert _comfy.unsupported_weights(dm) is None
    lin._full_precision_mm_config = True
    f = _comfy.unsupported_weights(dm)
    assert f is not None and f.code == "weight_format" and "blocks.0.ffn.0.weight" in f.reason, f
    assert "full_precision_matrix_mult" in f.reason


def _first_call(comfy: Any, mp: Any, family: str) -> tuple[tuple, dict]:
    """The arguments of the sampler's first call of the diffusion model, as ComfyUI makes it."""
    seen: list[tuple[tuple, dict]] = []
    hook = mp.model.diffusion_model.register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append((args, dict(kwargs))) if not seen else None, with_kwargs=True)
    try:
        _sample(comfy, mp, family)
    finally:
        hook.remove()
    return seen[0]


def _replay(mp: Any, call: tuple[tuple, dict]) -> torch.Tensor:
    """That call again on mp's diffusion model, through mp's wrappers (the node's where patched)."""
    args, kwargs = call
    kwargs = {**kwargs, "transformer_options": {**kwargs.get("transformer_options", {}), "wrappers": mp.wrappers}}
    with torch.no_grad():
        out = mp.model.diffusion_model(*args, **kwargs)
    parts = [out] if isinstance(out, torch.Tensor) else out if isinstance(out, (list, tuple)) else out.unbind()
    return torch.cat([p.flatten().float() for p in parts])


@pytest.mark.parametrize("family", ["wan", "minimax-h3"])
def test_fp8_matmuls_compute_what_comfyuis_compute(comfy: Any, tiny_detection: Any, tmp_path_factory: Any,
                                                   monkeypatch: Any, family: str) -> None:
    """ComfyUI running fp8 matmuls (its fp8 compute forced on for this CPU) and the node running
    its fp8 GEMM here too (STREAMPLAN_FP8_CPU): one call of the diffusion model, as the sampler
    makes it, agrees within half of ComfyUI's own error against the dequantized fp32 model (H3's
    adaln projections, which the node's prologue computes, included). With the activations
    quantized at the slab's own scale instead of ComfyUI's input scale the two differ by more
    than that error."""
    import comfy.model_management as mm

    from streamplan import _comfy

    tmp = tmp_path_factory.getbasetemp() / "comfy-formats"
    tmp.mkdir(exist_ok=True)
    path = _convert(_source(comfy, family, tmp), "fp8")
    monkeypatch.setattr(mm, "supports_fp8_compute", lambda *a, **k: True)
    monkeypatch.setenv("STREAMPLAN_FP8_CPU", "1")
    mp = _load(comfy, path, None)
    call = _first_call(comfy, mp, family)
    own = _replay(mp, call)
    mp32 = _load(comfy, path, None, cf.dequantized_state_dict(mp))
    fp32 = _replay(mp32, call)

    def planned() -> tuple[torch.Tensor, str]:
        patched, wrapper, _status = _with_node(comfy, mp)
        out = _replay(patched, call)
        h, = wrapper.handles.values()
        assert h.fallbacks == [] and h.planned_calls == h.calls == 1, wrapper.status()
        streamplan.remove(mp.model.diffusion_model)
        return out, wrapper.status()

    got, text = planned()
    assert "fp8-e4m3 (at::_scaled_mm on the CPU" in text, text
    comfy_err, err = rel_l2(own, fp32), rel_l2(got, own)
    monkeypatch.setattr(_comfy.ComfyAdapter, "host_tensors", classmethod(lambda cls, m: {}))
    own_scale, _text = planned()
    other = rel_l2(own_scale, own)
    print(f"\n{family} fp8 matmuls: planned vs ComfyUI {err:.3e} (at the slab's own scale {other:.3e}); "
          f"ComfyUI vs fp32 {comfy_err:.3e}")
    assert err <= 0.5 * comfy_err < other


def test_status_node_reads_the_plan_after_sampling(comfy: Any, tiny_detection: Any, tmp_path_factory: Any) -> None:
    tmp = tmp_path_factory.getbasetemp() / "comfy-formats"
    tmp.mkdir(exist_ok=True)
    mp = _load(comfy, _convert(_source(comfy, "wan", tmp), "int8"), None)
    patched, _wrapper, _status = _with_node(comfy, mp)
    node = comfy_nodes.StreamplanStatus()
    assert node.status(patched)[0] == "streamplan: no call of the diffusion model yet"
    _sample(comfy, patched, "wan")
    text, = node.status(patched)
    for part in ("attention: consumer sdpa", "estimated peak", "floor", "linears int8 (", "calls planned"):
        assert part in text, text
    assert json.dumps(text)  # a plain string, as a text-display node shows it


@pytest.mark.parametrize("fmt", ["fp8", "int8", "plain-e4m3"])
@pytest.mark.parametrize("lowvram", [False, True], ids=["patched-at-load", "patched-at-cast"])
def test_lora_loaded_by_comfyui_on_quantized_weights(comfy: Any, tiny_detection: Any, tmp_path_factory: Any, fmt: str,
                                                     lowvram: bool) -> None:
    """A rank-16 LoRA loaded by ComfyUI's loader (comfy.lora.load_lora, add_patches) on a
    quantized WanModel: patched when ComfyUI loads the weights (it dequantizes, patches and
    stores them back in their format) or at cast time (weight_function, as under low-VRAM
    loading: the weight hook hands the patches the dequantized weight). Planned with no
    fallback, within 2x ComfyUI's own error against fp32 of the dequantized weights with the
    same LoRA."""
    import comfy.lora

    tmp = tmp_path_factory.getbasetemp() / "comfy-formats"
    tmp.mkdir(exist_ok=True)
    path = _convert(_source(comfy, "wan", tmp), fmt)
    mp = _load(comfy, path, FORMATS[fmt].load_dtype())
    keys = comfy.lora.model_lora_keys_unet(mp.model, {})
    lora = comfy.lora.load_lora(cf.lora_state_dict(mp.model, 16, torch.Generator().manual_seed(9), scale=0.5), keys)
    assert len(lora) >= 10, len(lora)
    ref_mp = _load(comfy, path, None, cf.dequantized_state_dict(mp))
    ref_mp.add_patches(lora, 1.0)
    mp.add_patches(lora, 1.0)
    run = _sample
    if lowvram:
        # ComfyUI's low-VRAM load patches no weight in place: every LoRA'd layer gets its
        # patches as a weight_function, applied when the layer casts its weight. The sampler
        # would load the model again (fully, on the CPU), so the model is called as the sampler
        # calls it, once loaded.
        mp.load(torch.device("cpu"), lowvram_model_memory=1, force_patch_weights=False, full_load=False)
        hooked = [m for m in mp.model.diffusion_model.modules() if getattr(m, "weight_function", None)]
        assert len(hooked) >= 10, f"ComfyUI patched {len(hooked)} layers at cast time"
        ref_mp.load(torch.device("cpu"), force_patch_weights=True, full_load=True)
        run = _call_wan
    reference = run(comfy, ref_mp, "wan")
    own = run(comfy, mp, "wan")
    patched, wrapper, _status = _with_node(comfy, mp)
    planned = run(comfy, patched, "wan")
    text = wrapper.status()
    h, = wrapper.handles.values()
    assert h.fallbacks == [] and h.planned_calls == h.calls >= 1 and not wrapper.refused, text
    comfy_err, err = rel_l2(own, reference), rel_l2(planned, reference)
    without = run(comfy, _load(comfy, path, FORMATS[fmt].load_dtype()), "wan")
    print(f"\nwan {fmt} LoRA ({'cast' if lowvram else 'load'}): effect {rel_l2(without, reference):.3e}, "
          f"ComfyUI {comfy_err:.3e}, planned {err:.3e}\n{text}")
    assert rel_l2(without, reference) > 3 * max(comfy_err, FLOOR), "the LoRA changes too little to be seen"
    assert err <= max(2 * comfy_err, FLOOR)


@pytest.mark.parametrize("family,fmt", [("wan", "fp8"), ("wan", "int8"), ("minimax-h3", "fp8"), ("flux", "fp8")])
def test_residency_streams_the_weights_comfyui_keeps_in_host_memory(comfy: Any, tiny_detection: Any,
                                                                    tmp_path_factory: Any, family: str,
                                                                    fmt: str) -> None:
    """The Residency node on a model whose weights ComfyUI keeps in host memory (the CPU here),
    at most one block kept: the other blocks stream through streamplan's slots, quantized as
    ComfyUI holds them, copied from the module's own tensors; the samples equal those with every
    weight resident; what the slots held is given back when the sampling ends (ComfyUI's
    cleanup) and when ComfyUI unloads the model."""
    import comfy.model_management

    tmp = tmp_path_factory.getbasetemp() / "comfy-formats"
    tmp.mkdir(exist_ok=True)
    path = _convert(_source(comfy, family, tmp), fmt)
    mp = _load(comfy, path, FORMATS[fmt].load_dtype())
    resident, _wrapper, _status = _with_node(comfy, mp)
    want = _sample(comfy, resident, family)
    planned, wrapper, _status = _with_node(comfy, mp)
    streamed, status = comfy_nodes.StreamplanResidency().patch(planned, "1GiB", "1")
    assert "device memory 1GiB, resident blocks 1" in status, status
    assert comfy_nodes.planner_of(streamed) is wrapper
    got = _sample(comfy, streamed, family)
    text = wrapper.status()
    h, = wrapper.handles.values()
    assert h.streams and h.fallbacks == [] and h.planned_calls == h.calls >= 1 and not wrapper.refused, text
    r = h.residency
    assert r is not None and r["kept_blocks"] <= 1 and len(r["streamed_blocks"]) >= 1, r
    assert "streamed through" in text and "device memory 1.00 GiB, resident blocks 1" in text, text
    err = rel_l2(got, want)
    print(f"\n{family} {fmt} streamed: {r['kept_blocks']} kept, {len(r['streamed_blocks'])} streamed, rel L2 {err:.1e}\n{text}")
    assert err <= 1e-6
    assert h.streamed_bytes == (0, 0), h.streamed_bytes  # given back when the sampling ended
    if family == "wan":  # a call outside a sampling streams again; unloading the model gives it back
        _call_wan(comfy, streamed, family)
        assert h.streamed_bytes[0] > 0 and h.streamed_bytes[1] == 0, h.streamed_bytes  # no pinned copy of its own
        comfy.model_management.unload_all_models()
        assert h.streamed_bytes == (0, 0), h.streamed_bytes
        # The package's own residency on the same quantized weights: copied once into host buffers
        # of its own, in their stored form with their scales; the same output.
        dm = mp.model.diffusion_model
        want_call = _call_wan(comfy, resident, family)
        streamplan.remove(dm)  # the first planner's handle
        own = streamplan.apply(dm, resident_blocks=1, dtype=mp.model.get_dtype_inference())
        try:
            got_call = _call_wan(comfy, mp, family)
            assert own.streams and own.fallbacks == [] and own.planned_calls == 1 and own.streamed_bytes[1] > 0
        finally:
            streamplan.remove(dm)
        assert torch.equal(got_call, want_call)


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_lora_patched_at_cast_time_streams_with_its_weights(comfy: Any, tiny_detection: Any, tmp_path_factory: Any,
                                                            fmt: str) -> None:
    """ComfyUI's low-VRAM load of a quantized WanModel with a rank-16 LoRA: the LoRA'd layers
    keep their patches as a weight_function, applied at cast time. Under the Residency node (at
    most one block kept) their stored weights stream from the module's own tensors and the patches
    run on the streamed copy (dequantized, as ComfyUI's cast hands them over): planned with no
    fallback, and the same output as the same planner with every weight resident."""
    import comfy.lora

    tmp = tmp_path_factory.getbasetemp() / "comfy-formats"
    tmp.mkdir(exist_ok=True)
    path = _convert(_source(comfy, "wan", tmp), fmt)
    mp = _load(comfy, path, FORMATS[fmt].load_dtype())
    keys = comfy.lora.model_lora_keys_unet(mp.model, {})
    mp.add_patches(comfy.lora.load_lora(cf.lora_state_dict(mp.model, 16, torch.Generator().manual_seed(9), scale=0.5),
                                        keys), 1.0)
    mp.load(torch.device("cpu"), lowvram_model_memory=1, force_patch_weights=False, full_load=False)
    hooked = [m for m in mp.model.diffusion_model.modules() if getattr(m, "weight_function", None)]
    assert len(hooked) >= 10, f"ComfyUI patched {len(hooked)} layers at cast time"
    own = _call_wan(comfy, mp, "wan")
    resident, _wrapper, _status = _with_node(comfy, mp)
    want = _call_wan(comfy, resident, "wan")
    planned, wrapper, _status = _with_node(comfy, mp)
    streamed, _ = comfy_nodes.StreamplanResidency().patch(planned, "1GiB", "1")
    got = _call_wan(comfy, streamed, "wan")
    text = wrapper.status()
    h, = wrapper.handles.values()
    assert h.streams and h.fallbacks == [] and h.planned_calls == h.calls == 1 and not wrapper.refused, text
    assert h.residency is not None and len(h.residency["streamed_blocks"]) >= 1, h.residency
    err, comfy_err = rel_l2(got, want), rel_l2(own, want)
    print(f"\nwan {fmt} LoRA at cast time, streamed: rel L2 {err:.1e} against resident (ComfyUI's own {comfy_err:.1e})"
          f"\n{text}")
    assert err <= 1e-6


def test_residency_settings_name_a_bad_value() -> None:
    with pytest.raises(ValueError, match="device_memory"):
        comfy_nodes.ResidencySettings("12 parsecs", "auto")
    with pytest.raises(ValueError, match="resident_blocks: '0' is not"):
        comfy_nodes.ResidencySettings("auto", "0")
    assert comfy_nodes.ResidencySettings("6GiB", "3").blocks() == 3
    assert comfy_nodes.ResidencySettings().bytes_on(None) == 0
