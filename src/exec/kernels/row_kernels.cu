#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exec/kernels/row_kernels.cuh"

namespace sp::kernels {

namespace {

template <typename T>
struct Io;
template <>
struct Io<float> {
  static __device__ float load(const float* p) { return *p; }
  static __device__ void store(float* p, float v) { *p = v; }
};
template <>
struct Io<__half> {
  static __device__ float load(const __half* p) { return __half2float(*p); }
  static __device__ void store(__half* p, float v) { *p = __float2half_rn(v); }
};
template <>
struct Io<__nv_bfloat16> {
  static __device__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  static __device__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
};

// Element i of row r of a parameter vector, whatever its stored type (a uniform branch).
__device__ float vec_at(const RowVec& v, int64_t r, int64_t i) {
  const int64_t k = r * v.stride + i;
  switch (v.type) {
    case Elem::F16: return __half2float(static_cast<const __half*>(v.ptr)[k]);
    case Elem::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(v.ptr)[k]);
    default: return static_cast<const float*>(v.ptr)[k];
  }
}

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds one float per warp.
__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < warps; ++w) t += scratch[w];
  return t;
}

template <typename TX, typename TO>
__global__ void norm_modulate_kernel(NormModParams p) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const TX* x = static_cast<const TX*>(p.x) + r * p.x_stride;
  TO* out = static_cast<TO*>(p.out) + r * p.out_stride;
  const float inv_dim = 1.f / float(p.dim);
  float mean = 0.f;
  if (p.layer_norm) {
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) s += Io<TX>::load(x + i);
    mean = block_sum(s, scratch) * inv_dim;
  }
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    const float d = Io<TX>::load(x + i) - mean;
    ss += d * d;
  }
  const float rstd = rsqrtf(block_sum(ss, scratch) * inv_dim + p.eps);
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    float y = (Io<TX>::load(x + i) - mean) * rstd;
    if (p.weight.ptr) y *= vec_at(p.weight, 0, i);
    if (p.bias.ptr) y += vec_at(p.bias, 0, i);
    if (p.scale.ptr) y += y * vec_at(p.scale, r, i);
    if (p.shift.ptr) y += vec_at(p.shift, r, i);
    Io<TO>::store(out + i, y);
  }
}

// One block per row; warp w handles heads w, w + warps, ...; `sums` holds one float per head.
template <typename T>
__global__ void qk_norm_rope_kernel(QkRopeParams p) {
  extern __shared__ float sums[];
  const int64_t r = blockIdx.x, hd = p.head_dim;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const T* in = static_cast<const T*>(p.in) + r * p.in_stride;
  T* out = static_cast<T*>(p.out) + r * p.out_row_stride;
  if (p.norm != QkNorm::None) {
    for (int64_t h = warp; h < p.heads; h += warps) {
      float s = 0.f;
      for (int64_t d = lane; d < hd; d += 32) {
        const float v = Io<T>::load(in + h * hd + d);
        s += v * v;
      }
      s = warp_sum(s);
      if (lane == 0) sums[h] = s;
    }
    __syncthreads();
  }
  float across = 1.f;
  if (p.norm == QkNorm::AcrossHeads) {
    float t = 0.f;
    for (int64_t h = 0; h < p.heads; ++h) t += sums[h];
    across = rsqrtf(t / float(p.heads * hd) + p.eps);
  }
  const int64_t half = p.rope == Rope::None ? 0 : p.rotary_dim / 2;
  for (int64_t h = warp; h < p.heads; h += warps) {
    const float inv = p.norm == QkNorm::PerHead ? rsqrtf(sums[h] / float(hd) + p.eps) : across;
    const int64_t wbase = p.norm == QkNorm::AcrossHeads ? h * hd : 0;
    auto value = [&](int64_t d) {
      float v = Io<T>::load(in + h * hd + d);
      if (p.norm != QkNorm::None) v *= inv * vec_at(p.weight, 0, wbase + d);
      return v;
    };
    T* o = out + h * p.out_head_stride;
    for (int64_t k = lane; k < half; k += 32) {
      const int64_t ia = p.rope == Rope::SplitHalf ? k : 2 * k, ib = p.rope == Rope::SplitHalf ? k + half : 2 * k + 1;
      const float a = value(ia), b = value(ib), c = vec_at(p.cos, r, k), s = vec_at(p.sin, r, k);
      Io<T>::store(o + ia, a * c - b * s);
      Io<T>::store(o + ib, b * c + a * s);
    }
    for (int64_t d = 2 * half + lane; d < hd; d += 32) Io<T>::store(o + d, value(d));
  }
}

int threads_for(int64_t work) { return work >= 2048 ? 256 : work >= 512 ? 128 : 64; }

template <typename TX>
cudaError_t launch_norm(const NormModParams& p, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(p.rows)), block(threads_for(p.dim));
  switch (p.out_type) {
    case Elem::F32: norm_modulate_kernel<TX, float><<<grid, block, 0, s>>>(p); break;
    case Elem::F16: norm_modulate_kernel<TX, __half><<<grid, block, 0, s>>>(p); break;
    case Elem::BF16: norm_modulate_kernel<TX, __nv_bfloat16><<<grid, block, 0, s>>>(p); break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t norm_modulate(const NormModParams& p, cudaStream_t s) {
  if (p.rows <= 0) return cudaSuccess;
  switch (p.x_type) {
    case Elem::F16: return launch_norm<__half>(p, s);
    case Elem::BF16: return launch_norm<__nv_bfloat16>(p, s);
    default: return launch_norm<float>(p, s);
  }
}

cudaError_t qk_norm_rope(const QkRopeParams& p, cudaStream_t s) {
  if (p.rows <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.rows)), block(threads_for(p.heads * p.head_dim));
  const size_t smem = sizeof(float) * static_cast<size_t>(p.heads);
  switch (p.type) {
    case Elem::F16: qk_norm_rope_kernel<__half><<<grid, block, smem, s>>>(p); break;
    case Elem::BF16: qk_norm_rope_kernel<__nv_bfloat16><<<grid, block, smem, s>>>(p); break;
    default: qk_norm_rope_kernel<float><<<grid, block, smem, s>>>(p); break;
  }
  return cudaGetLastError();
}

}  // namespace sp::kernels
