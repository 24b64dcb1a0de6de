// The fused int8 / fp8 e4m3 GEMM for sm_90a (scaled_gemm_sm90.cuh): CUTLASS 3.x collective
// builders, a persistent warp-specialized kernel and an epilogue visitor tree for the scales,
// bias and accumulation. Compiled for sm_90a only (streamplan_kernels_scaled_gemm_sm90 in
// CMakeLists.txt).
#include "exec/kernels/scaled_gemm_sm90.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <climits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"

namespace sp::kernels {

namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// A kernel for operands E (int8_t or float_e4m3_t), output type D, the tile configuration
// Tile x Cluster and the mainloop / epilogue schedules.
template <class E, class D, class Tile, class Cluster, class MainSchedule, class EpiSchedule>
struct ScaledGemm {
  using ElementA = E;
  using ElementB = E;
  // int8 products accumulate exactly in int32; fp8 ones in fp32.
  using ElementAcc = cute::conditional_t<cute::is_same_v<E, int8_t>, int32_t, float>;
  using ElementCompute = float;
  using LayoutA = cutlass::layout::RowMajor;     // x [rows, k]
  using LayoutB = cutlass::layout::ColumnMajor;  // w [cols, k]: B (k x cols) column-major
  using LayoutD = cutlass::layout::RowMajor;     // y [rows, cols]
  static constexpr int kAlignAB = 16;            // 16 bytes of 8-bit
  static constexpr int kAlignD = 8;              // 16 bytes of 16-bit
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  // y = beta · C + (row_scale[r] · (col_scale[c] · acc) + bias[c]); C is y itself, beta 1 when
  // accumulating and 0 otherwise (then C is not read: the visitor checks beta for zero).
  using ColScaleTimesAcc =
      fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, ElementCompute, ElementCompute, kRound>,
                      fusion::Sm90RowBroadcast<0, Tile, float, ElementCompute>,  // col_scale [cols]
                      fusion::Sm90AccFetch>;
  using Scaled =
      fusion::Sm90EVT<fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementCompute, ElementCompute, kRound>,
                      fusion::Sm90ColBroadcast<0, Tile, float, ElementCompute>,  // row_scale [rows]
                      ColScaleTimesAcc,
                      fusion::Sm90RowBroadcast<0, Tile, D, ElementCompute>>;  // bias [cols], null: 0
  using Evt = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::homogeneous_multiply_add, D, ElementCompute, kRound>,
                              fusion::Sm90ScalarBroadcast<ElementCompute>,  // beta
                              fusion::Sm90SrcFetch<D>,                      // C (= y)
                              Scaled>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, ElementCompute, D, LayoutD, kAlignD, D, LayoutD,
      kAlignD, EpiSchedule, Evt>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlignAB, ElementB, LayoutB, kAlignAB,
      ElementAcc, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static cudaError_t run(const ScaledGemmParams& p, int sm_count, cudaStream_t stream) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    const int m = int(p.rows), n = int(p.cols), k = int(p.k);
    StrideA sa{};
    get<0>(sa) = p.x_stride;
    StrideB sb{};
    get<0>(sb) = p.w_stride;
    StrideD sd{};
    get<0>(sd) = p.y_stride;
    StrideC sc{};
    get<0>(sc) = p.y_stride;
    D* y = static_cast<D*>(p.y);

    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {m, n, k, 1},
                                  {static_cast<const E*>(p.x), sa, static_cast<const E*>(p.w), sb},
                                  {{}, y, sc, y, sd}};
    args.hw_info.device_id = 0;
    args.hw_info.sm_count = sm_count;
    args.epilogue.thread = {
        {{p.accumulate ? 1.f : 0.f}},  // beta
        {},                            // C
        {
            // row_scale · (col_scale · acc) + bias
            {p.row_scale},                                  // row_scale
            {{p.col_scale}, {}, {}},                        // col_scale · acc
            {static_cast<const D*>(p.bias), D(0.f)},        // bias
            {},
        },
        {},
    };
    if (Gemm::get_workspace_size(args) != 0) return cudaErrorNotSupported;
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    if (gemm.run(stream) != cutlass::Status::kSuccess) {
      const cudaError_t e = cudaGetLastError();
      return e == cudaSuccess ? cudaErrorLaunchFailure : e;
    }
    return cudaGetLastError();
  }

  static bool image_loads() {
    cudaFuncAttributes a{};
    const bool ok = cudaFuncGetAttributes(&a, cutlass::device_kernel<Kernel>) == cudaSuccess;
    cudaGetLastError();
    return ok;
  }
};

using PingPong128 = Shape<_128, _128, _128>;
using Coop256 = Shape<_256, _128, _128>;
using Cluster2x1 = Shape<_2, _1, _1>;

// The two tile configurations of one operand type and mainloop. fp8 runs the FP8FastAccum
// schedules: the tensor cores accumulate over the whole k. CUTLASS's fp8 mainloop with
// accumulation promotion keeps a second set of fp32 accumulators, which spilled (about 0.9 KB
// a thread) and ran 4x slower on the H200; fast accumulation differs from the promoted product
// by 2.5e-3 - 3.6e-3 rel L2, against 3.8e-2 for the fp8 quantization itself (kernels/README.md).
template <class E, class PingPongSchedule, class CoopSchedule>
struct Kernels {
  template <class D>
  using PingPong = ScaledGemm<E, D, PingPong128, Cluster2x1, PingPongSchedule, cutlass::epilogue::TmaWarpSpecialized>;
  template <class D>
  using Coop = ScaledGemm<E, D, Coop256, Cluster2x1, CoopSchedule, cutlass::epilogue::TmaWarpSpecializedCooperative>;

  static bool images_load() {
    return PingPong<cutlass::bfloat16_t>::image_loads() && PingPong<cutlass::half_t>::image_loads() &&
           Coop<cutlass::bfloat16_t>::image_loads() && Coop<cutlass::half_t>::image_loads();
  }
};

using Int8Kernels = Kernels<int8_t, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                            cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
using Fp8Kernels = Kernels<cutlass::float_e4m3_t, cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum,
                           cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum>;

constexpr int kDevices = 64;

int sm_count(int dev) {
  static std::atomic<int> counts[kDevices];
  int c = counts[dev].load(std::memory_order_relaxed);
  if (c == 0) {
    cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev);
    counts[dev].store(c, std::memory_order_relaxed);
  }
  return c;
}

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The tile configuration for a shape, as measured on the H200 (kernels/README.md).
GemmTile pick(const ScaledGemmParams& p) {
  if (p.tile != GemmTile::Auto) return p.tile;
  // int8 at 75,600 rows: ping-pong faster on 5120 -> 5120, 5120 -> 13824 and 13824 -> 5120
  // written, cooperative 256-row tiles on 13824 -> 5120 accumulated (8.0 against 8.8 ms).
  // fp8 the same: cooperative faster on 13824 -> 5120 accumulated in two runs (8.4 / 8.6 against
  // 9.0 / 9.8 ms), written once faster and once slower.
  return p.accumulate && p.k >= 8192 ? GemmTile::Coop256 : GemmTile::PingPong128;
}

template <class K, class D>
cudaError_t run_tile(const ScaledGemmParams& p, int sms, cudaStream_t stream) {
  if (pick(p) == GemmTile::Coop256) return K::template Coop<D>::run(p, sms, stream);
  return K::template PingPong<D>::run(p, sms, stream);
}

template <class D>
cudaError_t run_as(const ScaledGemmParams& p, int sms, cudaStream_t stream) {
  if (p.operand == GemmOperand::Int8) return run_tile<Int8Kernels, D>(p, sms, stream);
  return run_tile<Fp8Kernels, D>(p, sms, stream);
}

}  // namespace

bool scaled_gemm_sm90_ready() {
  static std::atomic<int> state[kDevices];  // 0 unknown, 1 ready, 2 not
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kDevices) {
    cudaGetLastError();
    return false;
  }
  int s = state[dev].load(std::memory_order_relaxed);
  if (s == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    const bool image = major == 9 && minor == 0 && Int8Kernels::images_load() && Fp8Kernels::images_load();
    cudaGetLastError();  // a missing image is an answer, not an error to keep
    s = image ? 1 : 2;
    state[dev].store(s, std::memory_order_relaxed);
  }
  return s == 1;
}

bool scaled_gemm_sm90_fits(const ScaledGemmParams& p) {
  return (p.operand == GemmOperand::Int8 || p.operand == GemmOperand::F8E4M3) &&
         (p.y_type == Elem::BF16 || p.y_type == Elem::F16) && p.rows > 0 && p.cols > 0 && p.k > 0 &&
         p.rows <= INT_MAX && p.cols <= INT_MAX && p.k <= INT_MAX && p.k % 16 == 0 && p.cols % 8 == 0 &&
         p.y_stride % 8 == 0 && p.x_stride % 16 == 0 && p.w_stride % 16 == 0 && p.y_stride >= p.cols &&
         p.x_stride >= p.k && p.w_stride >= p.k && p.x && p.w && p.y && p.row_scale && p.col_scale &&
         aligned16(p.x) && aligned16(p.w) && aligned16(p.y) && aligned16(p.bias) && aligned16(p.row_scale) &&
         aligned16(p.col_scale);
}

cudaError_t scaled_gemm_sm90(const ScaledGemmParams& p, cudaStream_t stream) {
  if (!scaled_gemm_sm90_ready() || !scaled_gemm_sm90_fits(p)) return cudaErrorNotSupported;
  int dev = 0;
  cudaGetDevice(&dev);
  const int sms = sm_count(dev);
  if (p.y_type == Elem::F16) return run_as<cutlass::half_t>(p, sms, stream);
  return run_as<cutlass::bfloat16_t>(p, sms, stream);
}

}  // namespace sp::kernels
