// MiniMax H3 (joint video + stereo audio DiT), text to video + audio, as ComfyUI's
// MiniMaxH3Model computes it: its inputs, prologue and epilogue are docs/checkpoints.md's
// "MiniMax H3" section; the plain-torch statement is tests/reference/minimax_h3.py.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "models/family_common.hpp"
#include "models/family_table.hpp"

namespace sp::models::detail {

namespace {

constexpr int kTagVideo = 0, kTagText = 1, kTagAudio = 2;
constexpr double kShiftVideo = 12, kShiftAudio = 3;
constexpr double kFrameRescale = 5.0 / 3.0;
constexpr int64_t kFramePerToken[5] = {1, 4, 4, 4, 4};

ir::Norm affine_rms(const std::string& weight, double eps) { return {ir::NormKind::RMSNorm, true, weight, "", eps}; }

// The packed sequence: text runs of equal modality tag, then the audio rows, then the video.
struct Layout {
  std::vector<std::pair<std::string, int>> text_runs;  // segment name, tag
  std::vector<int64_t> run_lengths;
  int64_t audio = 0, video = 0;
};

Layout layout_of(const at::Tensor& tags, int64_t audio_rows, int64_t video_rows) {
  Layout l{{}, {}, audio_rows, video_rows};
  const at::Tensor t = tags.to(at::kLong).cpu().contiguous();
  const int64_t* p = t.data_ptr<int64_t>();
  const int64_t L = t.numel();
  for (int64_t i = 0; i < L;) {
    int64_t j = i;
    while (j < L && p[j] == p[i]) ++j;
    if (p[i] < 0 || p[i] > 2)
      throw std::invalid_argument("inputs: text_tags[" + std::to_string(i) + "] is " + std::to_string(p[i]) +
                                  "; modality tags are 0 (video), 1 (text) or 2 (audio)");
    l.text_runs.push_back({"text." + std::to_string(l.text_runs.size()), int(p[i])});
    l.run_lengths.push_back(j - i);
    i = j;
  }
  if (l.text_runs.size() == 1) l.text_runs[0].first = "text";
  return l;
}

bool keeps_fp32(const recognize::FamilyConfig& c, const std::string& canonical);

// `refine`: the text comes as encoder states, so the model starts with the text path:
// condition_proj as the text segments' embedding, then the token refiner, blocks over the text
// rows only (pre-norm, no modulation, no RoPE), the last one followed by the refiner's final
// norm of those rows.
ir::Model build(const recognize::FamilyConfig& c, const Layout& lay, ir::DType dtype, const std::string& consumer,
                bool refine) {
  // Linears the weights hold in fp32 in a 16-bit model (weight_dtype).
  auto held = [&](ir::Linear l) {
    if (dtype != ir::DType::F32 && dtype != ir::DType::F64 && keeps_fp32(c, l.weight)) l.stored = ir::DType::F32;
    return l;
  };
  ir::Model m;
  m.name = c.variant;
  m.dim = c.dim;
  m.dtype = dtype;
  for (size_t r = 0; r < lay.text_runs.size(); ++r) m.segments.push_back({lay.text_runs[r].first, lay.run_lengths[r]});
  m.segments.push_back({"audio", lay.audio});
  m.segments.push_back({"video", lay.video});
  std::vector<std::string> text;
  for (const auto& run : lay.text_runs) text.push_back(run.first);
  // A block under `p`: attention and SwiGLU MLP, each after an affine RMSNorm. DiT blocks (`dit`)
  // are modulated and rotate Q/K over all rows; refiner blocks run over the text rows only.
  auto block = [&](const std::string& name, const std::string& p, bool dit) {
    ir::Block b;
    b.name = name;
    if (dit) b.modulation = {ir::ModScope::PerSegment, 6, p + "mod"};
    ir::Attention a = fused_qkv_attention(p, {"attn.qkv_proj", "attn.q_norm.weight", "attn.k_norm.weight", "attn.out_proj"},
                                          c, consumer);
    if (!dit) a.rope = ir::Rope{};
    const std::vector<std::string> rows = dit ? std::vector<std::string>{} : text;
    b.sublayers.push_back({"attn", rows, affine_rms(p + "norm1.weight", c.eps), dit ? ir::ModRef{0, 1, 2} : ir::ModRef{}, a});
    b.sublayers.push_back({"mlp", rows, affine_rms(p + "norm2.weight", c.eps), dit ? ir::ModRef{3, 4, 5} : ir::ModRef{},
                           swiglu_halves(p + "mlp.fc1", p + "mlp.fc2", c)});
    return b;
  };
  if (refine) {
    for (const auto& name : text) m.embeds.push_back({name, linear("condition_proj", c.text_dim, c.dim, true)});
    for (int64_t r = 0; r < c.refiner_layers; ++r) {
      ir::Block b = block("refiner." + std::to_string(r), "token_refiner.blocks." + std::to_string(r) + ".", false);
      if (r + 1 == c.refiner_layers) b.post_norm = ir::RowNorm{text, affine_rms("token_refiner.final_norm.weight", c.eps)};
      m.blocks.push_back(std::move(b));
    }
  }
  ir::Linear audio_in = held(linear("audio_patch_proj", c.audio_dim, c.dim, true));
  ir::Linear video_in = held(linear("video_patch_proj", c.in_channels, c.dim, true));
  audio_in.fp32_compute = video_in.fp32_compute = true;
  m.embeds.push_back({"audio", audio_in});
  m.embeds.push_back({"video", video_in});
  for (int64_t i = 0; i < c.layers; ++i) m.blocks.push_back(block(std::to_string(i), blk(i), true));
  // Final layer: shift first, then scale; the video head is the output width, the audio head
  // fills the leading columns of the audio rows.
  m.final_layer = final_layer({"audio", "video"}, affine_rms("final_layer.norm.weight", c.eps), ir::ModScope::PerSegment,
                              "final.mod", held(linear("final_layer.video_out", c.dim, c.in_channels, true)));
  ir::Linear audio_out = held(linear("final_layer.audio_out", c.dim, c.audio_dim, true));
  audio_out.fp32_compute = true;
  m.final_layer->heads.push_back({"audio", audio_out});
  ir::validate(m);
  return m;
}

// sigma of the `from` schedule at the same base-grid point of the `to` schedule.
double time_shift_sigma(double sigma, double from, double to) {
  const double base = sigma / (from + sigma * (1.0 - from));
  return to * base / (1.0 + (to - 1.0) * base);
}

// [M, time_dim] time embedding of the distinct timesteps, fp32.
at::Tensor time_embedding(const recognize::FamilyConfig& c, const exec::WeightSource& w, const std::vector<double>& ts,
                          const at::Device& dev) {
  if (c.time_table_rows > 0) {
    // Rows interpolated at t * (G - 1), in fp32 arithmetic as the reference does it.
    const at::Tensor table = w.tensor("adaln_t_table").to(at::kFloat);
    const int64_t G = table.size(0);
    std::vector<at::Tensor> rows;
    for (double tv : ts) {
      const float p = std::clamp(float(tv), 0.0f, 1.0f) * float(G - 1);
      const int64_t i0 = std::min<int64_t>(int64_t(std::floor(p)), G - 2);
      rows.push_back(at::lerp(table.select(0, i0), table.select(0, i0 + 1), p - float(i0)));
    }
    return at::stack(rows);
  }
  std::vector<at::Tensor> rows;
  for (double tv : ts) rows.push_back(sinusoid(at::full({1}, float(tv), at::TensorOptions().device(dev)), c.freq_dim));
  const at::Tensor e = at::stack(rows);
  auto fp32_linear = [&](const std::string& name, const at::Tensor& x) {
    return at::linear(x, w.tensor(name + ".weight").to(at::kFloat), w.tensor(name + ".bias").to(at::kFloat));
  };
  return fp32_linear("time_embedder.proj_out", at::silu(fp32_linear("time_embedder.proj_in", e)));
}

// Area-normalized coordinates of the 2x2 patches along one latent axis of length n_latent.
at::Tensor axis_coords(int64_t n_latent, double sqrt_area) {
  const double r = double(n_latent) / sqrt_area;
  const int64_t n = n_latent / 2;
  return (at::arange(n, at::kDouble) * (r / double(n)) + (1.0 - r) / 2.0) * 32.0;
}

// Positions (t, h, w) [S, 3] float64 of [text | audio | video].
at::Tensor positions(int64_t L, int64_t T, int64_t H, int64_t W, int64_t Ta) {
  const double sq = std::sqrt(double(H * W));
  const at::Tensor ah = axis_coords(H, sq), aw = axis_coords(W, sq);
  const int64_t Hp = H / 2, Wp = W / 2;
  at::Tensor text = at::zeros({L, 3}, at::kDouble);
  text.select(1, 0).copy_(at::arange(L, at::kDouble));
  const double origin = double(L);
  at::Tensor audio = at::zeros({2 * Ta, 3}, at::kDouble);
  audio.select(1, 0).copy_((at::arange(Ta, at::kDouble) + origin).repeat({2}));
  audio.narrow(0, 0, Ta).select(1, 2).fill_(aw[0].item<double>());
  audio.narrow(0, Ta, Ta).select(1, 2).fill_(aw[Wp - 1].item<double>());
  at::Tensor video = at::empty({T, Hp * Wp, 3}, at::kDouble);
  double frame_t = origin;
  const auto grid = at::meshgrid({ah, aw}, "ij");
  for (int64_t k = 0; k < T; ++k) {
    video[k].select(1, 0).fill_(frame_t);
    frame_t += kFrameRescale * double(kFramePerToken[k % 5]);
  }
  video.select(2, 1).copy_(grid[0].reshape({1, -1}).expand({T, Hp * Wp}));
  video.select(2, 2).copy_(grid[1].reshape({1, -1}).expand({T, Hp * Wp}));
  return at::cat({text, audio, video.reshape({-1, 3})}, 0);
}

FamilyRun prepare(const recognize::FamilyConfig& c, const exec::WeightSource& w, const TensorMap& raw,
                  ir::DType dtype, const std::string& consumer) {
  if (c.head_bank > 1)
    throw std::invalid_argument("minimax-h3: a PDD head bank (" + std::to_string(c.head_bank) +
                                " heads per output) needs the sampler's sigma schedule, which this forward does not "
                                "take yet");
  const int64_t C = c.in_channels / 4;
  const at::Tensor& video = need(raw, "video", {C, -1, -1, -1});
  const at::Tensor& audio = need(raw, "audio", {c.audio_dim, 2, -1});
  const at::Tensor& text = need(raw, "text", {-1, -1});
  const at::Tensor& sigma_in = need(raw, "sigma", {1});
  if (text.size(1) != c.text_dim && text.size(1) != c.dim)
    throw std::invalid_argument("inputs: text has " + std::to_string(text.size(1)) + " features; expected " +
                                std::to_string(c.text_dim) + " (encoder states) or " + std::to_string(c.dim) +
                                " (already refined)");
  const int64_t T = video.size(1), H = video.size(2), W = video.size(3), Ta = audio.size(2), L = text.size(0);
  if (H % 2 || W % 2)
    throw std::invalid_argument("inputs: video latent sides must be even (2x2 patches), got " + std::to_string(H) + "x" +
                                std::to_string(W));
  at::Tensor tags = raw.count("text_tags") ? raw.at("text_tags") : at::full({L}, int64_t{kTagText}, at::kLong);
  if (tags.numel() != L)
    throw std::invalid_argument("inputs: text_tags has " + std::to_string(tags.numel()) + " entries for " +
                                std::to_string(L) + " text tokens");
  const at::Device dev = w.tensor("video_patch_proj.weight").device();
  const at::ScalarType dt = exec::to_aten(dtype);
  const at::ScalarType acc = exec::to_aten(plan::accumulation_dtype(dtype));
  const int64_t Hp = H / 2, Wp = W / 2;

  FamilyRun run;
  const Layout lay = layout_of(tags, 2 * Ta, T * Hp * Wp);
  run.model = build(c, lay, dtype, consumer, /*refine=*/text.size(1) != c.dim);

  // Tokens: text (encoder states, or refined already) in the activation dtype; patches and audio
  // rows in fp32 (their projections run in it).
  const at::Tensor txt = text.to(dev, dt);
  for (size_t r = 0, at_ = 0; r < lay.text_runs.size(); at_ += size_t(lay.run_lengths[r]), ++r)
    run.inputs.tokens[lay.text_runs[r].first] = txt.narrow(0, int64_t(at_), lay.run_lengths[r]).contiguous();
  run.inputs.tokens["video"] = video.to(dev, acc).reshape({C, T, Hp, 2, Wp, 2}).permute({1, 2, 4, 0, 3, 5}).reshape(
      {T * Hp * Wp, C * 4}).contiguous();
  run.inputs.tokens["audio"] = audio.to(dev, acc).permute({1, 2, 0}).reshape({2 * Ta, c.audio_dim}).contiguous();

  // Timesteps: video (and text) t = 1 - sigma; audio on its own shifted schedule.
  const double sigma = std::max(sigma_in.to(at::kDouble).item<double>(), 1e-6);
  const double t_v = 1.0 - sigma, t_a = 1.0 - time_shift_sigma(sigma, kShiftVideo, kShiftAudio);
  const std::set<double> distinct{t_v, t_a};
  const std::vector<double> ts(distinct.begin(), distinct.end());
  auto cls = [&](double t) { return int64_t(std::find(ts.begin(), ts.end(), t) - ts.begin()); };
  const int64_t M = int64_t(ts.size());

  // Modulation rows: every block's adaln linear on the time embedding ([M, 3 tags x 6 x dim]),
  // one row per segment: (timestep class) * 3 + tag.
  at::Tensor temb = time_embedding(c, w, ts, dev);
  const bool curve = c.time_table_rows > 0;
  const at::ScalarType mdt = curve ? acc : dt;  // the adaln linears' dtype
  const at::Tensor adaln_in = curve ? temb.to(mdt) : at::silu(temb.to(mdt));
  std::vector<int64_t> seg_rows;
  for (const auto& [name, tag] : lay.text_runs) seg_rows.push_back(cls(t_v) * 3 + tag);
  seg_rows.push_back(cls(t_a) * 3 + kTagAudio);
  seg_rows.push_back(cls(t_v) * 3 + kTagVideo);
  auto adaln = [&](const std::string& name) {
    // A quantized adaln linear as its format's GEMM computes it (the host's fp8 matmul), else in mdt.
    if (at::Tensor y = w.native_linear(name + ".weight", adaln_in, w.tensor(name + ".bias")); y.defined()) return y;
    return at::linear(adaln_in, w.tensor(name + ".weight").to(mdt), w.tensor(name + ".bias").to(mdt));
  };
  for (int64_t i = 0; i < c.layers; ++i) {  // stacked selects: index_select has no meta kernel
    const at::Tensor all = adaln(blk(i) + "adaln_proj.linear").reshape({M * 3, 6, c.dim});
    std::vector<at::Tensor> rows;
    for (int64_t r : seg_rows) rows.push_back(all.select(0, r));
    run.inputs.tables[blk(i) + "mod"] = at::stack(rows).to(dt);
  }
  // Final layer: (shift, scale) per timestep class, no modality tag; text rows are not projected.
  const at::Tensor fm = adaln("final_layer.adaln_proj.linear").reshape({M, 2, c.dim});
  at::Tensor fmod = at::zeros({int64_t(seg_rows.size()), 2, c.dim}, fm.options());
  fmod[int64_t(lay.text_runs.size())].copy_(fm[cls(t_a)]);
  fmod[int64_t(lay.text_runs.size()) + 1].copy_(fm[cls(t_v)]);
  run.inputs.tables["final.mod"] = fmod.to(dt);

  // RoPE: angle (axis a, pair i) = position[a] * inv_freq[i], axes t | h | w.
  const at::Tensor inv = w.tensor("rope.inv_freq").to(dev, at::kFloat);
  const at::Tensor pos = positions(L, T, H, W, Ta).to(dev).to(at::kFloat);
  const at::Tensor ang = (pos.unsqueeze(2) * inv.view({1, 1, -1})).reshape({pos.size(0), -1});
  if (ang.size(1) * 2 != c.rotary_dim)
    throw std::invalid_argument("minimax-h3: rope.inv_freq gives " + std::to_string(ang.size(1) * 2) +
                                " rotary dims, the config " + std::to_string(c.rotary_dim));
  run.inputs.tables["rope.cos"] = ang.cos();
  run.inputs.tables["rope.sin"] = ang.sin();

  // Output rows [audio | video] x video features: unpatchify, negate. The negation is in place
  // on the unpatchified copy, so that the output rows and one copy are all that coexist.
  const int64_t Na = 2 * Ta, Fa = c.audio_dim, Fv = c.in_channels;
  auto negated = [](at::Tensor v, const at::Tensor& rows) {
    return v.storage().is_alias_of(rows.storage()) ? v.neg() : v.neg_();
  };
  auto video_of = [=](const at::Tensor& out) {
    return negated(
        out.narrow(0, Na, T * Hp * Wp).narrow(1, 0, Fv).reshape({T, Hp, Wp, C, 2, 2}).permute({3, 0, 1, 4, 2, 5}).reshape(
            {C, T, H, W}),
        out);
  };
  run.finish = video_of;
  run.named_outputs = [=](const at::Tensor& out) {
    return TensorMap{
        {"video", video_of(out)},
        {"audio", negated(out.narrow(0, 0, Na).narrow(1, 0, Fa).reshape({2, Ta, Fa}).permute({2, 0, 1}).contiguous(), out)}};
  };
  return run;
}

TensorMap random_inputs(const recognize::FamilyConfig& c, const Geometry& g, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  int64_t T = 1, H = 2, W = 2 * std::max<int64_t>(1, g.tokens);
  if (g.tokens <= 0) {
    if (g.frames <= 0 || g.height <= 0 || g.width <= 0 || g.height % 32 || g.width % 32)
      throw std::invalid_argument("minimax-h3 geometry: latent frames positive, height and width positive multiples "
                                  "of 32, got " + std::to_string(g.frames) + "x" + std::to_string(g.height) + "x" +
                                  std::to_string(g.width));
    T = g.frames;
    H = g.height / 16;
    W = g.width / 16;
  }
  // Audio: 40 latent frames a second of 24 fps video, latent frame k spanning 1 or 4 pixel frames.
  int64_t pixel_frames = 1;
  for (int64_t k = 1; k < T; ++k) pixel_frames += kFramePerToken[k % 5];
  const int64_t Ta = g.audio_tokens > 0 ? g.audio_tokens : std::max<int64_t>(1, std::llround(double(pixel_frames) * 40 / 24));
  TensorMap raw;
  raw["video"] = at::randn({c.in_channels / 4, T, H, W}, gen);
  raw["audio"] = at::randn({c.audio_dim, 2, Ta}, gen);
  raw["text"] = at::randn({g.text_tokens > 0 ? g.text_tokens : c.text_tokens, c.text_dim}, gen);
  raw["sigma"] = at::full({1}, 0.7);
  return raw;
}

// What ComfyUI keeps in fp32 in a bf16 model.
bool keeps_fp32(const recognize::FamilyConfig& c, const std::string& n) {
  auto starts = [&](const char* p) { return n.rfind(p, 0) == 0; };
  if (starts("video_patch_proj.") || starts("audio_patch_proj.") || starts("time_embedder.") ||
      starts("adaln_t_table") || starts("final_layer.video_out.") || starts("final_layer.audio_out."))
    return true;
  // The curve form's adaln linears take the fp32 table rows.
  return c.time_table_rows > 0 && n.find("adaln_proj.linear.") != std::string::npos;
}

}  // namespace

const FamilyOps kMinimaxH3{"minimax-h3", random_inputs, prepare, keeps_fp32};

}  // namespace sp::models::detail
