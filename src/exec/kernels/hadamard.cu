#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "exec/kernels/elem_io.cuh"
#include "exec/kernels/hadamard.cuh"

namespace sp::kernels {

namespace {

constexpr int kGroup = 256;
constexpr int kWarps = 8;

// Rotates one group of 256 values of row `x` (starting at column c0) into `buf` (shared, per
// warp): 8 values a lane, four radix-4 stages, normalized by 1/16.
template <typename T>
__device__ void rotate_group(const T* x, int64_t c0, float* buf, int lane) {
#pragma unroll
  for (int j = 0; j < 8; ++j) buf[lane + 32 * j] = Io<T>::load(x + c0 + lane + 32 * j);
  __syncwarp();
#pragma unroll
  for (int stride = 1; stride < kGroup; stride *= 4) {
    // 64 quads per stage, two per lane: elements base + t*stride, t = 0..3.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int quad = lane + 32 * h;
      const int base = (quad / stride) * stride * 4 + quad % stride;
      const float v0 = buf[base], v1 = buf[base + stride], v2 = buf[base + 2 * stride], v3 = buf[base + 3 * stride];
      const float s = v0 + v1 + v2 + v3;
      buf[base] = s - 2.f * v3;
      buf[base + stride] = s - 2.f * v2;
      buf[base + 2 * stride] = s - 2.f * v1;
      buf[base + 3 * stride] = s - 2.f * v0;
    }
    __syncwarp();
  }
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32) rotate_quantize_kernel(RotateQuantParams p) {
  __shared__ float bufs[kWarps][kGroup];
  __shared__ float warp_max[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
  float* buf = bufs[warp];
  const int64_t groups = p.cols / kGroup;
  constexpr float norm = 1.f / 16.f;

  float m = 0.f;
  for (int64_t g = warp; g < groups; g += kWarps) {
    rotate_group(x, g * kGroup, buf, lane);
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(buf[lane + 32 * j]));
    __syncwarp();
  }
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  float amax = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) amax = fmaxf(amax, warp_max[w]);
  amax *= norm;
  const float s = fmaxf(amax / 127.f, 1e-30f);
  if (threadIdx.x == 0) p.scale[r] = s;
  const float inv = norm / s;

  int8_t* q = p.q + r * p.cols;
  for (int64_t g = warp; g < groups; g += kWarps) {
    rotate_group(x, g * kGroup, buf, lane);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float v = fminf(fmaxf(rintf(buf[lane + 32 * j] * inv), -127.f), 127.f);
      q[g * kGroup + lane + 32 * j] = static_cast<int8_t>(v);
    }
    __syncwarp();
  }
}

}  // namespace

cudaError_t rotate_quantize_int8(const RotateQuantParams& p, cudaStream_t stream) {
  if (p.group != kGroup || p.cols % kGroup != 0 || p.rows < 0) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.rows)), block(kWarps * 32);
  switch (p.x_type) {
    case Elem::F32: rotate_quantize_kernel<float><<<grid, block, 0, stream>>>(p); break;
    case Elem::F16: rotate_quantize_kernel<__half><<<grid, block, 0, stream>>>(p); break;
    case Elem::BF16: rotate_quantize_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(p); break;
  }
  return cudaGetLastError();
}

}  // namespace sp::kernels
