#include "cli/checkpoint_model.hpp"

#include <algorithm>
#include <new>
#include <optional>

#include "cli/options.hpp"
#include "exec/formats/quantized.hpp"
#include "models/checkpoint.hpp"
#include "models/quant_load.hpp"
#include "models/tensor_io.hpp"
#include "plan/budget.hpp"
#include "exec/run/retry.hpp"

namespace sp::cli {

void add_geometry_options(CLI::App* cmd, models::Geometry& g, bool tokens) {
  cmd->add_option("--frames", g.frames, "video frames (Wan: pixel frames 4k+1; avdit, MiniMax H3: latent frames)")
      ->check(at_least(1));
  cmd->add_option("--height", g.height, "pixel height")->check(at_least(1));
  cmd->add_option("--width", g.width, "pixel width")->check(at_least(1));
  if (tokens)
    cmd->add_option("--tokens", g.tokens, "video/image tokens in one row instead of a geometry")->check(at_least(1));
  cmd->add_option("--text-tokens", g.text_tokens, "text tokens (default: the family's)")->check(at_least(1));
  cmd->add_option("--audio-tokens", g.audio_tokens, "audio tokens (avdit); audio latent frames (MiniMax H3)")
      ->check(at_least(1));
}

ir::DType run_dtype(const std::string& option, const at::Device& d) {
  if (option == "auto") return d.is_cuda() ? ir::DType::BF16 : ir::DType::F32;
  return ir::parse_dtype(option, "--dtype");
}

namespace {

// "--frames 5 --height 64" for the geometry options given.
std::string geometry_given(const models::Geometry& g) {
  std::string s;
  for (const auto& [name, v] : {std::pair{"--frames", g.frames}, {"--height", g.height}, {"--width", g.width}})
    if (v > 0) s += std::string(s.empty() ? "" : " ") + name + " " + std::to_string(v);
  return s;
}

struct Built {
  ir::Model model;
  int64_t input_bytes;  // the prepared inputs' (tokens, tables)
};

Built build(const recognize::Recognized& rec, exec::TensorWeights& w, const models::TensorMap& raw, ir::DType dtype,
            const std::string& consumer, const contracts::Registry& reg) {
  models::FamilyRun fr = models::prepare_loaded(rec.config, w, reg, raw, dtype, consumer);
  models::apply_precision(fr.model, w, models::Precision::Preserve, {});
  Built b{fr.model, 0};
  for (const auto* group : {&fr.inputs.tokens, &fr.inputs.tables})
    for (const auto& [name, t] : *group) b.input_bytes += int64_t(t.nbytes());
  return b;
}

// The model at --tokens n from the models at t, 2t and 3t tokens: each segment's and
// context's length, and the inputs' bytes, continued along the line through the first two;
// none unless the third lies on it too.
std::optional<Built> extrapolate(const recognize::Recognized& rec, exec::TensorWeights& w, models::Geometry g,
                                 uint64_t seed, ir::DType dtype, const std::string& consumer,
                                 const contracts::Registry& reg) {
  const int64_t n = g.tokens, t = 64;
  std::vector<Built> at;
  for (int64_t k : {t, 2 * t, 3 * t}) {
    g.tokens = k;
    at.push_back(build(rec, w, models::random_raw_inputs(rec.config, g, seed), dtype, consumer, reg));
  }
  // v at n from v(t) and v(2t), if v(3t) continues the line and the step is whole per token.
  auto extend = [&](int64_t v1, int64_t v2, int64_t v3) -> std::optional<int64_t> {
    if (v3 - v2 != v2 - v1 || (v2 - v1) % t != 0) return std::nullopt;
    return v1 + (n - t) * ((v2 - v1) / t);
  };
  // Each length of `out` (segments, then contexts) continued; false where one is not.
  auto extend_all = [&](auto& out, const auto& at2, const auto& at3) {
    if (at2.size() != out.size() || at3.size() != out.size()) return false;
    for (size_t i = 0; i < out.size(); ++i) {
      const auto v = extend(out[i].length, at2[i].length, at3[i].length);
      if (!v) return false;
      out[i].length = *v;
    }
    return true;
  };
  Built out = at[0];
  if (!extend_all(out.model.segments, at[1].model.segments, at[2].model.segments) ||
      !extend_all(out.model.contexts, at[1].model.contexts, at[2].model.contexts))
    return std::nullopt;
  out.input_bytes = at[0].input_bytes + (n - t) * ((at[1].input_bytes - at[0].input_bytes) / t);
  return out;
}

// Options that contradict each other: --tokens with --frames/--height/--width, --inputs with any of them.
void check_geometry(const models::Geometry& g, const std::string& inputs) {
  const std::string geometry = geometry_given(g);
  if (!inputs.empty() && (g.tokens > 0 || !geometry.empty()))
    throw std::invalid_argument("--inputs " + inputs + " and " +
                                (g.tokens > 0 ? "--tokens " + std::to_string(g.tokens) : geometry) +
                                ": the inputs file sets the geometry; give one or the other");
  if (g.tokens > 0 && !geometry.empty())
    throw std::invalid_argument("--tokens " + std::to_string(g.tokens) + " and " + geometry +
                                ": give --tokens (video tokens in one row) or the geometry, not both");
}

// Options the model has no use for: --audio-tokens where it has no audio segment.
void check_segments(const ir::Model& m, const models::Geometry& g) {
  if (g.audio_tokens <= 0) return;
  std::string segments, contexts;
  for (const auto& s : m.segments) segments += (segments.empty() ? "" : ", ") + s.name;
  for (const auto& c : m.contexts) contexts += (contexts.empty() ? "" : ", ") + c.name;
  const auto audio = [](const auto& s) { return s.name == "audio"; };
  if (std::ranges::any_of(m.segments, audio) || std::ranges::any_of(m.contexts, audio)) return;
  throw std::invalid_argument("--audio-tokens " + std::to_string(g.audio_tokens) + ": " + m.name +
                              " has no audio tokens (token segments: " + segments +
                              (contexts.empty() ? "" : "; contexts: " + contexts) + ")");
}

// The checkpoint's canonical weights as meta tensors in `dtype` (load_canonical without the data).
std::shared_ptr<exec::TensorWeights> meta_weights(const io::SafetensorsFile& f, const recognize::Recognized& r,
                                                  at::ScalarType dtype, const contracts::Registry& reg) {
  auto w = std::make_shared<exec::TensorWeights>(&reg);
  const auto meta = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
  for (const auto& [canonical, src] : r.tensors) {
    std::vector<at::Tensor> parts;
    const recognize::QuantSpec* q = nullptr;
    for (const auto& n : src.tensors) {
      parts.push_back(at::empty(f.info(n).shape, meta.dtype(models::to_aten(f.info(n).dtype, n))));
      if (auto it = r.quant.find(n); it != r.quant.end()) q = &it->second;
    }
    const at::Tensor t = models::assemble(canonical, src, parts);
    if (!q) {
      w->add(canonical, t.is_floating_point() ? t.to(models::weight_dtype(r.config, canonical, dtype)) : t);
      continue;
    }
    // As stored, with a scale per output row (loading makes one where parts are joined).
    w->add(canonical, t);
    w->add(exec::quant::scale_name(canonical), at::empty({t.size(0)}, meta));
    if (!q->input_scale.empty() && q->format == "fp8-e4m3")
      w->add(exec::quant::input_scale_name(canonical), at::empty({}, meta));
    w->note_format(canonical, {q->format, "checkpoint: " + q->origin});
  }
  return w;
}

}  // namespace

MetaModel meta_model(const io::SafetensorsFile& f, const recognize::Recognized& rec, const std::string& inputs,
                     const models::Geometry& g, uint64_t seed, ir::DType dtype, const std::string& consumer,
                     const contracts::Registry& reg) {
  check_geometry(g, inputs);
  MetaModel mm;
  mm.weights = meta_weights(f, rec, exec::to_aten(dtype), reg);
  mm.weight_bytes = mm.weights->total_bytes();
  std::optional<Built> b;
  if (!inputs.empty()) {
    mm.raw = models::read_tensors(inputs);
  } else {
    if (g.tokens <= 0 && g.height <= 0)
      throw std::invalid_argument("give --inputs, --tokens, or the geometry (--frames/--height/--width)");
    try {
      mm.raw = models::random_raw_inputs(rec.config, g, seed);
    } catch (const std::exception& e) {
      if (!dynamic_cast<const std::bad_alloc*>(&e) && !exec::is_out_of_memory(e)) throw;
      if (g.tokens > 0) b = extrapolate(rec, *mm.weights, g, seed, dtype, consumer, reg);
      if (!b)
        throw plan::BudgetError("the random inputs of this geometry do not fit in host memory: " +
                                    std::string(e.what()).substr(0, std::string(e.what()).find('\n')),
                                0, 0);
      mm.note = "the inputs of --tokens " + std::to_string(g.tokens) +
                " do not fit in host memory; the model's lengths are extrapolated from 64, 128 and 192 tokens";
    }
  }
  if (!b) b = build(rec, *mm.weights, mm.raw, dtype, consumer, reg);
  mm.model = std::move(b->model);
  mm.input_bytes = b->input_bytes;
  check_segments(mm.model, g);
  return mm;
}

}  // namespace sp::cli
