// Quantized weight formats (fp8-e4m3, int8, convrot-int8): each against its dequantized
// reference, planned vs naive with quantized blocks, recognition of ComfyUI's conventions,
// bad input, and the convert round trip.
#include <gtest/gtest.h>

#include <cstdio>
#include <stdlib.h>
#include <unistd.h>

#include "exec/consumers/consumer.hpp"
#include "exec/formats/quantized.hpp"
#include "exec/registry.hpp"
#include "models/builder.hpp"
#include "models/checkpoint.hpp"
#include "models/convert.hpp"
#include "models/families.hpp"
#include "models/quant_load.hpp"
#include "models/tensor_io.hpp"
#include "plan/plan.hpp"
#include "recognize/quant.hpp"
#include "test_util.hpp"

namespace {

using namespace sp;

const std::vector<std::string> kFormats = {"fp8-e4m3", "int8", "convrot-int8"};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

ir::Linear linear(const std::string& format, int64_t out, int64_t in) {
  ir::Linear l;
  l.weight = "l.weight";
  l.out_features = out;
  l.in_features = in;
  l.format = format;
  return l;
}

// The registry with every format's own GEMM switched on for the CPU too (ATen's CPU
// _int_mm / _scaled_mm), so the native path is tested without a GPU.
contracts::Registry native_everywhere() {
  const auto reg = exec::builtin_registry();
  contracts::Registry r;
  for (const auto& n : reg.consumer_names()) r.add(reg.consumer(n));
  for (const auto& n : reg.patch_names()) r.add(reg.patch(n));
  for (const auto& n : reg.format_names()) {
    contracts::FormatCaps f = reg.format(n);
    if (f.native_gemm) f.native_gemm = [](const contracts::DeviceCaps&) { return true; };
    r.add(f);
  }
  return r;
}

TEST(Formats, NativeGemmWithinDeclaredToleranceOfDequantizedReference) {
  const auto reg = exec::builtin_registry();
  at::manual_seed(3);
  for (const auto& name : kFormats) {
    SCOPED_TRACE(name);
    const auto& caps = reg.format(name);
    const ir::Linear l = linear(name, 96, 512);
    exec::TensorWeights w(&reg);
    const at::Tensor dense = at::randn({96, 512}) / 20;
    w.store(l, dense, at::kFloat);
    const at::Tensor deq = w.acquire(l, {}, {}, at::kFloat);
    // The stored weight itself: close to the float weight it came from.
    EXPECT_LT(test::rel_l2(deq, dense), name == "fp8-e4m3" ? 0.06 : 0.02);
    const at::Tensor x = at::randn({37, 512}), bias = at::randn({96});
    const at::Tensor ref = at::matmul(x, deq.t()) + bias;
    at::Tensor y = at::empty({37, 96});
    exec::impl_of<exec::FormatImpl>(caps).gemm(w, l, {}, {}, w.tensor(l.weight), x, y, bias, false);
    const double err = test::rel_l2(y, ref);
    EXPECT_LT(err, caps.tolerance) << "native vs dequantized";
    EXPECT_GT(err, 0.0) << "activations were not quantized";
    // Accumulating into an fp32 slab adds the same product.
    at::Tensor acc = at::ones({37, 96});
    exec::impl_of<exec::FormatImpl>(caps).gemm(w, l, {}, {}, w.tensor(l.weight), x, acc, {}, true);
    EXPECT_LT(test::rel_l2(acc, at::matmul(x, deq.t()) + 1), caps.tolerance);
  }
}

TEST(Formats, SlicesOfDequantizedWeightEqualSlicesOfTheWhole) {
  const auto reg = exec::builtin_registry();
  for (const auto& name : kFormats) {
    SCOPED_TRACE(name);
    const ir::Linear l = linear(name, 40, 768);
    exec::TensorWeights w(&reg);
    w.store(l, at::randn({40, 768}), at::kFloat);
    const at::Tensor whole = w.acquire(l, {}, {}, at::kFloat);
    const at::Tensor part = w.acquire(l, {3, 10, 2}, {256, 512}, at::kFloat);
    EXPECT_LT(test::rel_l2(part, whole.slice(0, 3, 22, 2).slice(1, 256, 768)), 1e-6);
  }
  // ConvRot slices only whole rotation groups, and says so.
  const ir::Linear l = linear("convrot-int8", 40, 768);
  exec::TensorWeights w(&reg);
  w.store(l, at::randn({40, 768}), at::kFloat);
  const std::string e = error_of([&] { w.acquire(l, {}, {100, 256}, at::kFloat); });
  EXPECT_NE(e.find("'l.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("whole rotation groups of 256"), std::string::npos) << e;
  EXPECT_EQ(reg.format("convrot-int8").in_align, 256);
}

TEST(Formats, HadamardIsOrthogonalAndRotationInvertsStorage) {
  const at::Tensor h = exec::quant::hadamard(256, at::kDouble, at::kCPU);
  EXPECT_TRUE(at::allclose(at::matmul(h, h.t()), at::eye(256, at::kDouble), 0, 1e-12));
  EXPECT_TRUE(at::allclose(h, h.t()));
  const at::Tensor x = at::randn({5, 512}, at::kDouble);
  EXPECT_TRUE(at::allclose(exec::quant::rotate(exec::quant::rotate(x, 256), 256), x, 0, 1e-12));
  EXPECT_NE(error_of([] { exec::quant::hadamard(128, at::kFloat, at::kCPU); }).find("not a power of 4"), std::string::npos);
}

TEST(Formats, WrongScaleShapeIsNamed) {
  const auto reg = exec::builtin_registry();
  const ir::Linear l = linear("int8", 8, 256);
  exec::TensorWeights w(&reg);
  w.add("l.weight", at::zeros({8, 256}, at::kChar));
  w.add("l.weight.scale", at::ones({3}));
  const std::string e = error_of([&] { w.acquire(l, {}, {}, at::kFloat); });
  EXPECT_NE(e.find("scale 'l.weight.scale' has shape [3]"), std::string::npos) << e;
  EXPECT_NE(e.find("[8, 256]"), std::string::npos) << e;
}

models::ModelConfig quant_config(const std::string& format) {
  auto cfg = models::demo_config();
  cfg.format = format;
  cfg.dim = 256;
  cfg.heads = 4;
  cfg.kv_heads = 4;
  cfg.head_dim = 64;
  cfg.hidden = 512;
  cfg.layers = 2;
  models::set_total_tokens(cfg, 301);
  return cfg;
}

TEST(Formats, PlannedMatchesNaiveWithQuantizedBlocks) {
  const auto reg = exec::builtin_registry();
  const auto dev = exec::describe_device(at::kCPU);
  for (const auto& name : kFormats) {
    SCOPED_TRACE(name);
    const auto inst = models::instantiate(quant_config(name), reg, at::kCPU);
    const at::Tensor naive = exec::run_naive(inst.model, *inst.weights, inst.inputs, reg);
    for (int64_t chunk : {37, 128}) {
      const auto p = plan::make_plan(inst.model, reg, dev, {chunk, 256});
      const at::Tensor planned = exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev);
      EXPECT_LT(test::rel_l2(planned, naive), 1e-5) << "chunk " << chunk;
    }
    // The formats' own GEMMs (forced on the CPU) against the dequantized naive run.
    const auto native = native_everywhere();
    const auto p = plan::make_plan(inst.model, native, dev, {37, 256});
    const at::Tensor planned = exec::run_planned(inst.model, p, *inst.weights, inst.inputs, native, dev);
    const double err = test::rel_l2(planned, naive);
    EXPECT_LT(err, 2 * reg.format(name).tolerance) << "native";
    EXPECT_GT(err, 0.0) << "native path did not run";
  }
}

// --- recognition of ComfyUI's conventions -------------------------------------------------

io::TensorInfo info(const std::string& n, io::DType d, std::vector<int64_t> shape) { return {n, d, std::move(shape)}; }

TEST(QuantRecognition, ComfyQuantFormatsAndScaledFp8) {
  std::map<std::string, std::string> json = {
      {"a.comfy_quant", R"({"format": "float8_e4m3fn"})"},
      {"b.comfy_quant", R"({"format": "int8_tensorwise"})"},
      {"c.comfy_quant", R"({"format": "int8_tensorwise", "params": {"convrot": true, "convrot_groupsize": 256}})"}};
  const std::vector<io::TensorInfo> t = {
      info("a.weight", io::DType::F8_E4M3, {64, 256}), info("a.weight_scale", io::DType::F32, {}),
      info("a.input_scale", io::DType::F32, {}),       info("a.comfy_quant", io::DType::U8, {28}),
      info("b.weight", io::DType::I8, {64, 256}),      info("b.weight_scale", io::DType::F32, {64, 1}),
      info("b.comfy_quant", io::DType::U8, {29}),      info("c.weight", io::DType::I8, {64, 256}),
      info("c.weight_scale", io::DType::F32, {64, 1}), info("c.comfy_quant", io::DType::U8, {80}),
      info("d.weight", io::DType::BF16, {64, 256})};
  const auto q = recognize::scan_quant(t, [&](const std::string& n) { return json.at(n); });
  ASSERT_EQ(q.weights.size(), 3u);
  EXPECT_EQ(q.weights.at("a.weight").format, "fp8-e4m3");
  EXPECT_EQ(q.weights.at("a.weight").input_scale, "a.input_scale");
  EXPECT_EQ(q.weights.at("b.weight").format, "int8");
  EXPECT_EQ(q.weights.at("c.weight").format, "convrot-int8");
  EXPECT_EQ(q.structural.size(), 4u);  // the weights; side tensors taken out

  const std::vector<io::TensorInfo> old = {info("scaled_fp8", io::DType::F8_E4M3, {2}),
                                           info("x.weight", io::DType::F8_E4M3, {32, 64}),
                                           info("x.scale_weight", io::DType::F32, {1}),
                                           info("x.scale_input", io::DType::F32, {1})};
  const auto o = recognize::scan_quant(old, {});
  EXPECT_EQ(o.weights.at("x.weight").format, "fp8-e4m3");
  EXPECT_EQ(o.weights.at("x.weight").weight_scale, "x.scale_weight");
  EXPECT_EQ(o.weights.at("x.weight").origin, "scaled_fp8 scale_weight");
  EXPECT_EQ(o.structural.size(), 1u);
}

TEST(QuantRecognition, UnsupportedOrInconsistentInputIsNamed) {
  auto scan = [](std::vector<io::TensorInfo> t, std::string json) {
    return error_of([&] { recognize::scan_quant(t, [&](const std::string&) { return json; }); });
  };
  std::string e = scan({info("n.weight", io::DType::U8, {64, 128}), info("n.weight_scale", io::DType::F8_E4M3, {64, 16}),
                        info("n.comfy_quant", io::DType::U8, {18})},
                       R"({"format": "nvfp4"})");
  EXPECT_NE(e.find("tensor 'n.weight': quantization format 'nvfp4'"), std::string::npos) << e;
  e = scan({info("b.weight", io::DType::I8, {64, 256}), info("b.weight_scale", io::DType::F32, {3}),
            info("b.comfy_quant", io::DType::U8, {29})},
           R"({"format": "int8_tensorwise"})");
  EXPECT_NE(e.find("scale tensor 'b.weight_scale' (F32 [3]) of weight 'b.weight' [64, 256]"), std::string::npos) << e;
  e = scan({info("b.weight", io::DType::BF16, {64, 256}), info("b.weight_scale", io::DType::F32, {}),
            info("b.comfy_quant", io::DType::U8, {29})},
           R"({"format": "int8_tensorwise"})");
  EXPECT_NE(e.find("tensor 'b.weight' is BF16 but its quantization (int8_tensorwise) stores I8"), std::string::npos) << e;
  e = scan({info("b.weight", io::DType::I8, {64, 256}), info("b.comfy_quant", io::DType::U8, {29})},
           R"({"format": "int8_tensorwise"})");
  EXPECT_NE(e.find("has no scale tensor 'b.weight_scale'"), std::string::npos) << e;
  e = scan({info("r.weight", io::DType::I8, {64, 256})}, "");
  EXPECT_NE(e.find("tensor 'r.weight' is stored as I8 with no quantization description"), std::string::npos) << e;
  e = scan({info("c.weight", io::DType::I8, {64, 256}), info("c.weight_scale", io::DType::F32, {64, 1}),
            info("c.comfy_quant", io::DType::U8, {29})},
           R"({"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 64})");
  EXPECT_NE(e.find("ConvRot group size 64"), std::string::npos) << e;
}

// --- convert round trip ---------------------------------------------------------------------

TEST(QuantConvert, RoundTripThroughComfyConventionRunsCloseToTheOriginal) {
  const auto reg = exec::builtin_registry();
  // (mkdtemp rather than std::filesystem, of which libtorch exports conflicting definitions.)
  char tmpl[] = "/tmp/streamplan-convert-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  std::vector<std::string> written;
  const std::string src = dir + "/wan.safetensors";
  written.push_back(src);
  auto cfg = recognize::preset("wan2.1-1.3b", 2, true);
  // Widths of multiples of 256, so that ConvRot's groups of 256 input features convert the blocks.
  cfg.heads = 16;
  cfg.dim = cfg.heads * cfg.head_dim;
  cfg.ffn = 512;
  ASSERT_EQ(cfg.dim % 256, 0);
  models::write_random_checkpoint(cfg, "original", src, 0, at::kFloat);
  const auto f0 = io::SafetensorsFile::open(src);
  const auto r0 = recognize::recognize(f0, models::sidecar_of(f0));
  const auto w0 = models::load_canonical(f0, r0, at::kFloat, at::kCPU, reg);
  const auto raw = models::random_raw_inputs(r0.config, {.tokens = 100}, 1);
  auto fr0 = models::prepare(r0.config, *w0, raw, ir::DType::F32, "sdpa");
  const at::Tensor ref = exec::run_naive(fr0.model, *w0, fr0.inputs, reg);
  for (const auto& name : kFormats) {
    SCOPED_TRACE(name);
    const std::string out = dir + "/" + name + ".safetensors";
    written.insert(written.end(), {out, out + ".2"});
    const auto rep = models::convert_checkpoint(src, out, name, reg);
    EXPECT_FALSE(rep.converted.empty());
    const auto f = io::SafetensorsFile::open(out);
    const auto r = recognize::recognize(f, models::sidecar_of(f));
    EXPECT_EQ(r.config, r0.config);
    EXPECT_EQ(r.quant.size(), rep.converted.size());
    for (const auto& [n, q] : r.quant) EXPECT_EQ(q.format, name) << n;
    const auto w = models::load_canonical(f, r, at::kFloat, at::kCPU, reg);
    auto fr = models::prepare(r.config, *w, raw, ir::DType::F32, "sdpa");
    models::apply_precision(fr.model, *w, models::Precision::Preserve, exec::describe_device(at::kCPU));
    int quantized = 0;
    ir::for_each_linear(fr.model, [&](ir::Linear& l) { quantized += l.format == name; });
    EXPECT_EQ(size_t(quantized), rep.converted.size());
    const at::Tensor got = exec::run_naive(fr.model, *w, fr.inputs, reg);
    EXPECT_LT(test::rel_l2(got, ref), 0.05);
    EXPECT_GT(test::rel_l2(got, ref), 0.0);
    // A converted file is not converted again.
    EXPECT_NE(error_of([&] { models::convert_checkpoint(out, out + ".2", name, reg); }).find("already holds quantized"),
              std::string::npos);
  }
  for (const auto& f : written) std::remove(f.c_str());
  ::rmdir(dir.c_str());
}

TEST(QuantPrecision, Fp8NeedsFp8TensorCoresAndInt8ConvertsBlocks) {
  const auto reg = exec::builtin_registry();
  auto inst = models::instantiate(quant_config("dense"), reg, at::kCPU);
  const auto cpu = exec::describe_device(at::kCPU);
  ir::Model m = inst.model;
  exec::TensorWeights& w = *inst.weights;
  const std::string e = error_of([&] { models::apply_precision(m, w, models::Precision::Fp8, cpu); });
  EXPECT_NE(e.find("--precision fp8 needs fp8 tensor cores"), std::string::npos) << e;
  const at::Tensor dense = exec::run_naive(inst.model, w, inst.inputs, reg);
  models::apply_precision(m, w, models::Precision::Int8, cpu);
  int converted = 0, kept = 0;
  for (const auto& line : models::format_lines(m, w)) {
    if (line.format == "int8") {
      ++converted;
      EXPECT_NE(line.why.find("--precision int8"), std::string::npos);
    } else {
      ++kept;
      EXPECT_EQ(line.format, "dense");
    }
  }
  EXPECT_GT(converted, 0);
  EXPECT_GT(kept, 0);  // embedding and final projection stay as stored
  EXPECT_LT(test::rel_l2(exec::run_naive(m, w, inst.inputs, reg), dense), 0.05);
}

}  // namespace

// --- CUDA: the formats' own GEMMs and the rotation kernel ------------------------------------

namespace gpu_formats {

using namespace sp;

TEST(Gpu, QuantizedNativeGemmWithinToleranceOfDequantized) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device("cuda");
  const auto dev = exec::describe_device(d);
  at::manual_seed(5);
  for (const auto& name : kFormats) {
    const auto& caps = reg.format(name);
    if (!caps.native_gemm(dev)) {
      std::cout << name << ": no native GEMM on " << dev.name << "\n";
      continue;
    }
    for (int64_t n : {1000, 4097}) {
      SCOPED_TRACE(name + " rows " + std::to_string(n));
      const ir::Linear l = linear(name, 1536, 5120);
      exec::TensorWeights w(&reg);
      w.store(l, (at::randn({1536, 5120}) / 70).to(d), at::kBFloat16);
      const at::Tensor deq = w.acquire(l, {}, {}, at::kFloat);
      const at::Tensor x = at::randn({n, 5120}, at::TensorOptions().device(d)).to(at::kBFloat16);
      const at::Tensor ref = at::matmul(x.to(at::kFloat), deq.t());
      at::Tensor y = at::empty({n, 1536}, x.options());
      exec::impl_of<exec::FormatImpl>(caps).gemm(w, l, {}, {}, w.tensor(l.weight), x, y, {}, false);
      const double err = test::rel_l2(y.cpu(), ref.cpu());
      std::cout << name << " rows " << n << ": native vs dequantized rel_l2 " << err << "\n";
      EXPECT_LT(err, caps.tolerance);
    }
  }
}

TEST(Gpu, RotateQuantizeKernelMatchesReference) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device("cuda");
  // The convrot GEMM on CUDA (kernel) against the same GEMM on the CPU (rotation by matmul).
  const ir::Linear l = linear("convrot-int8", 512, 1280);
  exec::TensorWeights wc(&reg), wg(&reg);
  const at::Tensor dense = at::randn({512, 1280}) / 30;
  wc.store(l, dense, at::kFloat);
  wg.store(l, dense.to(d), at::kFloat);
  const at::Tensor x = at::randn({333, 1280});
  at::Tensor yc = at::empty({333, 512}), yg = at::empty({333, 512}, at::TensorOptions().device(d));
  const auto& impl = exec::impl_of<exec::FormatImpl>(reg.format("convrot-int8"));
  impl.gemm(wc, l, {}, {}, wc.tensor(l.weight), x, yc, {}, false);
  impl.gemm(wg, l, {}, {}, wg.tensor(l.weight), x.to(d), yg, {}, false);
  EXPECT_LT(test::rel_l2(yg.cpu(), yc), 2e-3);
}

TEST(Gpu, PlannedNativeFormatsWithinToleranceOfNaive) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device("cuda");
  const auto dev = exec::describe_device(d);
  for (const auto& name : kFormats) {
    if (!reg.format(name).native_gemm(dev)) continue;
    SCOPED_TRACE(name);
    auto cfg = quant_config(name);
    cfg.dtype = ir::DType::BF16;
    cfg.dim = 1536;
    cfg.heads = 12;
    cfg.kv_heads = 12;
    cfg.hidden = 4096;
    models::set_total_tokens(cfg, 4099);
    const auto inst = models::instantiate(cfg, reg, d);
    const at::Tensor naive = exec::run_naive(inst.model, *inst.weights, inst.inputs, reg).cpu();
    const auto p = plan::make_plan(inst.model, reg, dev, {512, 0});
    const at::Tensor planned = exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev).cpu();
    const double err = test::rel_l2(planned, naive);
    std::cout << name << ": planned (native GEMM) vs naive (dequantized) rel_l2 " << err << "\n";
    EXPECT_LT(err, 2 * reg.format(name).tolerance);
  }
}

}  // namespace gpu_formats
