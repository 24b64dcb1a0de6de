// INT8 attention kernels (see int8_attention.cuh).
#include "exec/kernels/int8_attention.cuh"

#include "exec/kernels/int8_attention_sm90.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exec/kernels/attn_ptx.cuh"
#include "exec/kernels/elem_io.cuh"

namespace sp::kernels {

namespace {

using namespace attn;

constexpr int kTile = kAttnTile;
constexpr int kThreads = 128;  // 4 warps x 16 query rows

// ---- quantization ---------------------------------------------------------------------------

// kVec elements of T (16 bytes) as fp32.
template <typename T>
struct Vec16;
template <>
struct Vec16<float> {
  static constexpr int kVec = 4;
  static __device__ void load(const float* p, float (&v)[4]) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  }
};
template <typename H, typename H2, float2 (*ToFloat2)(H2)>
struct Vec16Half {
  static constexpr int kVec = 8;
  static __device__ void load(const H* p, float (&v)[8]) {
    const uint4 x = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = ToFloat2(*reinterpret_cast<const H2*>(&w[i]));
      v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
  }
};
__device__ inline float2 bf2_to_f2(__nv_bfloat162 x) { return __bfloat1622float2(x); }
__device__ inline float2 h2_to_f2(__half2 x) { return __half22float2(x); }
template <>
struct Vec16<__nv_bfloat16> : Vec16Half<__nv_bfloat16, __nv_bfloat162, bf2_to_f2> {};
template <>
struct Vec16<__half> : Vec16Half<__half, __half2, h2_to_f2> {};

// One block per (tile, head): the tile's rows into shared memory as fp32, their column means,
// the absmax after the optional per-head subtraction, then the int8 rows, 16 per store. Vec:
// the rows read 16 bytes at a time (x, its strides and head_dim multiples of 16 bytes).
template <typename T, bool Vec>
__global__ void quantize_tiles(AttnQuantParams p) {
  extern __shared__ float tile[];  // [64][head_dim]
  __shared__ float red[kThreads / 32];
  __shared__ int row_sq[kTile];  // sums of squares of the int8 rows (p.norm)
  const int t = blockIdx.x, h = blockIdx.y, D = p.head_dim;
  const int tiles = (p.rows + kTile - 1) / kTile;
  const int rows = min(kTile, p.rows - t * kTile);
  const int64_t slot = int64_t(h) * (p.out_tiles > 0 ? p.out_tiles : tiles) + p.tile_offset + t;
  const T* x = static_cast<const T*>(p.x) + h * p.head_stride + int64_t(t) * kTile * p.row_stride;
  const float* sub = p.subtract ? p.subtract + int64_t(h) * D : nullptr;
  const float* fac = p.factor ? p.factor + int64_t(h) * D : nullptr;
  // The value quantized: x less the subtraction, times the factor.
  const auto value = [&](float v, int c) { return (sub ? v - sub[c] : v) * (fac ? fac[c] : 1.0f); };
  for (int r = threadIdx.x; r < kTile; r += blockDim.x) row_sq[r] = 0;  // before the barrier below
  float amax = 0.0f;
  if constexpr (Vec) {
    // kBatch loads of 16 bytes in flight per thread before their values are used.
    constexpr int kVec = Vec16<T>::kVec, kBatch = 8;
    const int per_row = D / kVec, total = kTile * per_row;
    for (int i0 = threadIdx.x; i0 < total; i0 += kThreads * kBatch) {
      float v[kBatch][kVec];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = i0 + b * kThreads, r = i / per_row, c = (i - r * per_row) * kVec;
        if (i < total && r < rows) {
          Vec16<T>::load(x + int64_t(r) * p.row_stride + c, v[b]);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j) v[b][j] = 0.0f;
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = i0 + b * kThreads, r = i / per_row, c = (i - r * per_row) * kVec;
        if (i >= total) break;
#pragma unroll
        for (int j = 0; j < kVec; j += 4) {
          *reinterpret_cast<float4*>(tile + r * D + c + j) =
              make_float4(v[b][j], v[b][j + 1], v[b][j + 2], v[b][j + 3]);
#pragma unroll
          for (int u = j; u < j + 4; ++u)
            if (r < rows) amax = fmaxf(amax, fabsf(value(v[b][u], c + u)));
        }
      }
    }
  } else {
    for (int i = threadIdx.x; i < kTile * D; i += blockDim.x) {
      const int r = i / D, c = i - r * D;
      const float v = r < rows ? Io<T>::load(x + int64_t(r) * p.row_stride + c) : 0.0f;
      tile[i] = v;
      if (r < rows) amax = fmaxf(amax, fabsf(value(v, c)));
    }
  }
  __syncthreads();
  if (p.tile_mean) {
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
      float s = 0.0f;  // rows past `rows` are zeros
#pragma unroll 16
      for (int r = 0; r < kTile; ++r) s += tile[r * D + c];
      p.tile_mean[slot * D + c] = s / float(rows);
    }
  }
  if (!p.out) return;
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) amax = fmaxf(amax, red[w]);
  const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
  const float inv = 1.0f / s;
  if (threadIdx.x == 0) p.scale[slot] = s * p.extra_scale;
  int8_t* out = p.out + slot * kTile * D;
  // Sixteen values of one row per thread and store (head_dim is a multiple of 16).
  for (int i = threadIdx.x * 16; i < kTile * D; i += blockDim.x * 16) {
    const int r = i / D, c = i - r * D;
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 f = *reinterpret_cast<const float4*>(tile + i + 4 * k);
      const float v[4] = {f.x, f.y, f.z, f.w};
      uint32_t packed = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float y = r < rows ? value(v[j], c + 4 * k + j) : 0.0f;
        const int q = __float2int_rn(fminf(fmaxf(y * inv, -127.0f), 127.0f));
        packed |= uint32_t(q & 0xff) << (8 * j);
      }
      w[k] = packed;
    }
    *reinterpret_cast<uint4*>(out + i) = make_uint4(w[0], w[1], w[2], w[3]);
    if (p.norm || p.tile_norm) {  // integer sums: the same in any order
      int sq = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) sq = __dp4a(int(w[k]), int(w[k]), sq);
      atomicAdd(&row_sq[r], sq);
    }
  }
  if (!p.norm && !p.tile_norm) return;
  __syncthreads();
  if (threadIdx.x < 32) {
    int m = max(row_sq[threadIdx.x], row_sq[threadIdx.x + 32]);
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float largest = sqrtf(float(m)) * (s * p.extra_scale);
    if (threadIdx.x == 0 && p.tile_norm) p.tile_norm[slot] = largest;
    if (threadIdx.x == 0 && p.norm)  // non-negative floats order as their bits
      atomicMax(reinterpret_cast<int*>(p.norm) + h, __float_as_int(largest));
  }
}

__global__ void head_mean_kernel(const float* tile_mean, int tiles, int rows, int D, float* head_mean) {
  const int h = blockIdx.x;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float s = 0.0f;
    for (int t = 0; t < tiles; ++t) s += tile_mean[(int64_t(h) * tiles + t) * D + c] * float(min(kTile, rows - t * kTile));
    head_mean[int64_t(h) * D + c] = s / float(rows);
  }
}

// ---- attention ------------------------------------------------------------------------------

__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void mma_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <typename T>
__device__ __forceinline__ void mma_16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Shared-memory row strides in bytes, padded by 16 so the 8 rows one ldmatrix reads fall in
// distinct banks.
template <int D>
struct Smem {
  static constexpr int kStride = D + 16;      // int8 Q and K rows
  static constexpr int vStride = 2 * D + 16;  // 16-bit V rows
  static constexpr int q = 0;
  static constexpr int k = q + kTile * kStride;            // two buffers
  static constexpr int v = k + 2 * kTile * kStride;        // two buffers
  static constexpr int bytes = v + 2 * kTile * vStride;
};

template <int D, typename T>
__global__ void __launch_bounds__(kThreads) attention_kernel(Int8AttnParams p) {
  using S = Smem<D>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int qt = blockIdx.x, h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int q_tiles = (p.q_rows + kTile - 1) / kTile, kv_tiles = (p.kv_rows + kTile - 1) / kTile;

  int begin = 0, count = kv_tiles;
  const int32_t* list = nullptr;
  if (p.offsets) {
    begin = p.offsets[int64_t(h) * q_tiles + qt];
    count = p.offsets[int64_t(h) * q_tiles + qt + 1] - begin;
    list = p.indices + begin;
  }

  const int8_t* kbase = p.k + int64_t(h) * kv_tiles * kTile * D;
  const T* vbase = static_cast<const T*>(p.v) + h * p.v_head_stride;
  auto load_kv = [&](int tile, int buf) {
    unsigned char* ks = smem + S::k + buf * kTile * S::kStride;
    unsigned char* vs = smem + S::v + buf * kTile * S::vStride;
    const int8_t* kg = kbase + int64_t(tile) * kTile * D;
    constexpr int kc = D / 16;
    for (int i = threadIdx.x; i < kTile * kc; i += kThreads) {
      const int r = i / kc, c = i % kc;
      cp_async16(ks + r * S::kStride + c * 16, kg + r * D + c * 16, true);
    }
    constexpr int vc = D / 8;
    for (int i = threadIdx.x; i < kTile * vc; i += kThreads) {
      const int r = i / vc, c = i % vc;
      const int row = tile * kTile + r;
      const bool ok = row < p.kv_rows;
      const T* src = ok ? vbase + int64_t(row) * p.v_row_stride + c * 8 : vbase;
      cp_async16(vs + r * S::vStride + c * 16, src, ok);
    }
  };

  // Q tile (int8) into shared memory, then into registers for the whole loop.
  {
    const int8_t* qg = p.q + (int64_t(h) * q_tiles + qt) * kTile * D;
    constexpr int kc = D / 16;
    for (int i = threadIdx.x; i < kTile * kc; i += kThreads) {
      const int r = i / kc, c = i % kc;
      cp_async16(smem + S::q + r * S::kStride + c * 16, qg + r * D + c * 16, true);
    }
    cp_commit();
  }
  if (count > 0) load_kv(list ? list[0] : 0, 0);
  cp_commit();
  cp_wait<1>();
  __syncthreads();
  constexpr int KS = D / 32;  // k-steps of the int8 product
  uint32_t qa[KS][4];
  {
    const int mi = lane >> 3;
    const int row = warp * 16 + (lane & 7) + (mi & 1) * 8;
    for (int ks = 0; ks < KS; ++ks)
      ldsm_x4(qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], smem + S::q + row * S::kStride + ks * 32 + (mi >> 1) * 16);
  }
  const float q_scale = p.q_scale[int64_t(h) * q_tiles + qt];

  constexpr int ND = D / 8;  // output n-tiles
  float o[ND][4];
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

  for (int it = 0; it < count; ++it) {
    const int tile = list ? list[it] : it;
    const int buf = it & 1;
    if (it + 1 < count) load_kv(list ? list[it + 1] : it + 1, buf ^ 1);
    cp_commit();
    cp_wait<1>();
    __syncthreads();
    const unsigned char* ks_s = smem + S::k + buf * kTile * S::kStride;
    const unsigned char* vs_s = smem + S::v + buf * kTile * S::vStride;

    // S = Q K^T (int32), 16 rows x 64 keys per warp.
    int acc[8][4];
    for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0;
    for (int j = 0; j < 8; ++j) {
      const int krow = j * 8 + (lane & 7);
      for (int c0 = 0; c0 < KS; c0 += 2) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4(b0, b1, b2, b3, ks_s + krow * S::kStride + c0 * 32 + (lane >> 3) * 16);
        mma_s8(acc[j], qa[c0], b0, b1);
        mma_s8(acc[j], qa[c0 + 1], b2, b3);
      }
    }
    const float sc = q_scale * p.k_scale[int64_t(h) * kv_tiles + tile];
    float s[8][4];
    const int valid = p.kv_rows - tile * kTile;  // keys of this tile that exist
    float mx0 = m0, mx1 = m1;
    for (int j = 0; j < 8; ++j) {
      const int key = j * 8 + t4 * 2;
      s[j][0] = key < valid ? float(acc[j][0]) * sc : -INFINITY;
      s[j][1] = key + 1 < valid ? float(acc[j][1]) * sc : -INFINITY;
      s[j][2] = key < valid ? float(acc[j][2]) * sc : -INFINITY;
      s[j][3] = key + 1 < valid ? float(acc[j][3]) * sc : -INFINITY;
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float base0 = mx0 == -INFINITY ? 0.0f : mx0, base1 = mx1 == -INFINITY ? 0.0f : mx1;
    const float a0 = ex2(m0 - base0), a1 = ex2(m1 - base1);
    m0 = mx0;
    m1 = mx1;
    l0 *= a0;
    l1 *= a1;
    for (int n = 0; n < ND; ++n) {
      o[n][0] *= a0;
      o[n][1] *= a0;
      o[n][2] *= a1;
      o[n][3] *= a1;
    }
    // P (16-bit) · V, 16 keys per step.
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t pa[4];
      float p00 = ex2(s[2 * kk][0] - base0), p01 = ex2(s[2 * kk][1] - base0);
      float p02 = ex2(s[2 * kk][2] - base1), p03 = ex2(s[2 * kk][3] - base1);
      float p10 = ex2(s[2 * kk + 1][0] - base0), p11 = ex2(s[2 * kk + 1][1] - base0);
      float p12 = ex2(s[2 * kk + 1][2] - base1), p13 = ex2(s[2 * kk + 1][3] - base1);
      l0 += p00 + p01 + p10 + p11;
      l1 += p02 + p03 + p12 + p13;
      pa[0] = pack2<T>(p00, p01);
      pa[1] = pack2<T>(p02, p03);
      pa[2] = pack2<T>(p10, p11);
      pa[3] = pack2<T>(p12, p13);
      const int vrow = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      for (int n = 0; n < ND; n += 2) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(b0, b1, b2, b3, vs_s + vrow * S::vStride + (n * 8 + (lane >> 4) * 8) * 2);
        mma_16<T>(o[n], pa, b0, b1);
        mma_16<T>(o[n + 1], pa, b2, b3);
      }
    }
    __syncthreads();  // the buffer is refilled two iterations on
  }
  cp_wait<0>();

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  T* out = static_cast<T*>(p.o) + h * p.o_head_stride;
  const int r0 = qt * kTile + warp * 16 + g, r1 = r0 + 8;
  for (int n = 0; n < ND; ++n) {
    const int col = n * 8 + t4 * 2;
    if (r0 < p.q_rows) *reinterpret_cast<uint32_t*>(out + int64_t(r0) * p.o_row_stride + col) = pack2<T>(o[n][0] * i0, o[n][1] * i0);
    if (r1 < p.q_rows) *reinterpret_cast<uint32_t*>(out + int64_t(r1) * p.o_row_stride + col) = pack2<T>(o[n][2] * i1, o[n][3] * i1);
  }
}

template <int D, typename T>
cudaError_t launch_attention(const Int8AttnParams& p, cudaStream_t stream) {
  constexpr int bytes = Smem<D>::bytes;
  cudaError_t e = cudaFuncSetAttribute(attention_kernel<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  const dim3 grid((p.q_rows + kTile - 1) / kTile, p.heads);
  attention_kernel<D, T><<<grid, kThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_quantize(const AttnQuantParams& p, dim3 grid, size_t bytes, cudaStream_t stream) {
  constexpr int kVec = 16 / int(sizeof(T));
  const bool vec = reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.row_stride % kVec == 0 &&
                   p.head_stride % kVec == 0 && p.head_dim % kVec == 0;
  auto* kernel = vec ? quantize_tiles<T, true> : quantize_tiles<T, false>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  kernel<<<grid, kThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t attn_quantize(const AttnQuantParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.heads <= 0) return cudaSuccess;
  if (p.head_dim <= 0 || p.head_dim % 16 || p.head_dim > 256) return cudaErrorInvalidValue;
  const dim3 grid((p.rows + kTile - 1) / kTile, p.heads);
  const size_t bytes = size_t(kTile) * p.head_dim * sizeof(float);
  return with_elem(p.type, [&](auto t) { return launch_quantize<decltype(t)>(p, grid, bytes, stream); });
}

cudaError_t attn_head_mean(const float* tile_mean, int heads, int rows, int head_dim, float* head_mean,
                           cudaStream_t stream) {
  if (rows <= 0 || heads <= 0) return cudaSuccess;
  head_mean_kernel<<<heads, 128, 0, stream>>>(tile_mean, (rows + kTile - 1) / kTile, rows, head_dim, head_mean);
  return cudaGetLastError();
}

cudaError_t int8_attention(const Int8AttnParams& p, cudaStream_t stream) {
  if (p.q_rows <= 0 || p.heads <= 0) return cudaSuccess;
  if (p.kv_rows <= 0) return cudaErrorInvalidValue;
  const bool bf16 = p.type == Elem::BF16;
  if (!bf16 && p.type != Elem::F16) return cudaErrorInvalidValue;
  if (p.path == AttnPath::Sm90 || (p.path == AttnPath::Auto && p.head_dim == 128 && int8_attention_sm90_ready())) {
    // cudaErrorNotSupported comes before anything is launched: the portable kernel takes these
    // parameters where the sm_90a one does not.
    const cudaError_t e = int8_attention_sm90(p, stream);
    if (e != cudaErrorNotSupported || p.path == AttnPath::Sm90) return e;
  }
  if (p.head_dim == 64) return bf16 ? launch_attention<64, __nv_bfloat16>(p, stream) : launch_attention<64, __half>(p, stream);
  if (p.head_dim == 128)
    return bf16 ? launch_attention<128, __nv_bfloat16>(p, stream) : launch_attention<128, __half>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace sp::kernels
