// The weight formats' CUDA kernels (skipped without a CUDA device): the formats' own GEMMs
// against their dequantized references, planned vs naive with native formats, the ConvRot
// rotation and row quantization kernels, the fused sm_90a 8-bit GEMM against float64 and
// against ATen's _int_mm / _scaled_mm, and (with STREAMPLAN_TIME_KERNELS=1) their timings.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <iostream>

#include "exec/consumers/consumer.hpp"
#include "exec/formats/quantized.hpp"
#include "exec/registry.hpp"
#include "models/builder.hpp"
#include "plan/plan.hpp"
#include "formats_common.hpp"
#include "test_util.hpp"

#ifdef STREAMPLAN_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "exec/kernels/hadamard.cuh"
#endif
#ifdef STREAMPLAN_SCALED_GEMM_SM90
#include "exec/kernels/scaled_gemm_sm90.cuh"
#endif

namespace {

using namespace sp;
using namespace sp::formats_test;

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

#ifdef STREAMPLAN_WITH_CUDA

// One case of an 8-bit GEMM: the quantized operands xq [n, k], sx [n, 1], wq [r, k], sw ([] or
// [r, 1]), and for a format's GEMM (which quantizes its activations itself) x, the activations
// xq and sx came from.
struct Gemm8Case {
  at::Tensor x, xq, sx, wq, sw;
};
using MakeGemm8 = std::function<Gemm8Case(int64_t n, int64_t k, int64_t r, bool per_row, at::ScalarType xt)>;
// y (+)= the case's product (+ bias), through the path under test.
using RunGemm8 = std::function<void(const Gemm8Case&, const at::Tensor& y, const at::Tensor& bias, bool accumulate)>;

struct GemmShape {
  int64_t n, k, r;
};

// The fused kernel (where this build and device have it) and the ATen path (`aten_env`=aten),
// both through `run`, on awkward shapes: rows not multiples of the tile, bias or none, write or
// accumulate, bf16 and fp16, per-row weight scales (tensor-wise on the second shape), an output
// view inside a wider tensor and one that is not 16-byte aligned (which falls back); each
// against the float64 reference of the same quantized operands and against each other.
void check_fused_and_aten(const std::vector<GemmShape>& shapes, const MakeGemm8& make, const RunGemm8& run,
                          const std::string& aten_env, const std::string& what, bool fused) {
  const auto cuda = at::TensorOptions().device(exec::pick_device("cuda"));
  double worst_ref = 0, worst_pair = 0;
  for (size_t s = 0; s < shapes.size(); ++s)
    for (const at::ScalarType yt : {at::kBFloat16, at::kHalf})
      for (int variant = 0; variant < 4; ++variant) {
        const GemmShape sh = shapes[s];
        const bool with_bias = variant & 1, accumulate = variant & 2;
        SCOPED_TRACE(what + ": rows " + std::to_string(sh.n) + " k " + std::to_string(sh.k) + " cols " +
                     std::to_string(sh.r) + (yt == at::kHalf ? " fp16" : " bf16") + (with_bias ? ", bias" : "") +
                     (accumulate ? ", accumulate" : ""));
        const Gemm8Case c = make(sh.n, sh.k, sh.r, s != 1, yt);
        const at::Tensor bias = with_bias ? at::randn({sh.r}, cuda).to(yt) : at::Tensor();
        // y: columns [8, 8 + r) of a wider tensor (rows 16-byte aligned, stride r + 24).
        const at::Tensor wide = at::randn({sh.n, sh.r + 24}, cuda).to(yt);
        const at::Tensor y0 = wide.slice(1, 8, 8 + sh.r);
        const at::Tensor ref = scaled_reference(c.xq, c.sx, c.wq, c.sw, bias, accumulate ? y0 : at::Tensor());
        at::Tensor yf = wide.clone().slice(1, 8, 8 + sh.r), ya = wide.clone().slice(1, 8, 8 + sh.r);
        run(c, yf, bias, accumulate);
        {
          test::ScopedEnv aten(aten_env, "aten");
          run(c, ya, bias, accumulate);
        }
        const double ef = test::rel_l2(yf.cpu(), ref), ea = test::rel_l2(ya.cpu(), ref);
        const double pair = test::rel_l2(yf.cpu(), ya.cpu());
        EXPECT_LT(ef, 4e-3) << what << " vs float64 reference";
        EXPECT_LT(ea, 4e-3) << what << " with " << aten_env << "=aten vs float64 reference";
        EXPECT_LT(pair, 6e-3) << what << " vs the same with " << aten_env << "=aten";
        worst_ref = std::max(worst_ref, ef);
        worst_pair = std::max(worst_pair, pair);
      }
  std::cout << what << " rel_l2: worst vs float64 reference " << worst_ref << ", worst vs " << aten_env << "=aten "
            << worst_pair << (fused ? " (fused)" : " (not fused)") << "\n";
  // An output view that is not 16-byte aligned: the ATen path, the same result.
  const Gemm8Case c = make(300, 512, 64, true, at::kBFloat16);
  at::Tensor wide = at::zeros({300, 80}, cuda.dtype(at::kBFloat16));
  at::Tensor y = wide.slice(1, 3, 67);
  run(c, y, {}, false);
  EXPECT_LT(test::rel_l2(y.cpu(), scaled_reference(c.xq, c.sx, c.wq, c.sw, {}, {})), 4e-3);
  EXPECT_EQ(wide.slice(1, 0, 3).abs().sum().item<double>(), 0.0) << "wrote outside the view";
  EXPECT_EQ(wide.slice(1, 67, 80).abs().sum().item<double>(), 0.0) << "wrote outside the view";
}

// fp8 e4m3 values spread over the type's range (|v| up to 448).
at::Tensor random_fp8(int64_t rows, int64_t cols, const at::TensorOptions& o) {
  return (at::randn({rows, cols}, o) * 120).clamp_(-448, 448).to(at::kFloat8_e4m3fn);
}

TEST(Gpu, Int8GemmFusedAndIntMmMatchReference) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const at::Device d = exec::pick_device("cuda");
  const auto dev = exec::describe_device(d);
  const bool fused = exec::quant::fused_int8_gemm(dev);
  std::cout << "int8 GEMM kernel: " << exec::quant::int8_gemm_kernel(dev) << "\n";
#ifdef STREAMPLAN_SCALED_GEMM_SM90
  if (dev.cc_major == 9 && dev.cc_minor == 0) EXPECT_TRUE(fused) << "cc 9.0 and a build with the kernel";
#endif
  at::manual_seed(21);
  const auto cuda = at::TensorOptions().device(d);
  const MakeGemm8 make = [&](int64_t n, int64_t k, int64_t r, bool per_row, at::ScalarType) {
    Gemm8Case c;
    c.xq = at::randint(-127, 128, {n, k}, cuda).to(at::kChar);
    c.wq = at::randint(-127, 128, {r, k}, cuda).to(at::kChar);
    c.sx = at::rand({n, 1}, cuda) / 100 + 1e-4;
    c.sw = per_row ? at::rand({r, 1}, cuda) / 100 + 1e-4 : at::tensor(4e-3f, cuda).reshape({});
    return c;
  };
  const RunGemm8 run = [](const Gemm8Case& c, const at::Tensor& y, const at::Tensor& bias, bool accumulate) {
    exec::quant::int8_gemm(c.xq, c.sx, c.wq, c.sw, y, bias, accumulate);
  };
  check_fused_and_aten({{17, 256, 8}, {200, 512, 264}, {1000, 1280, 1536}, {4097, 5120, 1536}}, make, run,
                       "STREAMPLAN_INT8_GEMM", "int8_gemm", fused);
}

// The fp8-e4m3 format's GEMM on CUDA, the fused kernel against at::_scaled_mm
// (STREAMPLAN_FP8_GEMM=aten), as check_fused_and_aten says: both quantize the activations per
// row (quantize_rows, which the reference repeats) and take the weight and its scale from the
// weight source. Widths are multiples of 16 (what _scaled_mm takes).
TEST(Gpu, Fp8GemmFusedAndScaledMmMatchReference) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device("cuda");
  const auto dev = exec::describe_device(d);
  const auto& caps = reg.format("fp8-e4m3");
  if (!caps.native_gemm(dev)) GTEST_SKIP() << "no fp8 tensor cores on " << dev.name;
  const bool fused = exec::quant::fused_fp8_gemm(dev);
  std::cout << "fp8 GEMM kernel: " << caps.gemm_kernel(dev) << "\n";
#ifdef STREAMPLAN_SCALED_GEMM_SM90
  if (dev.cc_major == 9 && dev.cc_minor == 0) EXPECT_TRUE(fused) << "cc 9.0 and a build with the kernel";
#endif
  at::manual_seed(26);
  const auto cuda = at::TensorOptions().device(d);
  const MakeGemm8 make = [&](int64_t n, int64_t k, int64_t r, bool per_row, at::ScalarType xt) {
    Gemm8Case c;
    c.x = (at::randn({n, k}, cuda) * (1 + at::rand({n, 1}, cuda) * 4)).to(xt);
    std::tie(c.xq, c.sx) = exec::quant::quantize_rows(c.x, at::kFloat8_e4m3fn);
    c.wq = random_fp8(r, k, cuda);
    c.sw = per_row ? at::rand({r, 1}, cuda) / 2000 + 1e-5 : at::tensor(3e-4f, cuda).reshape({});
    // The fused kernel takes these operands directly where (and only where) it runs.
    at::Tensor probe = at::empty({n, r}, cuda.dtype(at::kBFloat16));
    EXPECT_EQ(exec::quant::fp8_gemm(c.xq, c.sx, c.wq, c.sw, probe, {}, false), fused);
    return c;
  };
  const auto& impl = exec::impl_of<exec::FormatImpl>(caps);
  const RunGemm8 run = [&](const Gemm8Case& c, const at::Tensor& y, const at::Tensor& bias, bool accumulate) {
    const ir::Linear l = linear("fp8-e4m3", c.wq.size(0), c.wq.size(1));
    exec::TensorWeights w(&reg);
    w.add(l.weight, c.wq);
    w.add(exec::quant::scale_name(l.weight), c.sw);
    impl.gemm(w, l, {}, {}, w.tensor(l.weight), c.x, y, bias, accumulate);
  };
  check_fused_and_aten({{1, 256, 16}, {77, 512, 272}, {300, 1280, 1536}, {4097, 5120, 1536}}, make, run,
                       "STREAMPLAN_FP8_GEMM", "fp8-e4m3 gemm", fused);
}

// A weight with an input scale (ComfyUI's layers hold one, or are quantized at scale 1): the
// activations are quantized per tensor with it, as ComfyUI computes (values beyond ±448·s
// clamped, small ones in e4m3's subnormal steps), not per row. The scale held on the host (a
// streamed weight's companion) and on the device gives the same. Rows 0-7 are 10^4 times larger
// than the rest and rows 8-15 10^4 times smaller, where the two quantizations differ.
TEST(Gpu, Fp8GemmQuantizesWithTheWeightsInputScale) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device("cuda");
  if (!reg.format("fp8-e4m3").native_gemm(exec::describe_device(d))) GTEST_SKIP() << "no fp8 tensor cores";
  at::manual_seed(31);
  const auto cuda = at::TensorOptions().device(d);
  const int64_t n = 203, k = 512, r = 272;
  at::Tensor x = at::randn({n, k}, cuda);
  x.slice(0, 0, 8).mul_(1e4);
  x.slice(0, 8, 16).mul_(1e-4);
  x = x.to(at::kBFloat16);
  const at::Tensor wq = random_fp8(r, k, cuda), sw = at::tensor(3e-4f, cuda).reshape({});
  const ir::Linear l = linear("fp8-e4m3", r, k);
  const auto& impl = exec::impl_of<exec::FormatImpl>(reg.format("fp8-e4m3"));
  for (const float s : {1.0f, 0.25f}) {
    const at::Tensor sa = at::tensor(s, cuda).reshape({});
    const at::Tensor xq = x.to(at::kFloat).div(sa).clamp_(-448, 448).to(at::kFloat8_e4m3fn);
    // bf16 output through the fused kernel, fp32 (a prologue's fp32 linear) through _scaled_mm
    for (const at::ScalarType out : {at::kBFloat16, at::kFloat}) {
      const at::Tensor ref = at::_scaled_mm(xq, wq.t(), sa, sw, std::nullopt, std::nullopt, out).to(at::kFloat);
      for (const bool host : {true, false}) {
        exec::TensorWeights w(&reg);
        w.add(l.weight, wq);
        w.add(exec::quant::scale_name(l.weight), sw);
        w.add(exec::quant::input_scale_name(l.weight), host ? sa.cpu() : sa);
        at::Tensor y = at::zeros({n, r}, cuda.dtype(out));
        impl.gemm(w, l, {}, {}, wq, x, y, {}, false);
        const double err = test::rel_l2(y.to(at::kFloat), ref);
        EXPECT_LT(err, out == at::kFloat ? 1e-5 : 5e-3)
            << "input scale " << s << ", output " << out << (host ? ", scale held on the host" : "");
        // The whole weight through exec::native_linear (a prologue's linear): the same.
        const at::Tensor z = exec::native_linear(reg, w, l, x.to(out), {});
        ASSERT_TRUE(z.defined());
        EXPECT_LT(test::rel_l2(z.to(at::kFloat), ref), out == at::kFloat ? 1e-2 : 5e-3);
      }
    }
  }
  // Per row (no input scale) the extreme rows come out otherwise: the check above can fail.
  exec::TensorWeights w(&reg);
  w.add(l.weight, wq);
  w.add(exec::quant::scale_name(l.weight), sw);
  at::Tensor y = at::zeros({n, r}, cuda.dtype(at::kBFloat16));
  impl.gemm(w, l, {}, {}, wq, x, y, {}, false);
  const at::Tensor one = at::tensor(1.0f, cuda).reshape({});
  const at::Tensor ref = at::_scaled_mm(x.to(at::kFloat).clamp(-448, 448).to(at::kFloat8_e4m3fn), wq.t(), one, sw,
                                        std::nullopt, std::nullopt, at::kBFloat16);
  EXPECT_GT(test::rel_l2(y.slice(0, 0, 16).to(at::kFloat), ref.slice(0, 0, 16).to(at::kFloat)), 0.5);
}

#ifdef STREAMPLAN_SCALED_GEMM_SM90
// scaled_gemm_sm90's parameters for xq [n, k] and wq [r, k] (int8 or fp8 e4m3, as their dtype
// says), rs [n] and cs [r] fp32, y [n, r] bf16 or fp16 (y = written; set accumulate, bias to
// change that), in the given tile configuration.
kernels::ScaledGemmParams gemm_params(const at::Tensor& xq, const at::Tensor& wq, const at::Tensor& rs,
                                      const at::Tensor& cs, const at::Tensor& y, kernels::GemmTile tile) {
  kernels::ScaledGemmParams p = exec::quant::scaled_gemm_params(xq, rs, wq, cs, y);
  p.tile = tile;
  return p;
}

// Both tile configurations of the kernel, called directly: int8 and fp8 e4m3 operands, written
// and accumulated, with and
// without bias, on awkward row counts and a width that is a multiple of 8 but not of 16.
TEST(Gpu, ScaledGemmSm90TileConfigurations) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  if (!kernels::scaled_gemm_sm90_ready()) GTEST_SKIP() << "no sm_90a device";
  const auto cuda = at::TensorOptions().device(exec::pick_device("cuda"));
  at::manual_seed(22);
  struct Operands {
    kernels::GemmOperand type;
    double tolerance;  // rel L2 against float64: the bf16 output, and fp8's accumulation
    std::string name;
  };
  for (const Operands& o : {Operands{kernels::GemmOperand::Int8, 4e-3, "int8"},
                            Operands{kernels::GemmOperand::F8E4M3, 4e-3, "fp8"}}) {
    double worst = 0;
    for (const auto tile : {kernels::GemmTile::PingPong128, kernels::GemmTile::Coop256})
      for (const int64_t n : {1, 77, 255, 300, 513, 2000})
        for (int variant = 0; variant < 4; ++variant) {
          const bool with_bias = variant & 1, accumulate = variant & 2;
          SCOPED_TRACE(o.name + " tile " + std::to_string(int(tile)) + " rows " + std::to_string(n) +
                       (with_bias ? ", bias" : "") + (accumulate ? ", accumulate" : ""));
          const int64_t k = 768, r = 392;
          const bool int8 = o.type == kernels::GemmOperand::Int8;
          const at::Tensor xq = int8 ? at::randint(-127, 128, {n, k}, cuda).to(at::kChar) : random_fp8(n, k, cuda);
          const at::Tensor wq = int8 ? at::randint(-127, 128, {r, k}, cuda).to(at::kChar) : random_fp8(r, k, cuda);
          const at::Tensor sx = at::rand({n}, cuda) / 1000, sw = at::rand({r}, cuda) / 1000;
          const at::Tensor bias = at::randn({r}, cuda).to(at::kBFloat16);
          at::Tensor y = at::randn({n, r}, cuda).to(at::kBFloat16);
          const at::Tensor y0 = y.clone();
          kernels::ScaledGemmParams p = gemm_params(xq, wq, sx, sw, y, tile);
          p.bias = with_bias ? bias.data_ptr() : nullptr;
          p.accumulate = accumulate;
          ASSERT_TRUE(kernels::scaled_gemm_sm90_fits(p));
          ASSERT_EQ(kernels::scaled_gemm_sm90(p, c10::cuda::getCurrentCUDAStream().stream()), cudaSuccess);
          const double e = test::rel_l2(y.cpu(), scaled_reference(xq, sx.unsqueeze(1), wq, sw.unsqueeze(1),
                                                                  with_bias ? bias : at::Tensor(),
                                                                  accumulate ? y0 : at::Tensor()));
          EXPECT_LT(e, o.tolerance);
          worst = std::max(worst, e);
        }
    std::cout << "scaled_gemm_sm90 " << o.name << ": worst rel_l2 vs float64 reference " << worst << "\n";
  }
}
#endif

// The register kernel (one read of the row) against the two-pass kernel and the ATen reference
// (rotation by matmul), including rows of up to 32,768 features and one longer (two-pass).
TEST(Gpu, RotateQuantizeRegisterKernelMatchesTwoPassAndReference) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto cuda = at::TensorOptions().device(exec::pick_device("cuda"));
  at::manual_seed(23);
  for (const int64_t cols : {256, 1280, 5120, 13824, 32768, 33024})
    for (const at::ScalarType xt : {at::kBFloat16, at::kFloat}) {
      SCOPED_TRACE("cols " + std::to_string(cols) + (xt == at::kFloat ? " fp32" : " bf16"));
      const int64_t rows = 301;
      const at::Tensor x = (at::randn({rows, cols}, cuda) * (1 + at::rand({rows, 1}, cuda) * 5)).to(xt);
      at::Tensor q1 = at::empty({rows, cols}, cuda.dtype(at::kChar)), q2 = at::empty_like(q1);
      at::Tensor s1 = at::empty({rows}, cuda), s2 = at::empty({rows}, cuda);
      kernels::RotateQuantParams p;
      p.x = x.data_ptr();
      p.x_stride = cols;
      p.x_type = xt == at::kFloat ? kernels::Elem::F32 : kernels::Elem::BF16;
      p.q = q1.data_ptr<int8_t>();
      p.scale = s1.data_ptr<float>();
      p.rows = rows;
      p.cols = cols;
      const cudaStream_t st = c10::cuda::getCurrentCUDAStream().stream();
      ASSERT_EQ(kernels::rotate_quantize_int8(p, st), cudaSuccess);
      p.q = q2.data_ptr<int8_t>();
      p.scale = s2.data_ptr<float>();
      ASSERT_EQ(kernels::rotate_quantize_int8_two_pass(p, st), cudaSuccess);
      const auto [qr, sr] = exec::quant::quantize_rows(exec::quant::rotate(x.cpu().to(at::kFloat), 256), at::kChar);
      // Summation order differs: scales to fp32 rounding, values off by one only at ties.
      EXPECT_LT(test::rel_l2(s1.cpu(), sr.reshape({rows})), 1e-6);
      EXPECT_LT(test::rel_l2(s1.cpu(), s2.cpu()), 1e-6);
      const at::Tensor d1 = (q1.cpu().to(at::kInt) - qr.to(at::kInt)).abs(), d2 = (q1 - q2).cpu().to(at::kInt).abs();
      EXPECT_LE(d1.max().item<int>(), 1);
      EXPECT_LE(d2.max().item<int>(), 1);
      EXPECT_LT(d1.to(at::kFloat).mean().item<double>(), 1e-3);
    }
}

// quantize_rows' register kernel (row lengths multiples of 8) and its two-read fallback, int8
// and fp8, against the ATen formula (the same scales; the same values but for rounding ties).
TEST(Gpu, QuantizeRowsMatchesReference) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto cuda = at::TensorOptions().device(exec::pick_device("cuda"));
  at::manual_seed(24);
  for (const int64_t cols : {8, 1000, 5120, 13824, 32768, 32776, 1001})
    for (const at::ScalarType qt : {at::kChar, at::kFloat8_e4m3fn}) {
      SCOPED_TRACE("cols " + std::to_string(cols) + (qt == at::kChar ? " int8" : " fp8"));
      const at::Tensor x = at::randn({77, cols}, cuda).to(at::kBFloat16);
      const auto [q, s] = exec::quant::quantize_rows(x, qt);
      const double qmax = qt == at::kChar ? 127.0 : 448.0;
      const at::Tensor sr = x.cpu().to(at::kFloat).abs().amax(1, true).div_(qmax).clamp_min_(1e-30);
      at::Tensor v = x.cpu().to(at::kFloat).div(sr);
      if (qt == at::kChar) v.round_();
      const at::Tensor qr = v.clamp_(-qmax, qmax).to(qt);
      EXPECT_TRUE(at::equal(s.cpu(), sr));
      // The same values but for rounding ties: the register kernel multiplies by 1/s where the
      // formula divides, which moves a tie one 8-bit step (at most 1.1e-3 of the values seen).
      const at::Tensor a = q.cpu().to(at::kFloat), b = qr.to(at::kFloat);
      const int64_t off = ((a - b).abs() > 0).sum().item<int64_t>();
      if (off) std::cout << "cols " << cols << ": " << off << " values differ\n";
      EXPECT_LE(off, std::max<int64_t>(2, a.numel() / 300));
      EXPECT_TRUE(((a - b).abs() <= b.abs() * 0.13 + 1.0).all().item<bool>());
    }
}

// The timed GEMM shapes: in_features -> out_features of the Wan 14B block's projections and
// MLP at 75,600 rows.
struct Shape {
  int64_t k, r;
};
const Shape kWanShapes[] = {{5120, 5120}, {5120, 13824}, {13824, 5120}};

// The mean ms of f on the current CUDA stream: 5 runs after one warm-up.
double time_ms(const std::function<void()>& f) {
  const cudaStream_t st = c10::cuda::getCurrentCUDAStream().stream();
  f();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const int reps = 5;
  cudaEventRecord(a, st);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b, st);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) / reps;
}

// Times at the Wan 14B block's slab (75,600 rows) where STREAMPLAN_TIME_KERNELS is set (a
// measurement, not a check): bf16 at::mm, _int_mm, int8_epilogue, the fused kernel in both
// tile configurations; the rotation kernels against a copy of the same bf16 slab.
TEST(Gpu, Int8GemmAndRotationTimes) {
  if (!getenv("STREAMPLAN_TIME_KERNELS")) GTEST_SKIP() << "set STREAMPLAN_TIME_KERNELS=1 to time";
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const at::Device d = exec::pick_device("cuda");
  const auto cuda = at::TensorOptions().device(d);
  const int64_t n = 75600;
  const cudaStream_t st = c10::cuda::getCurrentCUDAStream().stream();
  for (const Shape sh : kWanShapes) {
    const at::Tensor x = at::randn({n, sh.k}, cuda).to(at::kBFloat16);
    const at::Tensor w = (at::randn({sh.r, sh.k}, cuda) / 70).to(at::kBFloat16);
    at::Tensor y = at::empty({n, sh.r}, x.options());
    const double mm = time_ms([&] { at::mm_out(y, x, w.t()); });
    const auto [xq, sx] = exec::quant::quantize_rows(x, at::kChar);
    const auto [wq, sw] = exec::quant::quantize_rows(w, at::kChar);
    at::Tensor acc = at::_int_mm(xq, wq.t());
    const double int_mm = time_ms([&] { acc = at::_int_mm(xq, wq.t()); });
    double epi = 0;
    {
      test::ScopedEnv aten("STREAMPLAN_INT8_GEMM", "aten");
      epi = time_ms([&] { exec::quant::int8_gemm(xq, sx, wq, sw, y, {}, true); }) - int_mm;
    }
    const double quant = time_ms([&] { exec::quant::quantize_rows(x, at::kChar); });
    std::printf("int8 GEMM %ld x %ld -> %ld: bf16 mm %.2f ms, _int_mm %.2f + epilogue %.2f ms, quantize_rows %.2f ms",
                long(n), long(sh.k), long(sh.r), mm, int_mm, epi, quant);
#ifdef STREAMPLAN_SCALED_GEMM_SM90
    if (kernels::scaled_gemm_sm90_ready()) {
      const at::Tensor rs = sx.reshape({n}).contiguous(), cs = sw.reshape({sh.r}).contiguous();
      for (const auto tile : {kernels::GemmTile::PingPong128, kernels::GemmTile::Coop256}) {
        kernels::ScaledGemmParams p = gemm_params(xq, wq, rs, cs, y, tile);
        const double t = time_ms([&] { kernels::scaled_gemm_sm90(p, st); });
        p.accumulate = true;
        const double ta = time_ms([&] { kernels::scaled_gemm_sm90(p, st); });
        std::printf(", fused %s %.2f ms (accumulate %.2f)", tile == kernels::GemmTile::Coop256 ? "coop256" : "pingpong128",
                    t, ta);
      }
      const at::Tensor out = at::empty_like(y);
      exec::quant::int8_gemm(xq, sx, wq, sw, out, {}, false);
      at::Tensor dq = at::empty_like(y);
      {
        test::ScopedEnv aten("STREAMPLAN_INT8_GEMM", "aten");
        exec::quant::int8_gemm(xq, sx, wq, sw, dq, {}, false);
      }
      const at::Tensor rows = at::arange(0, n, 997, cuda.dtype(at::kLong));
      const at::Tensor bf = at::mm(x.index_select(0, rows).to(at::kFloat), w.to(at::kFloat).t());
      std::printf("; rel_l2 fused vs _int_mm+epilogue %.2e, vs bf16 inputs in fp32 %.2e (sampled rows)",
                  test::rel_l2(out.index_select(0, rows).cpu(), dq.index_select(0, rows).cpu()),
                  test::rel_l2(out.index_select(0, rows).cpu(), bf.cpu()));
    }
#endif
    std::printf("\n");
  }
  for (const int64_t k : {5120, 13824}) {
    const at::Tensor x = at::randn({n, k}, cuda).to(at::kBFloat16);
    at::Tensor q = at::empty({n, k}, cuda.dtype(at::kChar));
    at::Tensor s = at::empty({n}, cuda);
    kernels::RotateQuantParams p;
    p.x = x.data_ptr();
    p.x_stride = k;
    p.q = q.data_ptr<int8_t>();
    p.scale = s.data_ptr<float>();
    p.rows = n;
    p.cols = k;
    at::Tensor c = at::empty_like(x);
    const double copy = time_ms([&] { c.copy_(x); });
    const double reg = time_ms([&] { kernels::rotate_quantize_int8(p, st); });
    const double two = time_ms([&] { kernels::rotate_quantize_int8_two_pass(p, st); });
    const double gb = double(n) * k * 3 / 1e9, gbc = double(n) * k * 4 / 1e9;
    std::printf("rotate+quantize %ld x %ld: registers %.3f ms (%.0f GB/s), two-pass %.3f ms (%.0f GB/s), "
                "copy of the bf16 slab %.3f ms (%.0f GB/s)\n",
                long(n), long(k), reg, gb / reg * 1e3, two, gb / two * 1e3, copy, gbc / copy * 1e3);
  }
}

// Times the fp8 GEMMs at the Wan 14B block's slab (75,600 rows) where STREAMPLAN_TIME_KERNELS
// is set (a measurement, not a check), each written and accumulated into a bf16 output: bf16
// at::mm (addmm_ to accumulate), at::_scaled_mm with row-wise scales as the fp8-e4m3 format
// runs it where the fused kernel does not (_scaled_mm_out, or _scaled_mm then add_), the fused
// kernel in both tile configurations, and quantize_rows of the activations (which
// every fp8 path runs first). Prints a table, then how far the fused outputs are from
// _scaled_mm's and from the bf16 inputs' product in fp32 (sampled rows).
TEST(Gpu, Fp8GemmTimes) {
  if (!getenv("STREAMPLAN_TIME_KERNELS")) GTEST_SKIP() << "set STREAMPLAN_TIME_KERNELS=1 to time";
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const at::Device d = exec::pick_device("cuda");
  const auto dev = exec::describe_device(d);
  if (!exec::builtin_registry().format("fp8-e4m3").native_gemm(dev)) GTEST_SKIP() << "no fp8 tensor cores";
  const auto cuda = at::TensorOptions().device(d);
  const int64_t n = 75600;
  bool fused = false;
#ifdef STREAMPLAN_SCALED_GEMM_SM90
  fused = kernels::scaled_gemm_sm90_ready();
#endif
  const auto cell = [](double written, double added) {
    char b[32];
    std::snprintf(b, sizeof b, "%6.2f / %6.2f", written, added);
    return std::string(b);
  };
  std::printf("fp8 GEMM, %ld rows, ms written / accumulated into bf16 (mean of 5 after a warm-up)\n", long(n));
  std::printf("| k -> cols | bf16 mm | _scaled_mm | fused ping-pong 128 | fused coop 256 | quantize_rows |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
  std::string accuracy;
  for (const Shape sh : kWanShapes) {
    const at::Tensor x = at::randn({n, sh.k}, cuda).to(at::kBFloat16);
    const at::Tensor w = (at::randn({sh.r, sh.k}, cuda) / 70).to(at::kBFloat16);
    at::Tensor y = at::zeros({n, sh.r}, x.options());
    const double mm = time_ms([&] { at::mm_out(y, x, w.t()); });
    const double mm_acc = time_ms([&] { y.addmm_(x, w.t()); });
    const auto [xq, sx] = exec::quant::quantize_rows(x, at::kFloat8_e4m3fn);
    const auto [wq, sw] = exec::quant::quantize_rows(w, at::kFloat8_e4m3fn);
    const at::Tensor sb = sw.t().contiguous();  // [1, cols]
    const auto scaled_mm = [&] {
      return at::_scaled_mm(xq, wq.t(), sx, sb, std::nullopt, std::nullopt, at::kBFloat16);
    };
    const double smm = time_ms([&] {
      at::_scaled_mm_out(y, xq, wq.t(), sx, sb, std::nullopt, std::nullopt, at::kBFloat16);
    });
    const double smm_acc = time_ms([&] { y.add_(scaled_mm()); });
    const double quant = time_ms([&] { exec::quant::quantize_rows(x, at::kFloat8_e4m3fn); });
    std::string cells[2] = {"-", "-"};
#ifdef STREAMPLAN_SCALED_GEMM_SM90
    if (fused) {
      const cudaStream_t st = c10::cuda::getCurrentCUDAStream().stream();
      const at::Tensor rs = sx.reshape({n}).contiguous(), cs = sw.reshape({sh.r}).contiguous();
      const at::Tensor rows = at::arange(0, n, 997, cuda.dtype(at::kLong));
      const at::Tensor ref_scaled = scaled_mm().index_select(0, rows).cpu();
      const at::Tensor ref_bf16 = at::mm(x.index_select(0, rows).to(at::kFloat), w.to(at::kFloat).t()).cpu();
      int i = 0;
      for (const auto tile : {kernels::GemmTile::PingPong128, kernels::GemmTile::Coop256}) {
        kernels::ScaledGemmParams p = gemm_params(xq, wq, rs, cs, y, tile);
        const double t = time_ms([&] { kernels::scaled_gemm_sm90(p, st); });
        const at::Tensor out = y.index_select(0, rows).cpu();
        p.accumulate = true;
        const double ta = time_ms([&] { kernels::scaled_gemm_sm90(p, st); });
        cells[i++] = cell(t, ta);
        char b[200];
        std::snprintf(b, sizeof b, "%ld -> %ld %s: rel_l2 vs _scaled_mm %.2e, vs bf16 inputs in fp32 %.2e\n",
                      long(sh.k), long(sh.r), tile == kernels::GemmTile::Coop256 ? "coop 256" : "ping-pong 128",
                      test::rel_l2(out, ref_scaled), test::rel_l2(out, ref_bf16));
        accuracy += b;
      }
    }
#endif
    std::printf("| %ld -> %ld | %s | %s | %s | %s | %.2f |\n", long(sh.k), long(sh.r), cell(mm, mm_acc).c_str(),
                cell(smm, smm_acc).c_str(), cells[0].c_str(), cells[1].c_str(), quant);
  }
  std::printf("%s", fused ? accuracy.c_str() : "(no fused kernel: this build or device has none)\n");
}

#endif  // STREAMPLAN_WITH_CUDA

}  // namespace
