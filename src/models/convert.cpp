#include "models/convert.hpp"

#include <algorithm>
#include <regex>
#include <set>
#include <stdexcept>

#include "exec/formats/quantized.hpp"
#include "models/checkpoint.hpp"
#include "models/tensor_io.hpp"

namespace sp::models {

namespace {

constexpr const char* kComfyPrefix = "model.diffusion_model.";

// An index under a "...blocks" / "...layers" component (not e.g. a Sequential's "text_embedding.0").
bool has_block_index(const std::string& name) {
  static const std::regex index(R"((blocks|layers)\.[0-9]+(\.|$))");
  return std::regex_search(name, index);
}

// Why a 2-D tensor is kept as stored; empty: it is converted.
std::string kept_reason(const std::string& canonical, const std::vector<int64_t>& shape, io::DType dtype,
                        const std::string& format, int64_t in_align) {
  const bool floating = dtype == io::DType::F32 || dtype == io::DType::BF16 || dtype == io::DType::F16;
  if (!floating || !canonical.ends_with(".weight") || canonical.size() <= 7) return "not a 16/32-bit linear weight";
  if (!has_block_index(canonical)) return "outside the blocks (embeddings, final layer)";
  if (shape[1] % in_align != 0)
    return "in_features " + std::to_string(shape[1]) + " is not a multiple of " + std::to_string(in_align) +
           ", the input group of " + format;
  return {};
}

// The stored dtype and finite range of the float8 types the plain layout casts to.
struct Fp8Type {
  at::ScalarType type;
  double max;
};
Fp8Type fp8_type(const std::string& format) {
  return format == "fp8-e5m2" ? Fp8Type{at::kFloat8_e5m2, 57344.0} : Fp8Type{at::kFloat8_e4m3fn, 448.0};
}

void check_combination(const ConvertOptions& o, const contracts::Registry& reg) {
  // The `--to` spelling of the format: "fp8" for "fp8-e4m3", else its name.
  const std::string to = "--to " + (o.format == "fp8-e4m3" ? "fp8" : o.format), layout = "--layout " + o.layout;
  const auto names = reg.format_names();
  const bool fp8 = o.format == "fp8-e4m3" || o.format == "fp8-e5m2";
  if (!fp8 && std::find(names.begin(), names.end(), o.format) == names.end())
    throw std::invalid_argument("convert: --to: '" + o.format + "' is not a weight format (fp8, fp8-e5m2, int8, convrot-int8)");
  if (o.layout == "scaled_fp8") {
    if (o.format != "fp8-e4m3")
      throw std::invalid_argument("convert: " + layout + " holds float8_e4m3fn weights only (--to fp8), not " + to);
  } else if (o.layout == "plain") {
    if (!fp8)
      throw std::invalid_argument("convert: " + layout + " casts to float8 only (--to fp8 or --to fp8-e5m2); " + to +
                                  " needs its scales (--layout comfy_quant)");
  } else if (o.layout == "comfy_quant") {
    bool known = std::find(names.begin(), names.end(), o.format) != names.end();
    try {
      recognize::comfy_quant_json(o.format);
    } catch (const recognize::RecognizeError&) {
      known = false;
    }
    if (!known)
      throw std::invalid_argument("convert: " + to + " with " + layout + " is not available (no format '" + o.format +
                                  "' with a comfy_quant convention here); use --layout plain");
  } else {
    throw std::invalid_argument("convert: --layout: '" + o.layout + "' is not one of comfy_quant, scaled_fp8, plain");
  }
  if (o.input_scale && o.layout != "scaled_fp8")
    throw std::invalid_argument("convert: --input-scale writes scaled_fp8's scale_input tensors; it needs --layout "
                                "scaled_fp8, not " + layout);
}

}  // namespace

Conversion::Conversion(const std::string& in, ConvertOptions options, const contracts::Registry& reg)
    : file_(io::SafetensorsFile::open(in)), rec_(recognize::recognize(file_, sidecar_of(file_))),
      options_(std::move(options)), reg_(&reg) {
  check_combination(options_, reg);
  if (!rec_.quant.empty())
    throw std::invalid_argument(in + " already holds quantized weights (e.g. '" + rec_.quant.begin()->first + "', " +
                                rec_.quant.begin()->second.origin + "); convert reads 16/32-bit checkpoints");
  report_.layout = rec_.layout;
  // ComfyUI reads the original layout, with no prefix or the one it strips itself.
  const std::string prefix = rec_.prefix == kComfyPrefix ? rec_.prefix : "";
  const auto stored = file_.names();
  std::set<std::string> unread(stored.begin(), stored.end());
  for (const auto& [canonical, src] : rec_.tensors)
    for (const auto& n : src.tensors) unread.erase(n);
  if (!unread.empty())  // recognition explains every tensor; nothing may be dropped silently
    throw std::logic_error("convert: tensor '" + *unread.begin() + "' of " + in + " maps onto no tensor of the " +
                           rec_.config.family + " original layout");
  const int64_t in_align = options_.layout != "plain" ? reg.format(options_.format).in_align : 1;
  at::ScalarType storage = fp8_type(options_.format).type;
  if (options_.layout == "comfy_quant") {
    json_ = recognize::comfy_quant_json(options_.format);
    storage = exec::to_aten(reg.format(options_.format).storage);
  }
  if (options_.layout == "scaled_fp8") marker_ = prefix + "scaled_fp8";
  for (const auto& [canonical, src] : rec_.tensors) {
    const io::TensorInfo& first = file_.info(src.tensors.front());
    std::vector<int64_t> shape = first.shape;
    if (src.op == recognize::Source::Op::Concat0)
      for (size_t i = 1; i < src.tensors.size(); ++i) shape[0] += file_.info(src.tensors[i]).shape.at(0);
    const std::string why = shape.size() == 2 ? kept_reason(canonical, shape, first.dtype, options_.format, in_align) : "-";
    Item it{canonical, prefix + canonical, why.empty(), {}};
    if (!it.convert) {
      it.outputs.push_back({it.name, first.dtype, shape});
      if (shape.size() == 2) {
        report_.kept.push_back(it.name);
        auto g = std::find_if(report_.kept_groups.begin(), report_.kept_groups.end(),
                              [&](const KeptGroup& k) { return k.reason == why; });
        if (g == report_.kept_groups.end()) g = report_.kept_groups.insert(g, KeptGroup{why, {}});
        g->names.push_back(it.name);
      }
      items_.push_back(std::move(it));
      continue;
    }
    const std::string layer = it.name.substr(0, it.name.size() - std::string("weight").size());
    it.outputs.push_back({it.name, to_io(storage, it.name), shape});
    if (options_.layout == "comfy_quant") {
      const bool rows = storage == at::kChar;  // int8_tensorwise: a scale per output row
      it.outputs.push_back({layer + "weight_scale", io::DType::F32, rows ? std::vector<int64_t>{shape[0], 1} : std::vector<int64_t>{}});
      it.outputs.push_back({layer + "comfy_quant", io::DType::U8, {int64_t(json_.size())}});
    } else if (options_.layout == "scaled_fp8") {
      it.outputs.push_back({layer + "scale_weight", io::DType::F32, {}});
      if (options_.input_scale) it.outputs.push_back({layer + "scale_input", io::DType::F32, {}});
    }
    report_.converted.push_back(it.name);
    items_.push_back(std::move(it));
  }
  if (report_.converted.empty()) {
    std::string why;
    for (const auto& g : report_.kept_groups)
      why += "; " + std::to_string(g.names.size()) + " kept: " + g.reason + " (e.g. '" + g.names.front() + "')";
    throw std::invalid_argument("convert: nothing in " + in + " would be converted to " + options_.format +
                                (why.empty() ? std::string(": it has no 2-D tensors") : why));
  }
  io::SafetensorsStreamWriter sizer;
  declare(sizer);
  report_.file_bytes = sizer.file_bytes();
}

void Conversion::declare(io::SafetensorsStreamWriter& w) const {
  for (const auto& [k, v] : file_.metadata()) w.set_metadata(k, v);
  if (!marker_.empty()) w.declare(marker_, io::DType::F8_E4M3, {0});
  for (const auto& it : items_)
    for (const auto& o : it.outputs) w.declare(o.name, o.dtype, o.shape);
}

void Conversion::write(const std::string& out) const {
  io::SafetensorsStreamWriter w;
  declare(w);
  w.open(out);
  auto put = [&](const Output& o, const at::Tensor& t) {
    const at::Tensor c = t.contiguous();
    if (to_io(c.scalar_type(), o.name) != o.dtype || c.sizes().vec() != o.shape)
      throw std::logic_error("convert: tensor '" + o.name + "' came out as " + std::string(c10::toString(c.scalar_type())) +
                             " of another shape than declared");
    w.write(std::span<const std::byte>(static_cast<const std::byte*>(c.data_ptr()), c.nbytes()));
  };
  if (!marker_.empty()) put({marker_, io::DType::F8_E4M3, {0}}, at::empty({0}, at::kFloat8_e4m3fn));
  exec::TensorWeights scratch(reg_);
  for (const auto& it : items_) {
    const recognize::Source& src = rec_.tensors.at(it.canonical);
    std::vector<at::Tensor> parts;
    for (const auto& n : src.tensors) parts.push_back(read_tensor(file_, n));
    const at::Tensor t = assemble_stored(it.canonical, src, parts);
    parts.clear();
    if (!it.convert) {
      put(it.outputs[0], t);
      continue;
    }
    if (options_.layout == "plain") {
      const Fp8Type f = fp8_type(options_.format);
      put(it.outputs[0], t.to(at::kFloat).clamp(-f.max, f.max).to(f.type));
      continue;
    }
    ir::Linear l;
    l.weight = it.name;
    l.out_features = t.size(0);
    l.in_features = t.size(1);
    l.format = options_.format;
    scratch.store(l, t.to(at::kFloat), t.scalar_type());
    const at::Tensor q = scratch.take(l.weight), scale = scratch.take(exec::quant::scale_name(l.weight));
    scratch.take(exec::quant::input_scale_name(l.weight));
    put(it.outputs[0], q);
    put(it.outputs[1], scale.to(at::kFloat).reshape(it.outputs[1].shape));
    if (options_.layout == "comfy_quant")
      put(it.outputs[2], at::from_blob(const_cast<char*>(json_.data()), {int64_t(json_.size())}, at::kByte));
    else if (options_.input_scale) put(it.outputs[2], at::ones({}, at::kFloat));
  }
  w.commit();
}

}  // namespace sp::models
