#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "exec/kernels/elem_io.cuh"
#include "exec/kernels/row_kernels.cuh"

namespace sp::kernels {

namespace {

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

// --- vectorized rows ---------------------------------------------------------------------
// Where every row, parameter vector and stride is aligned to 16 bytes and the width is a
// multiple of 8, a thread moves 8 elements per access and keeps its share of the row in
// registers: the row is read once and written once, which is what the cost model charges.

constexpr int kVec = 8;          // elements per access
constexpr int kMaxVecs = 4;      // accesses of a row a thread holds in registers
constexpr int kMaxThreads = 1024;

template <typename T>
__device__ void load8(const T* p, float* f);
template <>
__device__ void load8<float>(const float* p, float* f) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
template <>
__device__ void load8<__half>(const __half* p, float* f) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&u);
  for (int i = 0; i < 4; ++i) {
    const float2 v = __half22float2(h[i]);
    f[2 * i] = v.x, f[2 * i + 1] = v.y;
  }
}
template <>
__device__ void load8<__nv_bfloat16>(const __nv_bfloat16* p, float* f) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x, f[2 * i + 1] = v.y;
  }
}
template <typename T>
__device__ void store8(T* p, const float* f);
template <>
__device__ void store8<float>(float* p, const float* f) {
  reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
}
template <>
__device__ void store8<__half>(__half* p, const float* f) {
  uint4 u;
  __half2* h = reinterpret_cast<__half2*>(&u);
  for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}
template <>
__device__ void store8<__nv_bfloat16>(__nv_bfloat16* p, const float* f) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}
// Elements i .. i + 7 of row r of a parameter vector.
__device__ void vec8_at(const RowVec& v, int64_t r, int64_t i, float* f) {
  const int64_t k = r * v.stride + i;
  switch (v.type) {
    case Elem::F16: load8(static_cast<const __half*>(v.ptr) + k, f); break;
    case Elem::BF16: load8(static_cast<const __nv_bfloat16*>(v.ptr) + k, f); break;
    default: load8(static_cast<const float*>(v.ptr) + k, f); break;
  }
}

template <typename TX, typename TO>
__global__ void norm_modulate_vec_kernel(NormModParams p) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const TX* x = static_cast<const TX*>(p.x) + r * p.x_stride;
  TO* out = static_cast<TO*>(p.out) + r * p.out_stride;
  const int vecs = static_cast<int>(p.dim / kVec);
  float v[kMaxVecs][kVec];
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int q = threadIdx.x + j * blockDim.x;
    if (q < vecs) {
      load8(x + int64_t(q) * kVec, v[j]);
      for (int e = 0; e < kVec; ++e) s += v[j][e];
    }
  }
  const float inv_dim = 1.f / float(p.dim);
  const float mean = p.layer_norm ? block_sum(s, scratch) * inv_dim : 0.f;
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j)
    if (threadIdx.x + j * blockDim.x < vecs)
      for (int e = 0; e < kVec; ++e) {
        const float d = v[j][e] - mean;
        ss += d * d;
      }
  const float rstd = rsqrtf(block_sum(ss, scratch) * inv_dim + p.eps);
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int q = threadIdx.x + j * blockDim.x;
    if (q >= vecs) continue;
    const int64_t i = int64_t(q) * kVec;
    float y[kVec], a[kVec];
    for (int e = 0; e < kVec; ++e) y[e] = (v[j][e] - mean) * rstd;
    if (p.weight.ptr) {
      vec8_at(p.weight, 0, i, a);
      for (int e = 0; e < kVec; ++e) y[e] *= a[e];
    }
    if (p.bias.ptr) {
      vec8_at(p.bias, 0, i, a);
      for (int e = 0; e < kVec; ++e) y[e] += a[e];
    }
    if (p.scale.ptr) {
      vec8_at(p.scale, r, i, a);
      for (int e = 0; e < kVec; ++e) y[e] += y[e] * a[e];
    }
    if (p.shift.ptr) {
      vec8_at(p.shift, r, i, a);
      for (int e = 0; e < kVec; ++e) y[e] += a[e];
    }
    store8(out + i, y);
  }
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }
// A row vector fits 8-element accesses: absent, or aligned with a stride that keeps every
// row aligned (16 bytes = 8 16-bit or 4 fp32 elements; 8 of either keeps both).
bool vec_ok(const RowVec& v) { return !v.ptr || (aligned16(v.ptr) && v.stride % kVec == 0); }

bool norm_vectorizable(const NormModParams& p) {
  return p.dim % kVec == 0 && p.dim / kVec <= int64_t(kMaxVecs) * kMaxThreads && aligned16(p.x) && aligned16(p.out) &&
         p.x_stride % kVec == 0 && p.out_stride % kVec == 0 && vec_ok(p.weight) && vec_ok(p.bias) &&
         vec_ok(p.scale) && vec_ok(p.shift);
}

// Grid-stride over the [rows, dim / 8] accesses (VEC) or the [rows, dim] elements.
template <typename TX, typename TY, bool VEC>
__global__ void residual_add_kernel(ResidualAddParams p) {
  const int64_t per_row = VEC ? p.dim / kVec : p.dim;
  const int64_t total = p.rows * per_row;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = k / per_row, c = k % per_row;
    if constexpr (VEC) {
      const int64_t i = c * kVec;
      TX* xp = static_cast<TX*>(p.x) + r * p.x_stride + i;
      float a[kVec], b[kVec], g[kVec];
      load8(xp, a);
      load8(static_cast<const TY*>(p.y) + r * p.y_stride + i, b);
      if (p.gate.ptr) {
        vec8_at(p.gate, r, i, g);
        for (int e = 0; e < kVec; ++e) a[e] += b[e] * g[e];
      } else {
        for (int e = 0; e < kVec; ++e) a[e] += b[e];
      }
      store8(xp, a);
    } else {
      TX* xp = static_cast<TX*>(p.x) + r * p.x_stride + c;
      const float b = Io<TY>::load(static_cast<const TY*>(p.y) + r * p.y_stride + c);
      Io<TX>::store(xp, Io<TX>::load(xp) + (p.gate.ptr ? b * vec_at(p.gate, r, c) : b));
    }
  }
}

template <typename TX, typename TY>
void launch_residual_as(const ResidualAddParams& p, cudaStream_t s) {
  const bool vec = p.dim % kVec == 0 && aligned16(p.x) && aligned16(p.y) && p.x_stride % kVec == 0 &&
                   p.y_stride % kVec == 0 && vec_ok(p.gate);
  const int64_t work = p.rows * (vec ? p.dim / kVec : p.dim);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((work + 255) / 256, int64_t{1} << 20));
  if (vec) residual_add_kernel<TX, TY, true><<<blocks, 256, 0, s>>>(p);
  else residual_add_kernel<TX, TY, false><<<blocks, 256, 0, s>>>(p);
}

// 1 / rms over all heads of a row from its per-head sums of squares (AcrossHeads), else 1.
__device__ float across_heads_inv(const QkRopeParams& p, const float* sums) {
  if (p.norm != QkNorm::AcrossHeads) return 1.f;
  float t = 0.f;
  for (int64_t h = 0; h < p.heads; ++h) t += sums[h];
  return rsqrtf(t / float(p.heads * p.head_dim) + p.eps);
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
  const float across = across_heads_inv(p, sums);
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

// The same with 8-element accesses: lane g of a head's warp holds elements 8g .. 8g + 7
// (head_dim <= 256); a split-half rotation takes its partner elements from the lane half a
// rotation away.
template <typename T>
__global__ void qk_norm_rope_vec_kernel(QkRopeParams p) {
  extern __shared__ float sums[];
  const int64_t r = blockIdx.x, hd = p.head_dim;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int groups = static_cast<int>(hd / kVec);
  const bool active = lane < groups;
  const T* in = static_cast<const T*>(p.in) + r * p.in_stride;
  T* out = static_cast<T*>(p.out) + r * p.out_row_stride;
  float v[kVec];
  if (p.norm != QkNorm::None) {
    for (int64_t h = warp; h < p.heads; h += warps) {
      float s = 0.f;
      if (active) {
        load8(in + h * hd + lane * kVec, v);
        for (int e = 0; e < kVec; ++e) s += v[e] * v[e];
      }
      s = warp_sum(s);
      if (lane == 0) sums[h] = s;
    }
    __syncthreads();
  }
  const float across = across_heads_inv(p, sums);
  const int half = p.rope == Rope::None ? 0 : static_cast<int>(p.rotary_dim / 2);
  const int d0 = lane * kVec;
  for (int64_t h = warp; h < p.heads; h += warps) {
    float w[kVec];
    if (active) {
      load8(in + h * hd + d0, v);
      if (p.norm != QkNorm::None) {
        const float inv = p.norm == QkNorm::PerHead ? rsqrtf(sums[h] / float(hd) + p.eps) : across;
        vec8_at(p.weight, 0, (p.norm == QkNorm::AcrossHeads ? h * hd : 0) + d0, w);
        for (int e = 0; e < kVec; ++e) v[e] *= inv * w[e];
      }
    }
    if (p.rope == Rope::SplitHalf) {
      // Lanes below half / 8 hold a, the next half / 8 lanes hold b; every lane shuffles.
      const int shift = half / kVec;
      const bool first = d0 < half, rotated = d0 < 2 * half;
      const int partner = first ? lane + shift : lane - shift;
      float o[kVec];
      for (int e = 0; e < kVec; ++e) o[e] = __shfl_sync(0xffffffffu, v[e], rotated ? partner : lane);
      if (active && rotated) {
        float c[kVec], sn[kVec];
        const int k = first ? d0 : d0 - half;
        vec8_at(p.cos, r, k, c);
        vec8_at(p.sin, r, k, sn);
        for (int e = 0; e < kVec; ++e) v[e] = first ? v[e] * c[e] - o[e] * sn[e] : v[e] * c[e] + o[e] * sn[e];
      }
    } else if (p.rope == Rope::Interleaved && active && d0 < 2 * half) {
      for (int e = 0; e < kVec; e += 2) {
        const int k = (d0 + e) / 2;
        const float c = vec_at(p.cos, r, k), sn = vec_at(p.sin, r, k), a = v[e], b = v[e + 1];
        v[e] = a * c - b * sn;
        v[e + 1] = b * c + a * sn;
      }
    }
    if (active) store8(out + h * p.out_head_stride + d0, v);
  }
}

bool qk_vectorizable(const QkRopeParams& p) {
  const bool rope_ok = p.rope == Rope::None || (p.rope == Rope::SplitHalf && (p.rotary_dim / 2) % kVec == 0) ||
                       (p.rope == Rope::Interleaved && p.rotary_dim % kVec == 0);
  return rope_ok && p.head_dim % kVec == 0 && p.head_dim <= 32 * kVec && aligned16(p.in) && aligned16(p.out) &&
         p.in_stride % kVec == 0 && p.out_row_stride % kVec == 0 && p.out_head_stride % kVec == 0 &&
         vec_ok(p.weight) && vec_ok(p.cos) && vec_ok(p.sin);
}

int threads_for(int64_t work) { return work >= 2048 ? 256 : work >= 512 ? 128 : 64; }

template <typename TX, typename TO>
void launch_norm_as(const NormModParams& p, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(p.rows));
  if (norm_vectorizable(p)) {
    // Two accesses per thread where the row allows (enough warps to hide latency), up to
    // kMaxVecs for the widest rows.
    const int64_t vecs = p.dim / kVec;
    int64_t threads = std::min<int64_t>(kMaxThreads, (vecs + 1) / 2);
    threads = std::max<int64_t>(32, (threads + 31) / 32 * 32);
    while (threads * kMaxVecs < vecs) threads += 32;
    norm_modulate_vec_kernel<TX, TO><<<grid, dim3(static_cast<unsigned>(threads)), 0, s>>>(p);
    return;
  }
  norm_modulate_kernel<TX, TO><<<grid, dim3(threads_for(p.dim)), 0, s>>>(p);
}

}  // namespace

cudaError_t norm_modulate(const NormModParams& p, cudaStream_t s) {
  if (p.rows <= 0) return cudaSuccess;
  with_elem(p.x_type, [&](auto x) {
    with_elem(p.out_type, [&](auto out) { launch_norm_as<decltype(x), decltype(out)>(p, s); });
  });
  return cudaGetLastError();
}

cudaError_t qk_norm_rope(const QkRopeParams& p, cudaStream_t s) {
  if (p.rows <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.rows));
  const size_t smem = sizeof(float) * static_cast<size_t>(p.heads);
  if (qk_vectorizable(p)) {
    // A warp per head, up to 8 warps.
    const dim3 block(static_cast<unsigned>(32 * std::min<int64_t>(8, p.heads)));
    with_elem(p.type, [&](auto t) { qk_norm_rope_vec_kernel<decltype(t)><<<grid, block, smem, s>>>(p); });
    return cudaGetLastError();
  }
  const dim3 block(threads_for(p.heads * p.head_dim));
  with_elem(p.type, [&](auto t) { qk_norm_rope_kernel<decltype(t)><<<grid, block, smem, s>>>(p); });
  return cudaGetLastError();
}

cudaError_t residual_add(const ResidualAddParams& p, cudaStream_t s) {
  if (p.rows <= 0 || p.dim <= 0) return cudaSuccess;
  with_elem(p.x_type, [&](auto x) {
    with_elem(p.y_type, [&](auto y) { launch_residual_as<decltype(x), decltype(y)>(p, s); });
  });
  return cudaGetLastError();
}

}  // namespace sp::kernels
