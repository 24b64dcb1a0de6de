// streamplan convert writes ComfyUI's convention: the original layout ComfyUI's loader detects
// (from an original or a diffusers checkpoint), and beside each converted linear the tensors
// ComfyUI's mixed-precision Linear reads (comfy/ops.py): "comfy_quant" (uint8 bytes of a JSON
// object), "weight_scale" (fp32, [] for float8_e4m3fn, [out, 1] for int8_tensorwise) and the
// weight in the stored dtype, with the values of ComfyUI's own quantizers (comfy-kitchen's
// eager backend), written out here from that convention rather than taken from the project's
// formats.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <set>
#include <stdlib.h>
#include <unistd.h>

#include "exec/registry.hpp"
#include "models/checkpoint.hpp"
#include "models/convert.hpp"
#include "models/tensor_io.hpp"
#include "recognize/recognize.hpp"

namespace {

using namespace sp;

const std::vector<std::string> kFormats = {"fp8-e4m3", "int8", "convrot-int8"};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// ComfyUI's float8_e4m3fn weight: scale = amax / 448, q = clamp(w * (1 / scale)).
std::pair<at::Tensor, at::Tensor> comfy_fp8(const at::Tensor& w) {
  const at::Tensor s = w.abs().max().div(448.0);
  return {(w * s.reciprocal()).clamp(-448, 448).to(at::kFloat8_e4m3fn), s};
}

// ComfyUI's int8_tensorwise weight per output channel: scale = row amax / 127, q = round(w / scale).
std::pair<at::Tensor, at::Tensor> comfy_int8_rows(const at::Tensor& w) {
  const at::Tensor s = w.abs().amax(1, true).div(127.0).clamp_min(1e-30);
  return {w.div(s).round().clamp(-128, 127).to(at::kChar), s};
}

// ConvRot: input features rotated in groups of 256 by the normalized regular Hadamard matrix
// H = (H4 (x) H4 (x) H4 (x) H4) / 16, W' = W Hᵀ, then int8 per output channel.
std::pair<at::Tensor, at::Tensor> comfy_convrot(const at::Tensor& w) {
  const at::Tensor h4 = at::tensor({1.f, 1.f, 1.f, -1.f, 1.f, 1.f, -1.f, 1.f, 1.f, -1.f, 1.f, 1.f, -1.f, 1.f, 1.f, 1.f})
                            .view({4, 4});
  const at::Tensor h = at::kron(at::kron(h4, h4), at::kron(h4, h4)).div(16.0);
  const int64_t out = w.size(0), in = w.size(1);
  return comfy_int8_rows(at::matmul(w.reshape({out, in / 256, 256}), h.t()).reshape({out, in}));
}

nlohmann::json expected_json(const std::string& format) {
  if (format == "fp8-e4m3") return {{"format", "float8_e4m3fn"}};
  if (format == "int8") return {{"format", "int8_tensorwise"}};
  return {{"format", "int8_tensorwise"}, {"convrot", true}, {"convrot_groupsize", 256}};
}

// A block linear's weight: what convert quantizes (for convrot-int8, input widths of 256k only).
bool block_linear(const std::string& name, const at::Tensor& t, const std::string& format) {
  const bool block = name.find("blocks.") != std::string::npos;
  return block && ends_with(name, ".weight") && t.dim() == 2 && (format != "convrot-int8" || t.size(1) % 256 == 0);
}

struct TempDir {
  std::string path;
  std::vector<std::string> files;
  TempDir() {
    char tmpl[] = "/tmp/streamplan-convert-comfy-XXXXXX";  // (not std::filesystem: libtorch conflicts)
    path = ::mkdtemp(tmpl);
  }
  std::string file(const std::string& name) { return files.emplace_back(path + "/" + name); }
  ~TempDir() {
    for (const auto& f : files) std::remove(f.c_str());
    ::rmdir(path.c_str());
  }
};

// Widths of multiples of 256 so that ConvRot converts the blocks; fp32 so that the expected
// values are computed from the same numbers.
recognize::FamilyConfig config(const std::string& preset) {
  auto cfg = recognize::preset(preset, 1, true);
  cfg.heads = 256 / cfg.head_dim;
  cfg.dim = 256;
  cfg.ffn = cfg.family == "flux1" ? 4 * cfg.dim : 512;
  return cfg;
}

// Checks `out` against the original-layout tensors `ref` (names without prefix) quantized as
// ComfyUI quantizes them; names in `out` carry `prefix`.
void expect_comfy_file(const std::string& out, const models::TensorMap& ref, const std::string& format,
                       const std::string& prefix, const models::ConvertReport& rep) {
  const auto f = io::SafetensorsFile::open(out);
  const auto got = models::read_tensors(out);
  std::set<std::string> want_names;
  size_t converted = 0;
  for (const auto& [name, t] : ref) {
    SCOPED_TRACE(name);
    const std::string n = prefix + name;
    want_names.insert(n);
    ASSERT_TRUE(got.count(n)) << "missing " << n;
    if (!block_linear(name, t, format)) {
      EXPECT_TRUE(at::equal(got.at(n), t)) << n << " is not the original-layout tensor";  // kept exactly
      continue;
    }
    ++converted;
    const std::string layer = n.substr(0, n.size() - 6);
    want_names.insert({layer + "weight_scale", layer + "comfy_quant"});
    const auto& qi = f.info(layer + "comfy_quant");
    EXPECT_EQ(qi.dtype, io::DType::U8);
    ASSERT_EQ(qi.shape.size(), 1u);
    const auto bytes = f.bytes(layer + "comfy_quant");
    EXPECT_EQ(nlohmann::json::parse(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size())),
              expected_json(format));
    const auto& si = f.info(layer + "weight_scale");
    EXPECT_EQ(si.dtype, io::DType::F32);
    const auto [q, s] = format == "fp8-e4m3" ? comfy_fp8(t) : format == "int8" ? comfy_int8_rows(t) : comfy_convrot(t);
    EXPECT_EQ(si.shape, std::vector<int64_t>(s.sizes().begin(), s.sizes().end()));
    EXPECT_EQ(f.info(n).dtype, format == "fp8-e4m3" ? io::DType::F8_E4M3 : io::DType::I8);
    EXPECT_TRUE(at::equal(got.at(layer + "weight_scale"), s));
    const at::Tensor gq = got.at(n);
    ASSERT_EQ(gq.sizes(), q.sizes());
    const int64_t differ = format == "fp8-e4m3"
                               ? gq.view(at::kByte).ne(q.view(at::kByte)).sum().item<int64_t>()
                               : gq.ne(q).sum().item<int64_t>();
    EXPECT_EQ(differ, 0) << "of " << q.numel() << " stored values differ from ComfyUI's quantizer";
    EXPECT_FALSE(got.count(layer + "input_scale"));
  }
  std::set<std::string> names;
  for (const auto& [n, t] : got) names.insert(n);
  EXPECT_EQ(names, want_names);
  EXPECT_EQ(rep.converted.size(), converted);
  EXPECT_GT(converted, 0u);
}

TEST(ConvertComfy, WritesTheOriginalLayoutWithComfyQuantTensorsFromEitherLayout) {
  const auto reg = exec::builtin_registry();
  for (const std::string preset : {"wan2.1-1.3b", "flux1-dev"}) {
    SCOPED_TRACE(preset);
    TempDir dir;
    const auto cfg = config(preset);
    const std::string original = dir.file("original.safetensors");
    models::write_random_checkpoint(cfg, "original", original, 3, at::kFloat);
    const auto ref = models::read_tensors(original);
    const auto f0 = io::SafetensorsFile::open(original);
    const auto config0 = recognize::recognize(f0, models::sidecar_of(f0)).config;
    size_t converted_fp8 = 0;
    for (const std::string layout : {"original", "diffusers"}) {
      SCOPED_TRACE(layout);
      const std::string src = dir.file(layout + "_in.safetensors");
      models::write_random_checkpoint(cfg, layout, src, 3, at::kFloat);
      for (const auto& format : kFormats) {
        SCOPED_TRACE(format);
        const std::string out = dir.file(layout + "_" + format + ".safetensors");
        const models::Conversion c(src, {format}, reg);
        c.write(out);
        const models::ConvertReport& rep = c.report();
        EXPECT_EQ(rep.layout, layout);
        expect_comfy_file(out, ref, format, "", rep);
        const auto f = io::SafetensorsFile::open(out);
        const auto r = recognize::recognize(f, models::sidecar_of(f));
        EXPECT_EQ(r.layout, "original");
        EXPECT_EQ(r.config, config0);
        if (format == "fp8-e4m3") converted_fp8 = rep.converted.size();
      }
    }
    // Flux's fused projections (qkv, linear1) are single linears of the original layout.
    if (cfg.family == "flux1") EXPECT_EQ(converted_fp8, size_t(10 * cfg.layers + 3 * cfg.single_layers));
  }
}

TEST(ConvertComfy, KeepsComfyUIsPrefixAndDropsOthers) {
  const auto reg = exec::builtin_registry();
  TempDir dir;
  const auto cfg = config("wan2.1-1.3b");
  const std::string original = dir.file("original.safetensors");
  models::write_random_checkpoint(cfg, "original", original, 5, at::kFloat);
  const auto ref = models::read_tensors(original);
  const auto meta = io::SafetensorsFile::open(original).metadata();
  for (const std::string prefix : {"model.diffusion_model.", "diffusion_model."}) {
    SCOPED_TRACE(prefix);
    models::TensorMap prefixed;
    for (const auto& [n, t] : ref) prefixed[prefix + n] = t;
    const std::string src = dir.file("prefixed.safetensors"), out = dir.file("prefixed_int8.safetensors");
    models::write_tensors(src, prefixed, meta);
    const models::Conversion c(src, {"int8"}, reg);
    c.write(out);
    const models::ConvertReport& rep = c.report();
    expect_comfy_file(out, ref, "int8", prefix == "model.diffusion_model." ? prefix : "", rep);
  }
}

}  // namespace
