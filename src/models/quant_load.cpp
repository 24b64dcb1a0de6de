#include "models/quant_load.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string_view>

#include "exec/formats/quantized.hpp"
#include "models/checkpoint.hpp"
#include "models/tensor_io.hpp"

namespace sp::models {

namespace {

// A part's weight scale as one value per row of the part ([rows]), or its one value ([]).
at::Tensor part_scale(const io::SafetensorsFile& f, const recognize::QuantSpec& q, int64_t rows, bool per_row) {
  at::Tensor s = q.weight_scale.empty() ? at::ones({}, at::kFloat) : read_tensor(f, q.weight_scale).to(at::kFloat);
  s = s.numel() == 1 ? s.reshape({}) : s.reshape({rows});
  return per_row ? s.expand({rows}).contiguous() : s;
}

// Opens a note of a weight dequantized at load (prepare_loaded); format_lines recognizes it.
constexpr std::string_view kOutside = "outside the planned formats: ";

// The prologue's view of the weights: a weight held in a quantized format comes dequantized
// (the format's own acquire of the whole weight, in its compute dtype); the names handed out
// so are kept.
class DequantizingView : public exec::WeightSource {
 public:
  DequantizingView(const exec::TensorWeights& w, const contracts::Registry& reg, const recognize::FamilyConfig& c,
                   at::ScalarType dtype)
      : w_(w), reg_(reg), c_(c), dtype_(dtype) {}
  at::Tensor tensor(const std::string& name) const override {
    auto it = w_.format_notes().find(name);
    if (it == w_.format_notes().end() || reg_.format(it->second.format).dense) return w_.tensor(name);
    const at::Tensor stored = w_.tensor(name);
    ir::Linear l;
    l.weight = name;
    l.out_features = stored.size(0);
    l.in_features = stored.size(1);
    l.format = it->second.format;
    read_.insert(name);
    return w_.acquire(l, {}, {}, weight_dtype(c_, name, dtype_));
  }
  bool contains(const std::string& name) const override { return w_.contains(name); }
  at::Tensor acquire(const ir::Linear& l, exec::Slice rows, exec::Slice cols, at::ScalarType dtype,
                     const at::Tensor& out) const override {
    return w_.acquire(l, rows, cols, dtype, out);
  }
  const std::set<std::string>& dequantized() const { return read_; }

 private:
  const exec::TensorWeights& w_;
  const contracts::Registry& reg_;
  const recognize::FamilyConfig& c_;
  at::ScalarType dtype_;
  mutable std::set<std::string> read_;
};

// The linears --precision fp8/int8 leaves as stored (the embeddings and the final layer).
std::set<const ir::Linear*> outside_blocks(const ir::Model& m) {
  std::set<const ir::Linear*> outside;
  for (const auto& e : m.embeds) outside.insert(&e.linear);
  if (m.final_layer) {
    outside.insert(&m.final_layer->proj);
    for (const auto& [segment, l] : m.final_layer->heads) outside.insert(&l);
  }
  return outside;
}

// Why --precision fp8/int8 keeps a dense linear as stored; empty: it converts it.
std::string kept_by_precision(const ir::Linear& l, bool outside) {
  if (outside) return "an embedding or final-layer linear: --precision converts the blocks' linears only";
  if (l.fp32_compute) return "computed in fp32: --precision keeps it";
  if (l.stored) return std::string("held in ") + ir::to_string(*l.stored) + " by the model: --precision keeps it";
  return {};
}

}  // namespace

FamilyRun prepare_loaded(const recognize::FamilyConfig& c, exec::TensorWeights& w, const contracts::Registry& reg,
                         const TensorMap& raw, ir::DType dtype, const std::string& consumer) {
  const DequantizingView view(w, reg, c, exec::to_aten(dtype));
  FamilyRun fr = prepare(c, view, raw, dtype, consumer);
  std::set<std::string> planned;
  ir::for_each_linear(fr.model, [&](ir::Linear& l) { planned.insert(l.weight); });
  for (const auto& name : view.dequantized()) {
    const auto note = w.format_notes().at(name);
    if (planned.count(name) || note.why.starts_with(kOutside)) continue;
    w.note_format(name, {note.format, std::string(kOutside) + "stored " + note.format + " (" + note.why +
                                          "), dequantized at load to " +
                                          c10::toString(weight_dtype(c, name, exec::to_aten(dtype)))});
  }
  return fr;
}

bool load_quantized(const io::SafetensorsFile& f, const recognize::Recognized& r, const std::string& canonical,
                    const recognize::Source& src, const at::Device& device, exec::TensorWeights& w) {
  std::vector<const recognize::QuantSpec*> specs;
  for (const auto& n : src.tensors) {
    auto it = r.quant.find(n);
    specs.push_back(it == r.quant.end() ? nullptr : &it->second);
  }
  if (std::all_of(specs.begin(), specs.end(), [](auto* s) { return s == nullptr; })) return false;
  for (size_t i = 0; i < specs.size(); ++i)
    if (!specs[i] || specs[i]->format != specs.front()->format)
      throw std::invalid_argument("weight '" + canonical + "' is joined from '" + src.tensors.front() + "' (" +
                                  (specs.front() ? specs.front()->format : "dense") + ") and '" + src.tensors[i] +
                                  "' (" + (specs[i] ? specs[i]->format : "dense") + "): mixed formats");
  const recognize::QuantSpec& q = *specs.front();
  std::vector<at::Tensor> parts, scales;
  bool per_row = src.tensors.size() > 1;
  for (const auto* s : specs) per_row = per_row || (!s->weight_scale.empty() && f.info(s->weight_scale).numel() > 1);
  double input_scale = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    parts.push_back(read_tensor(f, src.tensors[i]));
    scales.push_back(part_scale(f, *specs[i], parts.back().size(0), per_row));
    // One activation scale for joined parts: the largest (clips nothing any part would keep).
    if (!specs[i]->input_scale.empty())
      input_scale = std::max(input_scale, read_tensor(f, specs[i]->input_scale).to(at::kDouble).max().item<double>());
  }
  const at::Tensor stored = assemble(canonical, src, parts);
  const at::Tensor scale = per_row ? assemble(canonical, src, scales) : scales.front();
  w.add(canonical, stored.to(device));
  w.add(exec::quant::scale_name(canonical), scale.to(device));
  if (input_scale > 0 && q.format == "fp8-e4m3")
    w.add(exec::quant::input_scale_name(canonical), at::full({}, input_scale, at::kFloat).to(device));
  w.note_format(canonical, {q.format, "checkpoint: " + q.origin});
  return true;
}

Precision parse_precision(const std::string& s) {
  for (Precision p : {Precision::Preserve, Precision::Fp8, Precision::Int8})
    if (s == to_string(p)) return p;
  throw std::invalid_argument("--precision: '" + s + "' is not one of preserve, fp8, int8");
}

const char* to_string(Precision p) { return ir::name_of(p, {"preserve", "fp8", "int8"}); }

const char* precision_format(Precision p) {
  return p == Precision::Preserve ? "" : p == Precision::Fp8 ? "fp8-e4m3" : "int8";
}

void check_precision_device(Precision p, const contracts::DeviceCaps& dev) {
  if (p == Precision::Fp8 && !(dev.kind == contracts::DeviceKind::CUDA && dev.cc_major * 10 + dev.cc_minor >= 89))
    throw std::invalid_argument("--precision fp8 needs fp8 tensor cores (CUDA sm_89 or newer); " + dev.name + " (" +
                                (dev.kind == contracts::DeviceKind::CUDA
                                     ? "sm_" + std::to_string(dev.cc_major) + std::to_string(dev.cc_minor)
                                     : std::string("CPU")) +
                                ") has none. Use --precision int8 or preserve");
}

void apply_precision(ir::Model& m, exec::TensorWeights& w, Precision p, const contracts::DeviceCaps& dev) {
  check_precision_device(p, dev);
  convert_block_linears(m, w, precision_format(p), std::string("converted at load (--precision ") + to_string(p) + ")");
}

void convert_block_linears(ir::Model& m, exec::TensorWeights& w, const std::string& target, const std::string& why) {
  // Embedding and final-layer linears stay as stored: only the blocks are converted.
  const std::set<const ir::Linear*> outside = outside_blocks(m);
  ir::for_each_linear(m, [&](ir::Linear& l) {
    auto it = w.format_notes().find(l.weight);
    if (it != w.format_notes().end()) {
      l.format = it->second.format;
      return;
    }
    if (target.empty() || l.format != "dense" || !kept_by_precision(l, outside.count(&l) != 0).empty()) return;
    l.format = target;
    w.store(l, w.tensor(l.weight), exec::to_aten(m.dtype));
    w.note_format(l.weight, {target, why});
  });
}

std::vector<FormatLine> format_lines(const ir::Model& m, const exec::TensorWeights& w, const contracts::Registry& reg,
                                     const contracts::DeviceCaps& dev, Precision p) {
  std::vector<FormatLine> out;
  const std::set<const ir::Linear*> outside = outside_blocks(m);
  std::set<std::string> named;
  ir::for_each_linear(const_cast<ir::Model&>(m), [&](ir::Linear& l) {
    named.insert(l.weight);
    const contracts::FormatCaps& f = reg.format(l.format);
    std::string gemm = "matmul of the stored weight";
    if (f.native_gemm && f.native_gemm(dev))
      gemm = f.gemm_kernel ? f.gemm_kernel(dev) : "the format's own GEMM";
    else if (!f.dense)
      gemm = "dequantized slice, then a matmul";
    auto it = w.format_notes().find(l.weight);
    std::string why = "format set by the model";
    if (it != w.format_notes().end() && it->second.format == l.format) why = it->second.why;
    else if (l.format == "dense" && p == Precision::Preserve) why = "stored in higher precision; preserved (--precision preserve)";
    else if (l.format == "dense") {
      const std::string kept = kept_by_precision(l, outside.count(&l) != 0);
      why = "stored in higher precision; " + (kept.empty() ? std::string("kept") : kept) + " (--precision " +
            to_string(p) + ")";
    }
    out.push_back({l.weight, l.format, why, gemm, false, {}});
  });
  for (const auto& [weight, note] : w.format_notes()) {
    if (named.count(weight) || reg.format(note.format).dense) continue;
    if (note.why.starts_with(kOutside))
      out.push_back({weight, "dense", note.why, "matmul of the dequantized weight, in the model's prologue", true, note.format});
    else
      out.push_back({weight, note.format, note.why + "; no linear of the run reads it", "none", true, note.format});
  }
  return out;
}

std::string outside_summary(const std::vector<FormatLine>& lines) {
  std::vector<const FormatLine*> dequantized;
  std::set<std::string> stored;
  for (const auto& l : lines)
    if (l.outside && l.format == "dense") {
      dequantized.push_back(&l);
      stored.insert(l.stored);
    }
  const size_t n = dequantized.size();
  if (n == 0) return {};
  std::string formats;
  for (const auto& f : stored) formats += (formats.empty() ? "" : ", ") + f;
  return std::to_string(n) + " linear" + (n == 1 ? "" : "s") + " outside the planned formats dequantized at load (stored " +
         formats + "; e.g. " + dequantized.front()->weight + ")\n";
}

std::string formats_text(const std::vector<FormatLine>& lines) {
  std::string out = "weight formats (per linear):\n";
  for (const auto& l : lines) out += "  " + l.weight + ": " + l.format + " (" + l.why + "); GEMM: " + l.gemm + "\n";
  return out;
}

nlohmann::json formats_json(const std::vector<FormatLine>& lines) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& l : lines) {
    a.push_back({{"weight", l.weight}, {"format", l.format}, {"why", l.why}, {"gemm", l.gemm}});
    if (l.outside) a.back().update({{"outside_planned_formats", true}, {"stored", l.stored}});
  }
  return a;
}

}  // namespace sp::models
