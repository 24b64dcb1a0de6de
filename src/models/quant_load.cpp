#include "models/quant_load.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

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

}  // namespace

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
  for (const auto* s : specs)
    if (!s->weight_scale.empty() && f.info(s->weight_scale).shape.size() > 0) {
      int64_t n = 1;
      for (int64_t d : f.info(s->weight_scale).shape) n *= d;
      per_row = per_row || n > 1;
    }
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
  if (s == "preserve") return Precision::Preserve;
  if (s == "fp8") return Precision::Fp8;
  if (s == "int8") return Precision::Int8;
  throw std::invalid_argument("--precision: '" + s + "' is not one of preserve, fp8, int8");
}

const char* to_string(Precision p) {
  switch (p) {
    case Precision::Preserve: return "preserve";
    case Precision::Fp8: return "fp8";
    case Precision::Int8: return "int8";
  }
  return "?";
}

void apply_precision(ir::Model& m, exec::TensorWeights& w, Precision p, const contracts::DeviceCaps& dev) {
  if (p == Precision::Fp8 && !(dev.kind == contracts::DeviceKind::CUDA && dev.cc_major * 10 + dev.cc_minor >= 89))
    throw std::invalid_argument("--precision fp8 needs fp8 tensor cores (CUDA sm_89 or newer); " + dev.name + " (" +
                                (dev.kind == contracts::DeviceKind::CUDA
                                     ? "sm_" + std::to_string(dev.cc_major) + std::to_string(dev.cc_minor)
                                     : std::string("CPU")) +
                                ") has none. Use --precision int8 or preserve");
  if (p != Precision::Preserve)
    convert_block_linears(m, w, p == Precision::Fp8 ? "fp8-e4m3" : "int8",
                          std::string("converted at load (--precision ") + to_string(p) + ")");
  else
    convert_block_linears(m, w, "", "");
}

void convert_block_linears(ir::Model& m, exec::TensorWeights& w, const std::string& target, const std::string& why) {
  // Embedding and final-layer linears stay as stored: only the blocks are converted.
  std::set<const ir::Linear*> outside;
  for (const auto& e : m.embeds) outside.insert(&e.linear);
  if (m.final_layer) {
    outside.insert(&m.final_layer->proj);
    for (const auto& [segment, l] : m.final_layer->heads) outside.insert(&l);
  }
  ir::for_each_linear(m, [&](ir::Linear& l) {
    auto it = w.format_notes().find(l.weight);
    if (it != w.format_notes().end()) {
      l.format = it->second.format;
      return;
    }
    if (target.empty() || outside.count(&l) || l.fp32_compute || l.stored) return;
    if (l.format != "dense") return;
    l.format = target;
    w.store(l, w.tensor(l.weight), exec::to_aten(m.dtype));
    w.note_format(l.weight, {target, why});
  });
}

std::vector<FormatLine> format_lines(const ir::Model& m, const exec::TensorWeights& w, const contracts::Registry& reg,
                                     const contracts::DeviceCaps& dev) {
  std::vector<FormatLine> out;
  ir::for_each_linear(const_cast<ir::Model&>(m), [&](ir::Linear& l) {
    const contracts::FormatCaps& f = reg.format(l.format);
    std::string gemm = "matmul of the stored weight";
    if (f.native_gemm && f.native_gemm(dev))
      gemm = f.gemm_kernel ? f.gemm_kernel(dev) : "the format's own GEMM";
    else if (!f.dense)
      gemm = "dequantized slice, then a matmul";
    auto it = w.format_notes().find(l.weight);
    if (it != w.format_notes().end() && it->second.format == l.format) {
      out.push_back({l.weight, l.format, it->second.why, gemm});
      return;
    }
    std::string why = l.format == "dense" ? "stored in higher precision; preserved (--precision preserve)"
                                          : "format set by the model";
    out.push_back({l.weight, l.format, why, gemm});
  });
  return out;
}

std::string formats_text(const std::vector<FormatLine>& lines) {
  std::string out = "weight formats (per linear):\n";
  for (const auto& l : lines) out += "  " + l.weight + ": " + l.format + " (" + l.why + "); GEMM: " + l.gemm + "\n";
  return out;
}

nlohmann::json formats_json(const std::vector<FormatLine>& lines) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& l : lines)
    a.push_back({{"weight", l.weight}, {"format", l.format}, {"why", l.why}, {"gemm", l.gemm}});
  return a;
}

}  // namespace sp::models
