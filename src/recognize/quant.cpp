#include "recognize/quant.hpp"

#include <nlohmann/json.hpp>

#include <set>

#include "recognize/table.hpp"

namespace sp::recognize {

namespace {

std::string stem(const std::string& s, const std::string& tail) { return s.substr(0, s.size() - tail.size()); }

std::string dtype_text(io::DType d) { return std::string(io::dtype_name(d)); }

// A stored weight and its declared dtype must agree with the scheme.
void expect_dtype(const io::TensorInfo& w, io::DType want, const std::string& scheme) {
  if (w.dtype != want)
    throw RecognizeError("tensor '" + w.name + "' is " + dtype_text(w.dtype) + " but its quantization (" + scheme +
                         ") stores " + dtype_text(want));
}

// A scale tensor: fp32/bf16/f16, one value or one per output row.
void expect_scale(const io::TensorInfo& s, const io::TensorInfo& w) {
  const bool floating = s.dtype == io::DType::F32 || s.dtype == io::DType::BF16 || s.dtype == io::DType::F16;
  const int64_t rows = w.shape.empty() ? 0 : w.shape[0];
  const bool per_row = (s.shape.size() == 1 && s.shape[0] == rows) ||
                       (s.shape.size() == 2 && s.shape[0] == rows && s.shape[1] == 1);
  if (!floating || !(s.numel() == 1 || per_row))
    throw RecognizeError("scale tensor '" + s.name + "' (" + dtype_text(s.dtype) + " " + detail::shape_string(s.shape) +
                         ") of weight '" + w.name + "' [" + std::to_string(rows) + ", " +
                         std::to_string(w.shape.size() > 1 ? w.shape[1] : 0) +
                         "]: expected a float scale with one value or one per output row");
}

QuantSpec from_comfy_quant(const std::string& layer, const std::string& json, const io::TensorInfo& w) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const std::exception& e) {
    throw RecognizeError("tensor '" + layer + "comfy_quant' does not hold a JSON object: " + e.what());
  }
  if (!j.is_object() || !j.contains("format") || !j["format"].is_string())
    throw RecognizeError("tensor '" + layer + "comfy_quant' names no \"format\": " + json);
  const std::string scheme = j["format"];
  const nlohmann::json params = j.contains("params") && j["params"].is_object() ? j["params"] : nlohmann::json::object();
  auto param = [&](const char* key) -> const nlohmann::json* {
    if (j.contains(key)) return &j[key];
    if (params.contains(key)) return &params[key];
    return nullptr;
  };
  QuantSpec q;
  if (scheme == "float8_e4m3fn" || scheme == "float8_e5m2") {
    const bool e4m3 = scheme == "float8_e4m3fn";
    expect_dtype(w, e4m3 ? io::DType::F8_E4M3 : io::DType::F8_E5M2, scheme);
    q.format = e4m3 ? "fp8-e4m3" : "fp8-e5m2";
    q.origin = "comfy_quant " + scheme;
  } else if (scheme == "int8_tensorwise") {
    expect_dtype(w, io::DType::I8, scheme);
    const auto* rot = param("convrot");
    if (rot && rot->is_boolean() && rot->get<bool>()) {
      const auto* g = param("convrot_groupsize");
      const int64_t group = g && g->is_number_integer() ? g->get<int64_t>() : 256;
      if (group != 256)
        throw RecognizeError("tensor '" + w.name + "': ConvRot group size " + std::to_string(group) +
                             " (from '" + layer + "comfy_quant') is not supported; convrot-int8 rotates groups of 256");
      q.format = "convrot-int8";
      q.origin = "comfy_quant int8_tensorwise (convrot 256)";
    } else {
      q.format = "int8";
      q.origin = "comfy_quant int8_tensorwise";
    }
  } else {
    throw RecognizeError("tensor '" + w.name + "': quantization format '" + scheme + "' (from '" + layer +
                         "comfy_quant') is not supported; supported: float8_e4m3fn, float8_e5m2, int8_tensorwise "
                         "(optionally convrot, groups of 256)");
  }
  return q;
}

}  // namespace

QuantScan scan_quant(const std::vector<io::TensorInfo>& tensors,
                     const std::function<std::string(const std::string&)>& json_of) {
  std::map<std::string, const io::TensorInfo*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t;
  auto find = [&](const std::string& n) -> const io::TensorInfo* {
    auto it = by_name.find(n);
    return it == by_name.end() ? nullptr : it->second;
  };
  QuantScan out;
  std::set<std::string> side;  // tensors taken out of structure recognition
  // The name of scale tensor `name` of weight `w` (checked, taken out), or "" if absent.
  auto scale = [&](const std::string& name, const io::TensorInfo& w) -> std::string {
    const io::TensorInfo* s = find(name);
    if (!s) return {};
    expect_scale(*s, w);
    side.insert(name);
    return name;
  };

  // The older convention: a "scaled_fp8" marker (at the root of the names' common prefix).
  const io::TensorInfo* marker = nullptr;
  for (const auto& t : tensors)
    if (t.name == "scaled_fp8" || t.name.ends_with(".scaled_fp8")) marker = &t;
  if (marker) {
    if (marker->dtype != io::DType::F8_E4M3 && marker->dtype != io::DType::F32)
      throw RecognizeError("tensor '" + marker->name + "' marks scaled fp8 weights of dtype " +
                           dtype_text(marker->dtype) + "; supported: F8_E4M3");
    side.insert(marker->name);
  }

  for (const auto& t : tensors) {
    if (t.name.ends_with(".comfy_quant")) {
      const std::string layer = stem(t.name, "comfy_quant");
      const io::TensorInfo* w = find(layer + "weight");
      if (!w) throw RecognizeError("tensor '" + t.name + "' has no weight '" + layer + "weight' beside it");
      if (t.dtype != io::DType::U8 || t.shape.size() != 1)
        throw RecognizeError("tensor '" + t.name + "' is " + dtype_text(t.dtype) +
                             " of rank " + std::to_string(t.shape.size()) + "; expected U8 bytes of JSON (rank 1)");
      QuantSpec q = from_comfy_quant(layer, json_of(t.name), *w);
      side.insert(t.name);
      q.weight_scale = scale(layer + "weight_scale", *w);
      if (q.weight_scale.empty() && q.format != "fp8-e4m3" && q.format != "fp8-e5m2")
        throw RecognizeError("weight '" + w->name + "' (" + q.origin + ") has no scale tensor '" + layer +
                             "weight_scale'");
      q.input_scale = scale(layer + "input_scale", *w);
      out.weights[w->name] = q;
    }
  }
  for (const auto& t : tensors) {
    if (out.weights.count(t.name) || t.shape.size() != 2 || !t.name.ends_with(".weight")) continue;
    const std::string layer = stem(t.name, "weight");
    if (t.dtype == io::DType::F8_E4M3) {
      // A bare float8 weight is a cast: its users compute with it cast to their dtype.
      QuantSpec q{"fp8-e4m3-cast", "stored float8_e4m3fn without scale (scale 1), cast", "", ""};
      if (marker)
        q = {"fp8-e4m3", "scaled_fp8 scale_weight", scale(layer + "scale_weight", t), scale(layer + "scale_input", t)};
      out.weights[t.name] = q;
    } else if (t.dtype == io::DType::F8_E5M2) {
      out.weights[t.name] = {"fp8-e5m2", "stored float8_e5m2 without scale (scale 1)", "", ""};
    } else if (t.dtype == io::DType::I8 || t.dtype == io::DType::U8) {
      throw RecognizeError("tensor '" + t.name + "' is stored as " + dtype_text(t.dtype) +
                           " with no quantization description ('" + layer + "comfy_quant'); cannot run it");
    }
  }
  for (const auto& t : tensors)
    if (!side.count(t.name)) out.structural.push_back(t);
  return out;
}

QuantScan scan_quant(const io::SafetensorsFile& file) {
  std::vector<io::TensorInfo> infos;
  for (const auto& n : file.names()) infos.push_back(file.info(n));
  return scan_quant(infos, [&](const std::string& name) {
    const auto b = file.bytes(name);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  });
}

std::string comfy_quant_json(const std::string& format) {
  nlohmann::json j;
  if (format == "fp8-e4m3") j["format"] = "float8_e4m3fn";
  else if (format == "fp8-e5m2") j["format"] = "float8_e5m2";
  else if (format == "int8") j["format"] = "int8_tensorwise";
  else if (format == "convrot-int8") {
    j["format"] = "int8_tensorwise";
    j["convrot"] = true;
    j["convrot_groupsize"] = 256;
  } else {
    throw RecognizeError("no ComfyUI convention for format '" + format + "'");
  }
  return j.dump();
}

}  // namespace sp::recognize
