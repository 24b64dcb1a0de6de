#include "models/convert.hpp"

#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>

#include "exec/formats/quantized.hpp"
#include "models/checkpoint.hpp"
#include "models/tensor_io.hpp"
#include "recognize/recognize.hpp"

namespace sp::models {

namespace {

constexpr const char* kComfyPrefix = "model.diffusion_model.";

bool has_block_index(const std::string& name) {
  size_t start = 0;
  while (start <= name.size()) {
    const size_t end = std::min(name.find('.', start), name.size());
    // An index under a "...blocks" / "...layers" component (not e.g. a Sequential's "text_embedding.0").
    const std::string before = name.substr(0, start == 0 ? 0 : start - 1);
    const bool container = before.size() >= 6 && (before.compare(before.size() - 6, 6, "blocks") == 0 ||
                                                  before.compare(before.size() - 6, 6, "layers") == 0);
    if (end > start && container &&
        std::all_of(name.begin() + long(start), name.begin() + long(end),
                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      return true;
    start = end + 1;
  }
  return false;
}

bool convertible(const std::string& name, const at::Tensor& t, const std::string& format) {
  const auto d = t.scalar_type();
  const bool floating = d == at::kFloat || d == at::kBFloat16 || d == at::kHalf;
  const bool weight = name.size() > 7 && name.ends_with(".weight");
  if (!floating || !weight || t.dim() != 2 || !has_block_index(name)) return false;
  return format != "convrot-int8" || t.size(1) % 256 == 0;
}

}  // namespace

ConvertReport convert_checkpoint(const std::string& in, const std::string& out, const std::string& format,
                                 const contracts::Registry& reg) {
  const auto& caps = reg.format(format);  // throws for an unknown name
  const std::string json = recognize::comfy_quant_json(format);
  const auto file = io::SafetensorsFile::open(in);
  const auto rec = recognize::recognize(file, sidecar_of(file));  // refuses what it cannot read
  if (!rec.quant.empty())
    throw std::invalid_argument(in + " already holds quantized weights (e.g. '" + rec.quant.begin()->first +
                                "', " + rec.quant.begin()->second.origin + "); convert reads 16/32-bit checkpoints");
  ConvertReport report;
  report.layout = rec.layout;
  // ComfyUI reads the original layout, with no prefix or the one it strips itself.
  const std::string prefix = rec.prefix == kComfyPrefix ? rec.prefix : "";
  const auto stored = file.names();
  std::set<std::string> unread(stored.begin(), stored.end());
  for (const auto& [canonical, src] : rec.tensors)
    for (const auto& n : src.tensors) unread.erase(n);
  if (!unread.empty())  // recognition explains every tensor; nothing may be dropped silently
    throw std::logic_error("convert: tensor '" + *unread.begin() + "' of " + in + " maps onto no tensor of the " +
                           rec.config.family + " original layout");
  TensorMap tensors;
  exec::TensorWeights scratch(&reg);
  for (const auto& [canonical, src] : rec.tensors) {
    std::vector<at::Tensor> parts;
    for (const auto& n : src.tensors) parts.push_back(read_tensor(file, n));
    const at::Tensor t = assemble_stored(canonical, src, parts);
    const std::string name = prefix + canonical;
    if (!convertible(canonical, t, format)) {
      tensors[name] = t;
      if (t.dim() == 2) report.kept.push_back(name);
      continue;
    }
    ir::Linear l;
    l.weight = name;
    l.out_features = t.size(0);
    l.in_features = t.size(1);
    l.format = caps.name;
    scratch.store(l, t.to(at::kFloat), t.scalar_type());
    const std::string layer = name.substr(0, name.size() - std::string("weight").size());
    at::Tensor scale = scratch.tensor(exec::quant::scale_name(name));
    if (scale.numel() > 1) scale = scale.reshape({l.out_features, 1});  // ComfyUI's per-row int8 shape
    tensors[name] = scratch.tensor(name);
    tensors[layer + "weight_scale"] = scale.to(at::kFloat).contiguous();
    tensors[layer + "comfy_quant"] =
        at::from_blob(const_cast<char*>(json.data()), {int64_t(json.size())}, at::kByte).clone();
    report.converted.push_back(name);
  }
  write_tensors(out, tensors, file.metadata());
  return report;
}

}  // namespace sp::models
