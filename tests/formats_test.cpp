// Quantized weight formats (fp8-e4m3, int8, convrot-int8) on the CPU: each against its
// dequantized reference, the 8-bit GEMMs' workspace and kernel by device, planned vs naive with
// quantized blocks, recognition of ComfyUI's conventions, bad input, and the convert round trip.
// The CUDA kernels are tested in formats_gpu_test.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <cstdio>
#include <tuple>
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
#include "formats_common.hpp"
#include "test_util.hpp"

namespace {

using namespace sp;
using namespace sp::formats_test;

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
  const std::string e = test::error_of([&] { w.acquire(l, {}, {100, 256}, at::kFloat); });
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
  EXPECT_NE(test::error_of([] { exec::quant::hadamard(128, at::kFloat, at::kCPU); }).find("not a power of 4"), std::string::npos);
}

TEST(Formats, WrongScaleShapeIsNamed) {
  const auto reg = exec::builtin_registry();
  const ir::Linear l = linear("int8", 8, 256);
  exec::TensorWeights w(&reg);
  w.add("l.weight", at::zeros({8, 256}, at::kChar));
  w.add("l.weight.scale", at::ones({3}));
  const std::string e = test::error_of([&] { w.acquire(l, {}, {}, at::kFloat); });
  EXPECT_NE(e.find("scale 'l.weight.scale' has shape [3]"), std::string::npos) << e;
  EXPECT_NE(e.find("[8, 256]"), std::string::npos) << e;
}

// --- the 8-bit GEMMs: semantics of int8_gemm, workspace and kernel of int8 and fp8 by device ---

// int8-rowwise scales its converted slice in place by fp32 row scales; where the device's kernels
// cast that through an fp32 copy (DeviceCaps::mixed_multiply_bytes_per_element, measured), the
// acquire declares the copy, so that the planned peak counts it.
TEST(Formats, Int8RowwiseDeclaresTheCopyOfItsScaleMultiply) {
  const auto reg = exec::builtin_registry();
  const auto& f = reg.format("int8-rowwise");
  ASSERT_TRUE(f.acquire_scratch);
  contracts::DeviceCaps copies, in_place;
  copies.kind = in_place.kind = contracts::DeviceKind::CPU;
  copies.mixed_multiply_bytes_per_element[ir::DType::BF16] = 4;
  EXPECT_EQ(f.acquire_scratch(37, 256, ir::DType::BF16, copies), 37 * 256 * 4);
  EXPECT_EQ(f.acquire_scratch(37, 256, ir::DType::F16, copies), 0);
  EXPECT_EQ(f.acquire_scratch(37, 256, ir::DType::BF16, in_place), 0);
  // What this CPU does, as describe_device measured it on a small slice, holds per element for
  // a slice of another shape.
  const auto cpu = exec::describe_device(at::kCPU);
  at::Tensor x = at::ones({100, 768}, at::kBFloat16);
  const at::Tensor s = at::full({100, 1}, 0.25);
  EXPECT_EQ(exec::cpu_peak_of([&] { x.mul_(s); }), cpu.mixed_multiply_bytes(ir::DType::BF16, 100 * 768));
  std::cout << "this CPU's bf16 x fp32 in-place multiply allocates "
            << cpu.mixed_multiply_bytes(ir::DType::BF16, 1) << " bytes per element\n";
}

TEST(Formats, Int8GemmWritesOrAccumulatesScaledProductWithBias) {
  at::manual_seed(11);
  for (const bool per_row : {true, false})
    for (const bool with_bias : {true, false})
      for (const bool accumulate : {false, true}) {
        SCOPED_TRACE(std::string(per_row ? "per-row" : "tensor-wise") + (with_bias ? ", bias" : "") +
                     (accumulate ? ", accumulate" : ""));
        const int64_t n = 37, k = 96, r = 40;
        const at::Tensor xq = at::randint(-127, 128, {n, k}).to(at::kChar);
        const at::Tensor wq = at::randint(-127, 128, {r, k}).to(at::kChar);
        const at::Tensor sx = at::rand({n, 1}) / 100 + 1e-3;
        const at::Tensor sw = per_row ? at::rand({r, 1}) / 100 + 1e-3 : at::tensor(0.004f).reshape({});
        const at::Tensor bias = with_bias ? at::randn({r}) : at::Tensor();
        const at::Tensor y0 = at::randn({n, r});
        at::Tensor y = y0.clone();
        exec::quant::int8_gemm(xq, sx, wq, sw, y, bias, accumulate);
        EXPECT_LT(test::rel_l2(y, scaled_reference(xq, sx, wq, sw, bias, accumulate ? y0 : at::Tensor())), 1e-6);
      }
}

// The devices the workspace and kernel tests ask about: the CPU, an Ampere and a Hopper GPU.
struct Devices {
  contracts::DeviceCaps cpu, ampere, hopper;
  Devices() {
    cpu.kind = contracts::DeviceKind::CPU;
    ampere.kind = hopper.kind = contracts::DeviceKind::CUDA;
    ampere.cc_major = 8;
    hopper.cc_major = 9;
  }
};

TEST(Formats, Int8GemmWorkspaceAndKernelByDevice) {
  const auto reg = exec::builtin_registry();
  const Devices d;
  const auto &cpu = d.cpu, &ampere = d.ampere, &hopper = d.hopper;
  const contracts::GemmCall g{1000, 5120, 1536, ir::DType::BF16, false};
  const int64_t activations = 1000 * 5120 + 1000 * 4, product = int64_t(1000) * 1536 * 4;
  for (const std::string name : {"int8", "convrot-int8"}) {
    SCOPED_TRACE(name);
    const auto& f = reg.format(name);
    ASSERT_TRUE(f.gemm_workspace && f.gemm_kernel);
    // Without the fused kernel the int32 product is part of the call.
    EXPECT_EQ(f.gemm_workspace(g, cpu), activations + product);
    EXPECT_EQ(f.gemm_workspace(g, ampere), activations + product);
    EXPECT_NE(f.gemm_kernel(ampere).find("_int_mm"), std::string::npos) << f.gemm_kernel(ampere);
    EXPECT_NE(f.gemm_kernel(cpu).find("CPU"), std::string::npos) << f.gemm_kernel(cpu);
    // On cc 9.0 it depends on the build and on this machine's device (the image must load).
    const bool fused = exec::quant::fused_int8_gemm(hopper);
    EXPECT_EQ(f.gemm_workspace(g, hopper), activations + (fused ? 1536 * 4 : product));
    EXPECT_EQ(f.gemm_kernel(hopper).find("CUTLASS") != std::string::npos, fused) << f.gemm_kernel(hopper);
    // Shapes the kernel does not take keep the product even there.
    for (const contracts::GemmCall& odd : {contracts::GemmCall{1000, 5120, 1530, ir::DType::BF16, false},
                                           contracts::GemmCall{1000, 5128, 1536, ir::DType::BF16, true},
                                           contracts::GemmCall{1000, 5120, 1536, ir::DType::F32, false}})
      EXPECT_EQ(f.gemm_workspace(odd, hopper),
                odd.rows * odd.in_features + odd.rows * 4 + odd.rows * odd.out_features * 4);
  }
#ifndef STREAMPLAN_SCALED_GEMM_SM90
  EXPECT_FALSE(exec::quant::fused_int8_gemm(hopper)) << "a build without the kernel";
#endif
}

TEST(Formats, Fp8GemmWorkspaceAndKernelByDevice) {
  const auto reg = exec::builtin_registry();
  const Devices d;
  const auto& f = reg.format("fp8-e4m3");
  ASSERT_TRUE(f.gemm_workspace && f.gemm_kernel);
  const contracts::GemmCall written{1000, 5120, 1536, ir::DType::BF16, false};
  const contracts::GemmCall added{1000, 5120, 1536, ir::DType::BF16, true};
  // The fp8 activations, their row scales and the weight's scales as a row; _scaled_mm's bf16
  // product where it is added to the output (or the output is not bf16).
  const int64_t operands = 1000 * 5120 + 1000 * 4 + 1536 * 4, product = int64_t(1000) * 1536 * 2;
  const auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  EXPECT_EQ(f.gemm_workspace(written, d.ampere), operands);
  EXPECT_EQ(f.gemm_workspace(added, d.ampere), operands + product);
  EXPECT_TRUE(has(f.gemm_kernel(d.ampere), "_scaled_mm")) << f.gemm_kernel(d.ampere);
  EXPECT_FALSE(exec::quant::fused_fp8_gemm(d.ampere));
  // On cc 9.0 it depends on the build and on this machine's device (the image must load): the
  // fused kernel adds into the output without a product.
  const bool fused = exec::quant::fused_fp8_gemm(d.hopper);
  EXPECT_EQ(fused, exec::quant::fused_int8_gemm(d.hopper)) << "one kernel library serves both";
  EXPECT_EQ(f.gemm_workspace(written, d.hopper), operands);
  EXPECT_EQ(f.gemm_workspace(added, d.hopper), operands + (fused ? 0 : product));
  const std::string kernel = f.gemm_kernel(d.hopper);
  EXPECT_EQ(has(kernel, "CUTLASS sm_90a fp8 GEMM, scales/bias/accumulate fused in its epilogue"), fused) << kernel;
  EXPECT_EQ(has(kernel, "_scaled_mm"), !fused) << kernel;
  // Calls the kernel does not take keep _scaled_mm's product even there: an fp32 output,
  // in_features not a multiple of 16.
  EXPECT_EQ(f.gemm_workspace({1000, 5120, 1536, ir::DType::F32, false}, d.hopper), operands + product);
  EXPECT_FALSE(exec::quant::fused_fp8_gemm(d.hopper, {1000, 5128, 1536, ir::DType::BF16, true}));
  EXPECT_EQ(exec::quant::fused_fp8_gemm(d.hopper, added), fused);
  {
    // STREAMPLAN_FP8_GEMM=aten keeps _scaled_mm (and leaves the int8 GEMM alone).
    test::ScopedEnv aten("STREAMPLAN_FP8_GEMM", "aten");
    EXPECT_FALSE(exec::quant::fused_fp8_gemm(d.hopper));
    EXPECT_EQ(f.gemm_workspace(added, d.hopper), operands + product);
    EXPECT_TRUE(has(f.gemm_kernel(d.hopper), "_scaled_mm")) << f.gemm_kernel(d.hopper);
    EXPECT_EQ(exec::quant::fused_int8_gemm(d.hopper), fused);
  }
#ifndef STREAMPLAN_SCALED_GEMM_SM90
  EXPECT_FALSE(fused) << "a build without the kernel";
#endif
}

// An fp8 weight with an input scale (as ComfyUI's layers are run, at 1 where they hold none):
// the activations are quantized per tensor with it, values beyond ±448·s clamped, not with the
// slab's own maximum. Rows 0-3 are 10^4 times larger than the rest, where the two differ.
TEST(Formats, Fp8GemmQuantizesWithTheWeightsInputScale) {
  const auto reg = native_everywhere();
  at::manual_seed(12);
  const ir::Linear l = linear("fp8-e4m3", 48, 256);
  const auto& impl = exec::impl_of<exec::FormatImpl>(reg.format("fp8-e4m3"));
  at::Tensor x = at::randn({29, 256});
  x.slice(0, 0, 4).mul_(1e4);
  const at::Tensor wq = (at::randn({48, 256}) * 8).to(at::kFloat8_e4m3fn), sw = at::tensor(0.01f).reshape({});
  auto run = [&](const at::Tensor& input_scale) {
    exec::TensorWeights w(&reg);
    w.add(l.weight, wq);
    w.add(exec::quant::scale_name(l.weight), sw);
    if (input_scale.defined()) w.add(exec::quant::input_scale_name(l.weight), input_scale);
    at::Tensor y = at::zeros({29, 48});
    impl.gemm(w, l, {}, {}, wq, x, y, {}, false);
    return y;
  };
  for (const float s : {1.0f, 0.25f}) {
    const at::Tensor sa = at::tensor(s).reshape({});
    const at::Tensor xq = x.div(sa).clamp(-448, 448).to(at::kFloat8_e4m3fn).to(at::kFloat).mul(sa);
    const at::Tensor ref = at::matmul(xq, wq.to(at::kFloat).t()) * sw;
    EXPECT_LT(test::rel_l2(run(sa), ref), 1e-6) << "input scale " << s;
  }
  const at::Tensor clamped = at::matmul(x.clamp(-448, 448).to(at::kFloat8_e4m3fn).to(at::kFloat), wq.to(at::kFloat).t()) * sw;
  EXPECT_GT(test::rel_l2(run({}), clamped), 0.5);  // the slab's maximum: the large rows are not clamped
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
    return test::error_of([&] { recognize::scan_quant(t, [&](const std::string&) { return json; }); });
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
    const models::Conversion c(src, {name}, reg);
    c.write(out);
    const models::ConvertReport& rep = c.report();
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
    EXPECT_NE(test::error_of([&] { models::Conversion(out, {name}, reg); }).find("already holds quantized"),
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
  const std::string e = test::error_of([&] { models::apply_precision(m, w, models::Precision::Fp8, cpu); });
  EXPECT_NE(e.find("--precision fp8 needs fp8 tensor cores"), std::string::npos) << e;
  const at::Tensor dense = exec::run_naive(inst.model, w, inst.inputs, reg);
  models::apply_precision(m, w, models::Precision::Int8, cpu);
  int converted = 0, kept = 0;
  for (const auto& line : models::format_lines(m, w, reg, cpu)) {
    if (line.format == "int8") {
      ++converted;
      EXPECT_NE(line.why.find("--precision int8"), std::string::npos);
      EXPECT_EQ(line.gemm, "dequantized slice, then a matmul");  // the CPU keeps the reference path
    } else {
      EXPECT_EQ(line.gemm, "matmul of the stored weight");
      ++kept;
      EXPECT_EQ(line.format, "dense");
    }
  }
  EXPECT_GT(converted, 0);
  EXPECT_GT(kept, 0);  // embedding and final projection stay as stored
  EXPECT_LT(test::rel_l2(exec::run_naive(m, w, inst.inputs, reg), dense), 0.05);
}

}  // namespace
