"""MiniMax H3 reference (minimax_h3.py): its own checks, and a comparison with ComfyUI's
MiniMaxH3Model on tiny random weights in the real layout, in fp32 (rel L2 <= 1e-5).

The comparison needs a ComfyUI source tree at .deps/comfyui (with comfy/ldm/minimax/model.py) and
the comfy_kitchen package (installed, or under .deps/python); without them those tests are
skipped with the reason. Run:

    .venv/bin/python -m pytest -v -s tests/reference/test_minimax_h3_reference.py
"""
import os
import sys
from dataclasses import replace

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import comfy_tree  # noqa: E402
import minimax_h3 as h3  # noqa: E402

TOL = 1e-5

VARIANTS = {
    "plain": dict(),
    "curve": dict(curve_grid=17, time_dim=8, freq_dim=0, time_hidden=0),
    "gate_compress": dict(gate_compress=True),
    "pdd": dict(pdd_heads=5),
    "curve_gate_pdd": dict(curve_grid=33, time_dim=12, freq_dim=0, time_hidden=0, gate_compress=True, pdd_heads=7),
}
SCHEDULE = [1.0, 0.97, 0.9, 0.7, 0.4, 0.05, 0.0]
# text tags: video-tagged vision pads and an audio-tagged span inside the text
MIXED_TAGS = torch.tensor([1, 1, 0, 0, 0, 1, 2, 2, 1])


def config(variant):
    return replace(h3.TINY, **VARIANTS[variant])


# ---------------------------------------------------------------------------------------------
# Checks of the reference alone


@pytest.mark.parametrize("prefix", ["", "diffusion_model.", "model.diffusion_model."])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_layout_is_recognized(variant, prefix):
    cfg = config(variant)
    sd = h3.make_state_dict(cfg, prefix=prefix)
    assert h3.detect(h3.strip_prefix(sd)) == cfg


def test_real_layout_shapes():
    s = h3.tensor_shapes(replace(h3.REAL, gate_compress=True))
    assert s["blocks.0.attn.qkv_proj.weight"] == (3 * 56 * 128, 5376)
    assert s["blocks.49.attn.q_norm.weight"] == (128,)
    assert s["blocks.0.attn.to_gate_compress.weight"] == (7168, 5376)
    assert s["blocks.0.mlp.fc1.weight"] == (2 * 14336, 5376)
    assert s["blocks.0.adaln_proj.linear.weight"] == (6 * 5376 * 3, 2688)
    assert s["time_embedder.proj_in.weight"] == (5376, 256)
    assert s["time_embedder.proj_out.weight"] == (2688, 5376)
    assert s["video_patch_proj.weight"] == (5376, 96) and s["audio_patch_proj.weight"] == (5376, 32)
    assert s["condition_proj.weight"] == (5376, 5120)
    assert s["rope.inv_freq"] == (16,) and h3.REAL.rotary_dim == 96
    assert "blocks.50.norm1.weight" not in s and "token_refiner.blocks.1.norm1.weight" in s


def test_real_geometry():
    # 10 s at 24 fps and 1376x768: 241 frames snap to 243 = 17 * 14 + 5 -> 72 latent frames
    frames, latent_t, audio_t = h3.temporal_shape(241)
    assert (frames, latent_t, audio_t) == (243, 72, 405)
    pos, spans = h3.layout(512, latent_t, 768 // 16, 1376 // 16, audio_t)
    assert spans["video"][1] - spans["video"][0] == 72 * 24 * 43 == 74304
    assert spans["audio"][1] - spans["audio"][0] == 810
    assert pos.shape == (512 + 810 + 74304, 3)
    assert h3.temporal_shape(121) == (124, 37, 207)  # 5 s: 37 * 1032 = 38184 video tokens
    # the time axis: 40 units per second in both streams
    assert pos[spans["video"][0] + 72 * 1032 - 1, 0].item() - 512 == pytest.approx(h3.FRAME_RESCALE * (243 - 4))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fp32_matches_fp64(variant):
    cfg = config(variant)
    sd = h3.make_state_dict(cfg, dtype=torch.float64)
    inp = h3.random_inputs(cfg, dtype=torch.float64)
    with torch.no_grad():
        ref = h3.h3_forward(sd, **inp, sigma=0.7, text_tags=MIXED_TAGS, sample_sigmas=SCHEDULE)
        out = h3.h3_forward(h3.to_dtype(sd, torch.float32), **{k: v.float() for k, v in inp.items()},
                            sigma=0.7, text_tags=MIXED_TAGS, sample_sigmas=SCHEDULE)
    for name, a, b in zip(("video", "audio"), out, ref):
        rel = h3.rel_l2(a, b)
        print(f"\n  reference {variant} {name}: fp32 vs fp64 rel L2 {rel:.3e}", end="")
        assert rel <= TOL


# ---------------------------------------------------------------------------------------------
# Against ComfyUI


@pytest.fixture(scope="module")
def comfy_h3():
    with comfy_tree.isolated(comfy_tree.EXTRA_SITE, comfy_tree.COMFY_TREE):
        yield comfy_tree.minimax_h3_modules()


def comfy_config(sd, cfg):
    """The constructor arguments ComfyUI's model_detection derives from the names and shapes.
    It takes latents_dim from final_layer.video_out rows / 4, which a PDD bank multiplies by the
    head count; such checkpoints need latents_dim / audio_latents_dim from the file's metadata
    config, which is what the override below stands for."""
    c = dict(num_layers=cfg.layers, token_refiner_num_layers=cfg.refiner_layers,
             hidden_size=sd["video_patch_proj.weight"].shape[0],
             latents_dim=sd["final_layer.video_out.weight"].shape[0] // 4,
             audio_latents_dim=sd["final_layer.audio_out.weight"].shape[0],
             attention_head_dim=sd["blocks.0.attn.q_norm.weight"].shape[0],
             ffn_hidden_size=sd["blocks.0.mlp.fc1.weight"].shape[0] // 2,
             text_dim=sd["condition_proj.weight"].shape[1],
             rope_inv_freq_len=sd["rope.inv_freq"].shape[0],
             gate_compress="blocks.0.attn.to_gate_compress.weight" in sd)
    c["num_attention_heads"] = sd["blocks.0.attn.qkv_proj.weight"].shape[0] // (3 * c["attention_head_dim"])
    if "adaln_t_table" in sd:
        c["adaln_curve_grid"], c["time_embed_dim"] = sd["adaln_t_table"].shape
    else:
        c["time_embed_hidden_size"], c["timestep_input_dim"] = sd["time_embedder.proj_in.weight"].shape
        c["time_embed_dim"] = sd["time_embedder.proj_out.weight"].shape[0]
    if cfg.pdd_heads > 1:
        c.update(latents_dim=cfg.latent_channels, audio_latents_dim=cfg.audio_channels)  # metadata
    return c


def build_comfy(comfy_h3, sd, cfg):
    model, ops = comfy_h3
    m = model.MiniMaxH3Model(**comfy_config(sd, cfg), dtype=torch.float32, device="cpu",
                             operations=ops.disable_weight_init)
    heads = {k: sd[k] for k in sd if k.startswith("final_layer.") and k.split(".")[1] in ("video_out", "audio_out")}
    rest = {k: v for k, v in sd.items() if k not in heads}
    missing, unexpected = m.load_state_dict(rest, strict=False)
    assert not unexpected and sorted(missing) == sorted(heads)
    # ComfyUI's lazy loader assigns the head tensors as they are (a PDD bank is n heads tall)
    for k, v in heads.items():
        mod = m.final_layer.video_out if ".video_out." in k else m.final_layer.audio_out
        setattr(mod, k.rsplit(".", 1)[1], torch.nn.Parameter(v.clone(), requires_grad=False))
    return m.eval().requires_grad_(False)  # as ComfyUI holds weights (the in-place RoPE refuses autograd)


def run_comfy(m, inp, sigma, tags=None, refined=False, audio_scale=None, sample_sigmas=None):
    timestep = torch.tensor([sigma * 1000.0], dtype=torch.float32)
    context = inp["text"][None]
    if refined:  # what model_base.extra_conds hands the model: the refined text
        context = m.preprocess_text_embeds(context)
    payload = {}
    if tags is not None:
        payload["text_token_tags"] = tags
    if audio_scale is not None:
        payload["audio_scale"] = audio_scale
    opts = {}
    if sample_sigmas is not None:
        opts["sample_sigmas"] = torch.tensor(sample_sigmas, dtype=torch.float32)
    v, a = m.forward([inp["video"][None], inp["audio"][None]], timestep, context,
                     transformer_options=opts, minimax_payload=payload)
    return v[0], a[0], float((timestep.flatten()[0] / 1000.0).float())


CASES = [
    # variant, sigma, text tags, text refined before the call (as ComfyUI's extra_conds does)
    ("plain", 0.7, None, False),
    ("plain", 1.0, MIXED_TAGS, True),
    ("plain", 0.05, MIXED_TAGS, True),
    ("curve", 0.7, MIXED_TAGS, True),
    ("curve", 0.0, None, False),
    ("gate_compress", 0.4, MIXED_TAGS, True),
    ("pdd", 0.7, MIXED_TAGS, True),
    ("pdd", 0.97, None, False),
    ("curve_gate_pdd", 0.9, MIXED_TAGS, True),
]


@pytest.mark.parametrize("variant,sigma,tags,refined", CASES,
                         ids=[f"{c[0]}-s{c[1]}{'-tags' if c[2] is not None else ''}" for c in CASES])
def test_matches_comfyui(comfy_h3, variant, sigma, tags, refined):
    cfg = config(variant)
    comfy_tree.skip_unless_h3_builds(comfy_h3[0], cfg.gate_compress, cfg.pdd_heads)
    sd = h3.make_state_dict(cfg, seed=3)
    inp = h3.random_inputs(cfg, seed=4)
    sched = SCHEDULE if cfg.pdd_heads > 1 else None
    with torch.no_grad():
        m = build_comfy(comfy_h3, sd, cfg)
        cv, ca, sigma_v = run_comfy(m, inp, sigma, tags, refined, sample_sigmas=sched)
        rv, ra = h3.h3_forward(sd, **inp, sigma=sigma_v, text_tags=tags, sample_sigmas=sched)
    assert rv.shape == cv.shape and ra.shape == ca.shape
    for name, r, c in (("video", rv, cv), ("audio", ra, ca)):
        rel = h3.rel_l2(r, c)
        print(f"\n  comfyui {variant} sigma={sigma} {name} {list(c.shape)}: rel L2 {rel:.3e}", end="")
        assert rel <= TOL


def test_sampler_carry_matches_comfyui(comfy_h3):
    cfg = config("plain")
    sd = h3.make_state_dict(cfg, seed=5)
    inp = h3.random_inputs(cfg, seed=6)
    scale = h3.SHIFT_VIDEO / h3.SHIFT_AUDIO
    with torch.no_grad():
        m = build_comfy(comfy_h3, sd, cfg)
        cv, ca, sigma_v = run_comfy(m, inp, 0.6, MIXED_TAGS, True, audio_scale=scale)
        rv, ra = h3.sampler_forward(sd, inp["video"], inp["audio"], inp["text"], sigma_v,
                                    audio_scale=scale, text_tags=MIXED_TAGS)
    for name, r, c in (("video", rv, cv), ("audio", ra, ca)):
        rel = h3.rel_l2(r, c)
        print(f"\n  comfyui sampler carry {name}: rel L2 {rel:.3e}", end="")
        assert rel <= TOL
