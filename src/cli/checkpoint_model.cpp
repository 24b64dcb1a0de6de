#include "cli/checkpoint_model.hpp"

#include <new>
#include <optional>

#include "cli/options.hpp"
#include "exec/formats/quantized.hpp"
#include "models/checkpoint.hpp"
#include "models/quant_load.hpp"
#include "models/tensor_io.hpp"
#include "plan/budget.hpp"
#include "exec/run/retry.hpp"
#include "report/report.hpp"

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

namespace {

// "--frames 5 --height 64" for the geometry options given.
std::string geometry_given(const models::Geometry& g) {
  std::string s;
  for (const auto& [name, v] : {std::pair{"--frames", g.frames}, {"--height", g.height}, {"--width", g.width}})
    if (v > 0) s += std::string(s.empty() ? "" : " ") + name + " " + std::to_string(v);
  return s;
}

// The ATen type of a stored dtype: the one models::to_io maps to it.
at::ScalarType aten_of(io::DType d, const std::string& name) {
  for (at::ScalarType t : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kFloat8_e4m3fn, at::kFloat8_e5m2,
                           at::kLong, at::kInt, at::kShort, at::kChar, at::kByte, at::kBool}) {
    try {
      if (models::to_io(t, name) == d) return t;
    } catch (const std::invalid_argument&) {
    }
  }
  throw std::invalid_argument("tensor '" + name + "': unsupported dtype");
}

at::Tensor meta_tensor(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorInfo& info = f.info(name);
  return at::empty(info.shape, at::TensorOptions().dtype(aten_of(info.dtype, name)).device(at::kMeta));
}

int64_t input_bytes(const exec::Inputs& in) {
  int64_t n = 0;
  for (const auto* group : {&in.tokens, &in.tables})
    for (const auto& [name, t] : *group) n += int64_t(t.nbytes());
  return n;
}

struct Built {
  ir::Model model;
  int64_t input_bytes;
};

Built build(const recognize::Recognized& rec, exec::TensorWeights& w, const models::TensorMap& raw, ir::DType dtype,
            const std::string& consumer, const contracts::Registry& reg) {
  models::FamilyRun fr = models::prepare_loaded(rec.config, w, reg, raw, dtype, consumer);
  models::apply_precision(fr.model, w, models::Precision::Preserve, {});
  return {fr.model, input_bytes(fr.inputs)};
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
  Built out = at[0];
  const ir::Model &m2 = at[1].model, &m3 = at[2].model;
  if (m2.segments.size() != out.model.segments.size() || m3.segments.size() != out.model.segments.size() ||
      m2.contexts.size() != out.model.contexts.size() || m3.contexts.size() != out.model.contexts.size())
    return std::nullopt;
  for (size_t i = 0; i < out.model.segments.size(); ++i) {
    const auto v = extend(out.model.segments[i].length, m2.segments[i].length, m3.segments[i].length);
    if (!v) return std::nullopt;
    out.model.segments[i].length = *v;
  }
  for (size_t i = 0; i < out.model.contexts.size(); ++i) {
    const auto v = extend(out.model.contexts[i].length, m2.contexts[i].length, m3.contexts[i].length);
    if (!v) return std::nullopt;
    out.model.contexts[i].length = *v;
  }
  const int64_t step = (at[1].input_bytes - at[0].input_bytes) / t;
  out.input_bytes = at[0].input_bytes + (n - t) * step;
  return out;
}

bool out_of_memory(const std::exception& e) {
  return dynamic_cast<const std::bad_alloc*>(&e) || exec::is_out_of_memory(e);
}

}  // namespace

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

void check_segments(const ir::Model& m, const models::Geometry& g) {
  if (g.audio_tokens <= 0) return;
  for (const auto& s : m.segments)
    if (s.name == "audio") return;
  for (const auto& c : m.contexts)
    if (c.name == "audio") return;
  std::string segments, contexts;
  for (const auto& s : m.segments) segments += (segments.empty() ? "" : ", ") + s.name;
  for (const auto& c : m.contexts) contexts += (contexts.empty() ? "" : ", ") + c.name;
  throw std::invalid_argument("--audio-tokens " + std::to_string(g.audio_tokens) + ": " + m.name +
                              " has no audio tokens (token segments: " + segments +
                              (contexts.empty() ? "" : "; contexts: " + contexts) + ")");
}

ir::DType run_dtype(const std::string& option, const at::Device& d) {
  if (option == "auto") return d.is_cuda() ? ir::DType::BF16 : ir::DType::F32;
  return ir::parse_dtype(option, "--dtype");
}

std::shared_ptr<exec::TensorWeights> meta_weights(const io::SafetensorsFile& f, const recognize::Recognized& r,
                                                  at::ScalarType dtype, const contracts::Registry& reg) {
  auto w = std::make_shared<exec::TensorWeights>(&reg);
  const auto meta = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
  for (const auto& [canonical, src] : r.tensors) {
    std::vector<at::Tensor> parts;
    const recognize::QuantSpec* q = nullptr;
    for (const auto& n : src.tensors) {
      parts.push_back(meta_tensor(f, n));
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

MetaModel meta_model(const io::SafetensorsFile& f, const recognize::Recognized& rec, const std::string& inputs,
                     const models::Geometry& g, uint64_t seed, ir::DType dtype, const std::string& consumer,
                     const contracts::Registry& reg) {
  check_geometry(g, inputs);
  MetaModel mm;
  mm.weights = meta_weights(f, rec, exec::to_aten(dtype), reg);
  mm.weight_bytes = mm.weights->total_bytes();
  if (!inputs.empty()) {
    mm.raw = models::read_tensors(inputs);
  } else {
    if (g.tokens <= 0 && g.height <= 0)
      throw std::invalid_argument("give --inputs, --tokens, or the geometry (--frames/--height/--width)");
    try {
      mm.raw = models::random_raw_inputs(rec.config, g, seed);
    } catch (const std::exception& e) {
      if (!out_of_memory(e)) throw;
      std::optional<Built> b;
      if (g.tokens > 0) b = extrapolate(rec, *mm.weights, g, seed, dtype, consumer, reg);
      if (!b)
        throw plan::BudgetError("the random inputs of this geometry do not fit in host memory: " +
                                    std::string(e.what()).substr(0, std::string(e.what()).find('\n')),
                                0, 0);
      mm.model = std::move(b->model);
      mm.input_bytes = b->input_bytes;
      mm.note = "the inputs of --tokens " + std::to_string(g.tokens) +
                " do not fit in host memory; the model's lengths are extrapolated from 64, 128 and 192 tokens";
      check_segments(mm.model, g);
      return mm;
    }
  }
  Built b = build(rec, *mm.weights, mm.raw, dtype, consumer, reg);
  mm.model = std::move(b.model);
  mm.input_bytes = b.input_bytes;
  check_segments(mm.model, g);
  return mm;
}

}  // namespace sp::cli
