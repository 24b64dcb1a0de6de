#!/usr/bin/env python3
"""A plain-torch statement of the MiniMax H3 audio+video DiT forward (text-to-video+audio), as
ComfyUI's MiniMaxH3Model computes it, written from the state_dict alone: functions over a dict
of tensors, one token-major op at a time, the way a C++ executor computes them. It is the
executable form of the H3 section of RECIPES.md.

Runs in the dtype of the state dict it is given (fp32 or fp64; `to_dtype` converts one), except
where noted. Batch dimensions are dropped: video latents [C, T, H, W], audio latents [C, 2, T],
text states [L, text_dim]; outputs have the shapes of the latents.

    minimax_h3.py --selftest [--curve] [--gate-compress] [--pdd N]
        builds a tiny random checkpoint in the real layout, runs the forward in fp32 and fp64 and
        reports how far apart they are

Not covered: keyframe / reference condition rows (fl2va, ref2va), denoise masks, batch > 1.
"""
import argparse
import math
import sys
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

PREFIXES = ("model.diffusion_model.", "diffusion_model.")

# Time axis of the packed sequence: every pixel frame spans FRAME_RESCALE position units and
# every audio latent frame (40 Hz) 1 unit, so both streams advance 40 units per second at 24 fps.
# Latent frame k of a video covers FRAME_PER_TOKEN[k % 5] pixel frames (1 + 4 + 4 + 4 + 4 = 17).
FRAME_PER_TOKEN = (1, 4, 4, 4, 4)
FRAME_RESCALE = 5.0 / 3.0
SHIFT_VIDEO = 12.0
SHIFT_AUDIO = 3.0

# Modality tags: a token's modulation row is (timestep class) * 3 + tag.
TAG_VIDEO, TAG_TEXT, TAG_AUDIO = 0, 1, 2


@dataclass(frozen=True)
class H3Config:
    hidden: int = 5376
    heads: int = 56
    head_dim: int = 128
    ffn: int = 14336
    layers: int = 50
    refiner_layers: int = 2
    text_dim: int = 5120
    latent_channels: int = 24      # video latent channels; patch 1x2x2 -> 96 patch features
    audio_channels: int = 32       # audio latent channels (stereo, 40 Hz)
    freq_dim: int = 256            # sinusoid width (plain form)
    time_hidden: int = 5376        # time_embedder.proj_in output (plain form)
    time_dim: int = 2688           # time embedding width (plain) or curve basis size K (curve)
    rope_pairs: int = 16           # rope.inv_freq length: rotated pairs per axis (3 axes)
    eps: float = 1e-5              # every RMSNorm: blocks, q/k, refiner, final
    curve_grid: int = 0            # rows of adaln_t_table; 0 = plain form (time_embedder)
    gate_compress: bool = False    # blocks.i.attn.to_gate_compress.weight present (unused here)
    pdd_heads: int = 1             # > 1: final_layer.{video,audio}_out hold a PDD head bank

    @property
    def inner(self):
        return self.heads * self.head_dim

    @property
    def video_patch(self):
        return self.latent_channels * 4

    @property
    def rotary_dim(self):
        return 6 * self.rope_pairs


REAL = H3Config()
# Tiny test sizes with every structural feature: heads * head_dim != hidden (as 7168 != 5376),
# rotary over 3/4 of the head dims (24 of 32, as 96 of 128), text_dim != hidden.
TINY = H3Config(hidden=64, heads=3, head_dim=32, ffn=160, layers=2, refiner_layers=2, text_dim=40,
                latent_channels=4, audio_channels=6, freq_dim=32, time_hidden=64, time_dim=32,
                rope_pairs=4)
# Tiny sizes that ComfyUI's loader detects and its sampler fills: heads of 128 (its detection's
# smallest), its latent format's 24 video and 32 audio channels.
COMFY_TINY = H3Config(hidden=256, heads=2, head_dim=128, ffn=512, layers=2, refiner_layers=2, text_dim=64,
                      latent_channels=24, audio_channels=32, freq_dim=32, time_hidden=256, time_dim=64,
                      rope_pairs=4)


# ---------------------------------------------------------------------------------------------
# State dict: prefixes, recognition, random tiny weights


def strip_prefix(sd):
    """Drops `model.diffusion_model.` or `diffusion_model.` (whichever the keys carry)."""
    for p in PREFIXES:
        if any(k.startswith(p) for k in sd):
            return {k[len(p):]: v for k, v in sd.items() if k.startswith(p)}
    return dict(sd)


def _count(sd, prefix):
    n = 0
    while any(k.startswith(f"{prefix}{n}.") for k in sd):
        n += 1
    return n


def detect(sd):
    """The config from names and shapes alone (prefix already stripped)."""
    hidden, video_patch = sd["video_patch_proj.weight"].shape
    head_dim = sd["blocks.0.attn.q_norm.weight"].shape[0]
    curve = "adaln_t_table" in sd
    if curve:
        grid, time_dim = sd["adaln_t_table"].shape
        freq_dim, time_hidden = 0, 0
    else:
        grid = 0
        time_hidden, freq_dim = sd["time_embedder.proj_in.weight"].shape
        time_dim = sd["time_embedder.proj_out.weight"].shape[0]
    audio_channels = sd["audio_patch_proj.weight"].shape[1]
    pdd = sd["final_layer.video_out.weight"].shape[0] // video_patch
    cfg = H3Config(
        hidden=hidden, heads=sd["blocks.0.attn.qkv_proj.weight"].shape[0] // (3 * head_dim),
        head_dim=head_dim, ffn=sd["blocks.0.mlp.fc1.weight"].shape[0] // 2,
        layers=_count(sd, "blocks."), refiner_layers=_count(sd, "token_refiner.blocks."),
        text_dim=sd["condition_proj.weight"].shape[1], latent_channels=video_patch // 4,
        audio_channels=audio_channels, freq_dim=freq_dim, time_hidden=time_hidden, time_dim=time_dim,
        rope_pairs=sd["rope.inv_freq"].shape[0], curve_grid=grid,
        gate_compress="blocks.0.attn.to_gate_compress.weight" in sd, pdd_heads=pdd)
    expect = {
        "blocks.0.adaln_proj.linear.weight": (6 * 3 * hidden, time_dim),
        "final_layer.adaln_proj.linear.weight": (2 * hidden, time_dim),
        "final_layer.video_out.weight": (pdd * video_patch, hidden),
        "final_layer.audio_out.weight": (pdd * audio_channels, hidden),
    }
    for name, shape in expect.items():
        if tuple(sd[name].shape) != shape:
            raise ValueError(f"{name}: shape {tuple(sd[name].shape)}, expected {shape}")
    return cfg


def tensor_shapes(cfg):
    """name -> shape of every tensor of the layout (no prefix)."""
    D, I, Fh = cfg.hidden, cfg.inner, cfg.ffn
    s = {
        "video_patch_proj.weight": (D, cfg.video_patch), "video_patch_proj.bias": (D,),
        "audio_patch_proj.weight": (D, cfg.audio_channels), "audio_patch_proj.bias": (D,),
        "condition_proj.weight": (D, cfg.text_dim), "condition_proj.bias": (D,),
        "rope.inv_freq": (cfg.rope_pairs,),
        "final_layer.norm.weight": (D,),
        "final_layer.adaln_proj.linear.weight": (2 * D, cfg.time_dim),
        "final_layer.adaln_proj.linear.bias": (2 * D,),
        "final_layer.video_out.weight": (cfg.pdd_heads * cfg.video_patch, D),
        "final_layer.video_out.bias": (cfg.pdd_heads * cfg.video_patch,),
        "final_layer.audio_out.weight": (cfg.pdd_heads * cfg.audio_channels, D),
        "final_layer.audio_out.bias": (cfg.pdd_heads * cfg.audio_channels,),
        "token_refiner.final_norm.weight": (D,),
    }
    if cfg.curve_grid:
        s["adaln_t_table"] = (cfg.curve_grid, cfg.time_dim)
    else:
        s.update({"time_embedder.proj_in.weight": (cfg.time_hidden, cfg.freq_dim),
                  "time_embedder.proj_in.bias": (cfg.time_hidden,),
                  "time_embedder.proj_out.weight": (cfg.time_dim, cfg.time_hidden),
                  "time_embedder.proj_out.bias": (cfg.time_dim,)})

    def common(b):
        s.update({b + "norm1.weight": (D,), b + "norm2.weight": (D,),
                  b + "attn.qkv_proj.weight": (3 * I, D),
                  b + "attn.q_norm.weight": (cfg.head_dim,), b + "attn.k_norm.weight": (cfg.head_dim,),
                  b + "attn.out_proj.weight": (D, I),
                  b + "mlp.fc1.weight": (2 * Fh, D), b + "mlp.fc2.weight": (D, Fh)})

    for i in range(cfg.refiner_layers):
        common(f"token_refiner.blocks.{i}.")
    for i in range(cfg.layers):
        b = f"blocks.{i}."
        common(b)
        s[b + "adaln_proj.linear.weight"] = (18 * D, cfg.time_dim)
        s[b + "adaln_proj.linear.bias"] = (18 * D,)
        if cfg.gate_compress:
            s[b + "attn.to_gate_compress.weight"] = (I, D)
    return s


def rope_inv_freq(cfg):
    """rope.inv_freq: a 10000-based RoPE over 2 * rope_pairs dims per axis (float64)."""
    return 10000.0 ** (-torch.arange(cfg.rope_pairs, dtype=torch.float64) / cfg.rope_pairs)


def make_state_dict(cfg=TINY, seed=0, dtype=torch.float32, prefix=""):
    """Random weights in the real layout. Linears ~ N(0, 1/fan_in), norm weights ~ 1 + N(0, 0.1^2),
    inv_freq as a 10000-based RoPE over 2 * rope_pairs dims per axis, later PDD heads as small
    offsets from head 0."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, shape in tensor_shapes(cfg).items():
        if name == "rope.inv_freq":
            t = rope_inv_freq(cfg)
        elif name.endswith("norm.weight") or name.endswith("norm1.weight") or name.endswith("norm2.weight") \
                or name.endswith("final_norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif name == "adaln_t_table":
            t = torch.randn(shape, generator=g, dtype=torch.float64)
        elif name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            t = torch.randn(shape, generator=g, dtype=torch.float64) / math.sqrt(shape[1])
        if cfg.pdd_heads > 1 and name.startswith("final_layer.") and name.split(".")[1] in ("video_out", "audio_out"):
            rows = t.reshape(cfg.pdd_heads, -1, *shape[1:])
            rows[1:] *= 0.2
        sd[prefix + name] = t.to(dtype)
    return sd


def to_dtype(sd, dtype):
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}


# ---------------------------------------------------------------------------------------------
# Geometry: latent sizes, the packed layout, positions


def temporal_shape(length):
    """Pixel frames requested -> (pixel frames used, latent frames, audio latent frames).
    Frame counts snap up to 17k + 5; audio runs at 40 latent frames per second of 24 fps video."""
    frames = max(5, length)
    while frames % 17 != 5:
        frames += 1
    latent_t = 2 if frames <= 5 else (frames - 5) // 17 * 5 + 2
    return frames, latent_t, round(frames / 24 * 40)


def _axis(n_latent, sqrt_area):
    """Area-normalized coordinates of the 2x2 patches along one latent axis:
    ((1 - r) / 2 + i * r / n) * 32 for i < n = n_latent / 2, with r = n_latent / sqrt(H * W)."""
    r = n_latent / sqrt_area
    n = n_latent // 2
    return (torch.arange(n, dtype=torch.float64) * (r / n) + (1.0 - r) / 2.0) * 32.0


def layout(text_len, latent_t, lat_h, lat_w, audio_t):
    """Packed sequence [text | audio | video] (t2va has no cond rows) for latent sides lat_h, lat_w
    (even). Returns positions [S, 3] float64 (t, h, w), tags [S] and the segment spans."""
    sqrt_area = math.sqrt(lat_h * lat_w)
    ah, aw = _axis(lat_h, sqrt_area), _axis(lat_w, sqrt_area)

    text = torch.zeros(text_len, 3, dtype=torch.float64)
    text[:, 0] = torch.arange(text_len, dtype=torch.float64)        # t = token index, h = w = 0

    cursor = float(text_len)                                         # the targets' time origin
    audio = torch.zeros(2 * audio_t, 3, dtype=torch.float64)         # rows: channel 0 frames, channel 1 frames
    audio[:, 0] = (cursor + torch.arange(audio_t, dtype=torch.float64)).repeat(2)
    audio[:audio_t, 2] = aw[0]                                       # left channel at the leftmost w
    audio[audio_t:, 2] = aw[-1]                                      # right channel at the rightmost w

    spans = torch.tensor([FRAME_RESCALE * FRAME_PER_TOKEN[k % 5] for k in range(latent_t)], dtype=torch.float64)
    frame_t = cursor + torch.cat([torch.zeros(1, dtype=torch.float64), spans[:-1].cumsum(0)])
    hh, ww = torch.meshgrid(ah, aw, indexing="ij")                   # rows of one frame: h-major, w fastest
    video = torch.empty(latent_t, hh.numel(), 3, dtype=torch.float64)
    video[:, :, 0] = frame_t[:, None]
    video[:, :, 1] = hh.reshape(-1)
    video[:, :, 2] = ww.reshape(-1)
    video = video.reshape(-1, 3)

    n_text, n_audio, n_video = text_len, 2 * audio_t, video.shape[0]
    spans_ = {"text": (0, n_text), "audio": (n_text, n_text + n_audio),
              "video": (n_text + n_audio, n_text + n_audio + n_video)}
    return torch.cat([text, audio, video]), spans_


def time_shift_sigma(sigma, from_shift, to_shift):
    """Maps a sigma of the `from_shift` schedule to the `to_shift` schedule at the same base-grid
    point: base = sigma / (from + sigma (1 - from)), result = to * base / (1 + (to - 1) base)."""
    base = sigma / (from_shift + sigma * (1.0 - from_shift))
    return to_shift * base / (1.0 + (to_shift - 1.0) * base)


def stream_timesteps(sigma_video):
    """Video sigma (as the sampler gives it, clamped at 1e-6) -> (t_video, t_audio), t = 1 - sigma."""
    s = max(float(sigma_video), 1e-6)
    return 1.0 - s, 1.0 - time_shift_sigma(s, SHIFT_VIDEO, SHIFT_AUDIO)


# ---------------------------------------------------------------------------------------------
# Ops


def linear(w, name, x):
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_split_half(x, cos, sin):
    """x [S, H, hd]; rotates pairs (x[i], x[i + r/2]) for i < r/2 by angle i, r = 2 * cos.shape[-1];
    dims r..hd pass through."""
    half = cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    x0, x1, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x0 * c - x1 * s, x1 * c + x0 * s, rest], dim=-1)


def attention(q, k, v):
    """q, k, v [S, H, hd] -> [S, H * hd] (heads major); softmax(q k^T / sqrt(hd)) v, no mask."""
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(q.shape[0], -1)


def self_attention(w, b, cfg, x, cos=None, sin=None):
    """Fused qkv rows [q | k | v], per-head RMSNorm of q and k, RoPE when given, out_proj."""
    S = x.shape[0]
    q, k, v = linear(w, b + "attn.qkv_proj", x).split(cfg.inner, dim=-1)
    q = rms_norm(q.reshape(S, cfg.heads, cfg.head_dim), w[b + "attn.q_norm.weight"], cfg.eps)
    k = rms_norm(k.reshape(S, cfg.heads, cfg.head_dim), w[b + "attn.k_norm.weight"], cfg.eps)
    if cos is not None:
        q, k = rope_split_half(q, cos, sin), rope_split_half(k, cos, sin)
    return linear(w, b + "attn.out_proj", attention(q, k, v.reshape(S, cfg.heads, cfg.head_dim)))


def mlp(w, b, x):
    gate, up = linear(w, b + "mlp.fc1", x).chunk(2, dim=-1)          # fc1 rows: [gate | up]
    return linear(w, b + "mlp.fc2", F.silu(gate) * up)


# ---------------------------------------------------------------------------------------------
# Forward pieces


def refine_text(w, cfg, text):
    """[L, text_dim] text encoder states -> [L, hidden]: condition_proj, then the token refiner
    (pre-norm blocks over the text alone: no modulation, no RoPE, plain residuals), final_norm.
    A per-prompt computation: ComfyUI runs it once per sampling run."""
    x = linear(w, "condition_proj", text)
    for i in range(cfg.refiner_layers):
        b = f"token_refiner.blocks.{i}."
        x = x + self_attention(w, b, cfg, rms_norm(x, w[b + "norm1.weight"], cfg.eps))
        x = x + mlp(w, b, rms_norm(x, w[b + "norm2.weight"], cfg.eps))
    return rms_norm(x, w["token_refiner.final_norm.weight"], cfg.eps)


def time_embedding(w, cfg, t_values, dtype):
    """[M] timesteps in [0, 1] -> [M, time_dim].
    Plain: proj_out(silu(proj_in([cos(t f) | sin(t f)]))), f_i = exp(-ln(10000) i / (freq_dim/2)).
    Curve: linear interpolation of adaln_t_table rows at t * (grid - 1)."""
    t = torch.tensor(t_values, dtype=dtype)
    if cfg.curve_grid:
        table = w["adaln_t_table"]
        pos = t.clamp(0.0, 1.0) * (table.shape[0] - 1)
        i0 = pos.floor().long().clamp(max=table.shape[0] - 2)
        return torch.lerp(table[i0], table[i0 + 1], (pos - i0).unsqueeze(1))
    half = cfg.freq_dim // 2
    f = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=dtype) / half)
    a = t[:, None] * f[None]
    e = torch.cat([torch.cos(a), torch.sin(a)], dim=-1)
    return linear(w, "time_embedder.proj_out", F.silu(linear(w, "time_embedder.proj_in", e)))


def adaln_input(cfg, temb):
    """Plain form: SiLU before every adaln linear. Curve form: the table rows go in as they are."""
    return temb if cfg.curve_grid else F.silu(temb)


def pdd_head(w, name, x, n, start, stop, flow_shift):
    """PDD head bank: weight rows [n, out, in], head 0 full, heads 1.. offsets. Heads j in
    [max(start, 1), stop) are added to head 0 with weights dt_j / sum(dt over [start, stop)), where
    dt_j = u_{j+1} - u_j, u_j = 1 - shifted(1 - j / n) (flow_shift of this stream)."""
    grid = torch.linspace(1.0, 0.0, n + 1, dtype=torch.float64)
    dt = (1.0 - flow_shift * grid / (1.0 + (flow_shift - 1.0) * grid)).diff()[start:stop]
    wt = (dt / dt.sum()).to(x.dtype)
    rows = w[name + ".weight"].reshape(n, -1, x.shape[-1])
    brows = w[name + ".bias"].reshape(n, -1)
    first = max(start, 1)
    weight = rows[0] + torch.einsum("n,noi->oi", wt[first - start:], rows[first:stop])
    bias = brows[0] + torch.einsum("n,no->o", wt[first - start:], brows[first:stop])
    return F.linear(x, weight, bias)


def pdd_range(n, sigma, sample_sigmas, shift=SHIFT_VIDEO):
    """[start, stop) of the heads a step from sigma to the next schedule sigma spans: both sigmas
    unshifted to the base grid (time_shift_sigma(., shift, 1)), times n, rounded half to even.
    As in ComfyUI, the current sigma is a Python float (double math) and the next one an element
    of the schedule tensor (math in the schedule's dtype, fp32 for a list)."""
    sample_sigmas = torch.as_tensor(sample_sigmas)
    i = int((sample_sigmas - sigma).abs().argmin())
    sigma_next = sample_sigmas[min(i + 1, sample_sigmas.shape[0] - 1)]
    start, stop = (round(float(1.0 - time_shift_sigma(s, shift, 1.0)) * n) for s in (float(sigma), sigma_next))
    start = min(start, n - 1)
    return start, max(stop, start + 1)


def h3_forward(w, video, audio, text, sigma, text_tags=None, sample_sigmas=None):
    """One denoiser call. w: state dict (prefix allowed); video [C, T, H, W] (H, W even);
    audio [C_a, 2, T_a]; text [L, text_dim] encoder states, or [L, hidden] already refined;
    sigma: the video sigma (the sampler's timestep / 1000); text_tags: optional [L] modality tags
    of the text tokens (default: all text). Returns the negated (video, audio) predictions."""
    w = strip_prefix(w)
    cfg = detect(w)
    dtype = w["blocks.0.norm1.weight"].dtype
    C, T, H, W = video.shape
    Ta = audio.shape[-1]
    Hp, Wp = H // 2, W // 2

    # 1. Timesteps per segment, and the distinct values' rows.
    t_v, t_a = stream_timesteps(sigma)
    t_values = sorted({t_v, t_a})
    t_index = {t: i for i, t in enumerate(t_values)}

    # 2. Layout, and each token's modulation row: t_index * 3 + tag.
    pos, spans = layout(text.shape[0], T, H, W, Ta)
    S = pos.shape[0]
    row = torch.empty(S, dtype=torch.long)
    (ta, tb), (aa, ab), (va, vb) = spans["text"], spans["audio"], spans["video"]
    tags = torch.full((tb - ta,), TAG_TEXT, dtype=torch.long) if text_tags is None else text_tags.long().reshape(-1)
    row[ta:tb] = t_index[t_v] * 3 + tags
    row[aa:ab] = t_index[t_a] * 3 + TAG_AUDIO
    row[va:vb] = t_index[t_v] * 3 + TAG_VIDEO

    # 3. Embeddings. Patch projections in fp32 (at least); text through the refiner.
    pdt = torch.promote_types(dtype, torch.float32)
    patches = video.to(pdt).reshape(C, T, Hp, 2, Wp, 2).permute(1, 2, 4, 0, 3, 5).reshape(T * Hp * Wp, C * 4)
    v_emb = F.linear(patches, w["video_patch_proj.weight"].to(pdt), w["video_patch_proj.bias"].to(pdt))
    a_rows = audio.to(pdt).permute(1, 2, 0).reshape(2 * Ta, -1)         # channel-major rows
    a_emb = F.linear(a_rows, w["audio_patch_proj.weight"].to(pdt), w["audio_patch_proj.bias"].to(pdt))
    txt = text.to(dtype)
    if txt.shape[-1] != cfg.hidden:
        txt = refine_text(w, cfg, txt)
    x = torch.cat([txt, a_emb.to(dtype), v_emb.to(dtype)])               # [text | audio | video]

    # 4. Time embedding and RoPE angles (positions in the compute dtype times inv_freq).
    temb = time_embedding(w, cfg, t_values, dtype)
    ang = pos.to(dtype)[:, :, None] * w["rope.inv_freq"].to(dtype)[None, None, :]   # [S, 3, pairs]
    ang = ang.reshape(S, -1)                                             # [t pairs | h pairs | w pairs]
    cos, sin = ang.cos(), ang.sin()

    # 5. Blocks.
    for i in range(cfg.layers):
        b = f"blocks.{i}."
        m = linear(w, b + "adaln_proj.linear", adaln_input(cfg, temb))    # [M, 3 * 6 * hidden]
        m = m.reshape(len(t_values) * 3, 6, cfg.hidden)[row].to(dtype)    # [S, 6, hidden]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = m.unbind(1)
        n = rms_norm(x, w[b + "norm1.weight"], cfg.eps) * (1 + scale_msa) + shift_msa
        x = x + self_attention(w, b, cfg, n, cos, sin) * gate_msa
        n = rms_norm(x, w[b + "norm2.weight"], cfg.eps) * (1 + scale_mlp) + shift_mlp
        x = x + mlp(w, b, n) * gate_mlp

    # 6. Final layer: one (shift, scale) pair per timestep class, no modality; fp32 heads.
    fm = linear(w, "final_layer.adaln_proj.linear", adaln_input(cfg, temb)).reshape(len(t_values), 2, cfg.hidden)

    def final_rows(a, b, t):
        shift, scale = fm[t_index[t]].unbind(0)
        return (rms_norm(x[a:b], w["final_layer.norm.weight"], cfg.eps) * (1 + scale) + shift).to(pdt)

    hv, ha = final_rows(va, vb, t_v), final_rows(aa, ab, t_a)
    wf = {k: v.to(pdt) for k, v in w.items() if k.startswith("final_layer.") and k.split(".")[1] in ("video_out", "audio_out")}
    if cfg.pdd_heads == 1:
        ov, oa = linear(wf, "final_layer.video_out", hv), linear(wf, "final_layer.audio_out", ha)
    else:
        if sample_sigmas is None:
            raise ValueError("a PDD head bank needs the sampler's sigma schedule")
        start, stop = pdd_range(cfg.pdd_heads, max(float(sigma), 1e-6), sample_sigmas)
        ov = pdd_head(wf, "final_layer.video_out", hv, cfg.pdd_heads, start, stop, SHIFT_VIDEO)
        oa = pdd_head(wf, "final_layer.audio_out", ha, cfg.pdd_heads, start, stop, SHIFT_AUDIO)

    # 7. Unpatchify: video features (c, ph, pw), rows (t, h, w); audio rows channel-major.
    ov = ov.reshape(T, Hp, Wp, C, 2, 2).permute(3, 0, 1, 4, 2, 5).reshape(C, T, H, W)
    oa = oa.reshape(2, Ta, -1).permute(2, 0, 1)
    return -ov, -oa


def sampler_forward(w, video, audio_carried, text, sigma, audio_scale=SHIFT_VIDEO / SHIFT_AUDIO, **kw):
    """The call as ComfyUI's sampler makes it while it samples video and audio together: it holds
    the audio latent as x_a * sigma_v / sigma_a (ModelSamplingAV, audio_scale = 12 / 3). The
    network gets x_a = carried * sigma_a / sigma_v, and its audio output becomes the derivative of
    the carried variable, (1 - audio_scale) x_a + (1 + (audio_scale - 1) sigma_a) out_a."""
    s_v = max(float(sigma), 1e-6)
    s_a = time_shift_sigma(s_v, SHIFT_VIDEO, SHIFT_AUDIO)
    carry = s_a / s_v
    x_a = audio_carried * carry
    ov, oa = h3_forward(w, video, x_a, text, sigma, **kw)
    return ov, (1.0 - audio_scale) * x_a + (1.0 + (audio_scale - 1.0) * s_a) * oa


def comfy_kwargs(cfg):
    """The constructor arguments of ComfyUI's MiniMaxH3Model for `cfg` (dtype, device and
    operations aside)."""
    kw = dict(hidden_size=cfg.hidden, num_layers=cfg.layers, token_refiner_num_layers=cfg.refiner_layers,
              num_attention_heads=cfg.heads, attention_head_dim=cfg.head_dim, ffn_hidden_size=cfg.ffn,
              latents_dim=cfg.latent_channels, audio_latents_dim=cfg.audio_channels, text_dim=cfg.text_dim,
              rope_inv_freq_len=cfg.rope_pairs, time_embed_dim=cfg.time_dim, gate_compress=cfg.gate_compress)
    if cfg.curve_grid:
        kw["adaln_curve_grid"] = cfg.curve_grid
    else:
        kw.update(timestep_input_dim=cfg.freq_dim, time_embed_hidden_size=cfg.time_hidden)
    return kw


def random_inputs(cfg=TINY, text_len=9, latent_t=7, lat_h=6, lat_w=8, audio_t=5, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {"video": torch.randn(cfg.latent_channels, latent_t, lat_h, lat_w, generator=g).to(dtype),
            "audio": torch.randn(cfg.audio_channels, 2, audio_t, generator=g).to(dtype),
            "text": torch.randn(text_len, cfg.text_dim, generator=g).to(dtype)}


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("--curve", action="store_true")
    ap.add_argument("--gate-compress", action="store_true")
    ap.add_argument("--pdd", type=int, default=1)
    ap.add_argument("--sigma", type=float, default=0.7)
    args = ap.parse_args(argv)
    if not args.selftest:
        ap.error("nothing to do (try --selftest)")
    cfg = replace(TINY, gate_compress=args.gate_compress, pdd_heads=args.pdd)
    if args.curve:
        cfg = replace(cfg, curve_grid=17, time_dim=8, freq_dim=0, time_hidden=0)
    sd = make_state_dict(cfg, dtype=torch.float64, prefix="model.diffusion_model.")
    inp = random_inputs(cfg, dtype=torch.float64)
    sched = [1.0, 0.9, 0.8, 0.7, 0.5, 0.2, 0.0]
    with torch.no_grad():
        ref = h3_forward(sd, **inp, sigma=args.sigma, sample_sigmas=sched)
        out = h3_forward(to_dtype(sd, torch.float32), **{k: v.float() for k, v in inp.items()},
                         sigma=args.sigma, sample_sigmas=sched)
    for name, a, b in (("video", out[0], ref[0]), ("audio", out[1], ref[1])):
        print(f"h3 {name} {list(a.shape)}: fp32 vs fp64 rel L2 {rel_l2(a, b):.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
