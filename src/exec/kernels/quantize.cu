#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "exec/kernels/elem_io.cuh"
#include "exec/kernels/hadamard.cuh"
#include "exec/kernels/quantize.cuh"

namespace sp::kernels {

namespace {

constexpr int kThreads = 256;

__device__ float block_max(float m) {
  __shared__ float warp_max[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  m = threadIdx.x < kThreads / 32 ? warp_max[threadIdx.x] : 0.f;
  if (threadIdx.x < 32)
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ float result;
  if (threadIdx.x == 0) result = m;
  __syncthreads();
  return result;
}

template <typename T, typename Q>
__global__ void __launch_bounds__(kThreads) quantize_kernel(QuantizeParams p, float qmax) {
  const int64_t r = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
  Q* q = static_cast<Q*>(p.q) + r * p.cols;
  float s = p.fixed ? *p.fixed : 0.f;
  if (!p.fixed) {
    float m = 0.f;
    for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) m = fmaxf(m, fabsf(Io<T>::load(x + c)));
    s = fmaxf(block_max(m) / qmax, 1e-30f);
  }
  if (threadIdx.x == 0) p.scale[r] = s;
  for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
    const float v = Io<T>::load(x + c) / s;
    if constexpr (std::is_same_v<Q, int8_t>) q[c] = static_cast<int8_t>(fminf(fmaxf(rintf(v), -127.f), 127.f));
    else q[c] = Q(v);  // e4m3: round to nearest, saturating to the largest finite value
  }
}

template <typename T>
cudaError_t quantize_as(const QuantizeParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.rows)), block(kThreads);
  if (p.q_type == QType::Int8) quantize_kernel<T, int8_t><<<grid, block, 0, stream>>>(p, 127.f);
  else quantize_kernel<T, __nv_fp8_e4m3><<<grid, block, 0, stream>>>(p, 448.f);
  return cudaGetLastError();
}

template <typename Y, typename B>
__global__ void __launch_bounds__(kThreads) epilogue_kernel(Int8EpilogueParams p) {
  const int64_t total = p.rows * p.cols;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t r = i / p.cols, c = i % p.cols;
    float v = float(p.acc[i]) * p.row_scale[r] * p.col_scale[c * p.col_scale_stride];
    if (p.bias) v += Io<B>::load(static_cast<const B*>(p.bias) + c);
    Y* y = static_cast<Y*>(p.y) + r * p.y_stride + c;
    Io<Y>::store(y, p.accumulate ? Io<Y>::load(y) + v : v);
  }
}

template <typename Y>
cudaError_t epilogue_as(const Int8EpilogueParams& p, cudaStream_t stream) {
  const int64_t total = p.rows * p.cols;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535 * 8));
  with_elem(p.bias_type, [&](auto b) { epilogue_kernel<Y, decltype(b)><<<blocks, kThreads, 0, stream>>>(p); });
  return cudaGetLastError();
}

}  // namespace

cudaError_t quantize_rows(const QuantizeParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.cols <= 0) return cudaSuccess;
  // Rows in registers, one read (hadamard.cu); the two-read kernel here for the rest and for a
  // fixed scale (one read).
  if (!p.fixed) {
    const cudaError_t e = quantize_rows_registers(p, stream);
    if (e != cudaErrorNotSupported) return e;
  }
  return with_elem(p.x_type, [&](auto t) { return quantize_as<decltype(t)>(p, stream); });
}

cudaError_t int8_epilogue(const Int8EpilogueParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.cols <= 0) return cudaSuccess;
  return with_elem(p.y_type, [&](auto t) { return epilogue_as<decltype(t)>(p, stream); });
}

}  // namespace sp::kernels
