// The sm_90a path of int8_attention (see int8_attention.cuh for the design): wgmma instead of
// mma.sync, head_dim 128. Compiled for sm_90a only; on any other architecture the kernels are
// empty and int8_attention_sm90_ready() is false, so int8_attention keeps the portable path.
#include "exec/kernels/int8_attention_sm90.cuh"

#include <atomic>

#include "exec/kernels/attn_ptx.cuh"

namespace sp::kernels {

namespace {

using namespace attn;

constexpr int kTile = kAttnTile;  // 64 query rows per warpgroup, 64 keys per tile
constexpr int kD = 128;           // head_dim: one int8 row is one 128-byte swizzle row
constexpr int kStages = 4;        // K/V tiles in flight
constexpr int kQBytes = kTile * kD;       // int8
constexpr int kKBytes = kTile * kD;       // int8
constexpr int kVBytes = kTile * kD * 2;   // 16-bit, two 64-column halves of 8 KiB
constexpr int kStageBytes = kKBytes + kVBytes;

template <int WG>
constexpr int smem_bytes() { return WG * kQBytes + kStages * kStageBytes + 1024; }  // + alignment

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Shared-memory matrix descriptor, 128-byte swizzle; offsets in bytes.
__device__ __forceinline__ uint64_t sw128_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint64_t a = smem_addr(p);
  return ((a & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) | (uint64_t(1) << 62);
}
// Byte offset of 16-byte chunk c of row r in a 128-byte-swizzled tile of 128-byte rows
// (the tile 1024-byte aligned): the chunk index XOR the row within its group of 8.
__device__ __forceinline__ int sw128(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Orders the compiler's uses of an asynchronous operand after the wait that completes it.
template <typename R>
__device__ __forceinline__ void pin(R& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void pin(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// D[64x64] (+)= A[64x32] * B[32x64], s8 x s8 -> s32, A and B in shared memory (K-major).
__device__ __forceinline__ void wgmma_s8_64x64(int (&d)[32], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64x128] += A[64x16] * B[16x128], 16-bit x 16-bit -> f32, A in registers (the layout of an
// accumulator fragment), B in shared memory (N-major: the transpose bit set).
template <typename T>
__device__ __forceinline__ void wgmma_pv(float (&d)[64], const uint32_t (&a)[4], uint64_t b);
template <>
__device__ __forceinline__ void wgmma_pv<__nv_bfloat16>(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_pv<__half>(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// One CTA: WG warpgroups, each 64 query rows (query tiles blockIdx.x * WG + wg), sharing the
// key tiles of the CTA's list. Dense runs WG = 2 (the K/V tiles read once per 128 query rows),
// the block-sparse path WG = 1 (one list per 64-row query tile).
template <int WG, typename T>
__global__ void __launch_bounds__(WG * 128, WG == 1 ? 2 : 1) attention_sm90(Int8AttnParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // swizzle atoms are 1024-byte aligned
  const int tid = threadIdx.x, wg = tid >> 7;
  const int warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.y;
  const int q_tiles = (p.q_rows + kTile - 1) / kTile, kv_tiles = (p.kv_rows + kTile - 1) / kTile;
  const int qt = blockIdx.x * WG + wg;

  int count = kv_tiles;
  const int32_t* list = nullptr;
  if (p.offsets) {  // WG == 1
    const int begin = p.offsets[int64_t(h) * q_tiles + blockIdx.x];
    count = p.offsets[int64_t(h) * q_tiles + blockIdx.x + 1] - begin;
    list = p.indices + begin;
  }
  unsigned char* qs = smem + wg * kQBytes;
  unsigned char* stages = smem + WG * kQBytes;

  const int8_t* kbase = p.k + int64_t(h) * kv_tiles * kTile * kD;
  const T* vbase = static_cast<const T*>(p.v) + h * p.v_head_stride;
  // K tile: 64 rows of 128 bytes, swizzled. V tile: two 64-column halves, each 64 rows of
  // 128 bytes, swizzled (N-major B operand); rows past kv_rows zero-filled.
  auto load_kv = [&](int it) {
    const int tile = list ? list[it] : it;
    unsigned char* ks = stages + (it % kStages) * kStageBytes;
    unsigned char* vs = ks + kKBytes;
    const int8_t* kg = kbase + int64_t(tile) * kTile * kD;
    for (int i = tid; i < kTile * 8; i += WG * 128) {
      const int r = i >> 3, c = i & 7;
      cp_async16(ks + sw128(r, c), kg + r * kD + c * 16, true);
    }
    for (int i = tid; i < kTile * 16; i += WG * 128) {
      const int r = i >> 4, c = i & 15;
      const int row = tile * kTile + r;
      const bool ok = row < p.kv_rows;
      const T* src = ok ? vbase + int64_t(row) * p.v_row_stride + c * 8 : vbase;
      cp_async16(vs + (c >> 3) * (kVBytes / 2) + sw128(r, c & 7), src, ok);
    }
  };

  // Q tiles (zero where the CTA's second tile is past the end) with the first K/V tile.
  for (int i = tid; i < WG * kTile * 8; i += WG * 128) {
    const int w = i / (kTile * 8), r = (i >> 3) & (kTile - 1), c = i & 7;
    const int t = blockIdx.x * WG + w;
    const bool ok = t < q_tiles;
    const int8_t* src = ok ? p.q + ((int64_t(h) * q_tiles + t) * kTile + r) * kD + c * 16 : p.q;
    cp_async16(smem + w * kQBytes + sw128(r, c), src, ok);
  }
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < count) load_kv(s);
    cp_commit();
  }
  const float q_scale = qt < q_tiles ? p.q_scale[int64_t(h) * q_tiles + qt] : 0.0f;

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  uint32_t pa[16];  // P of the current tile, bf16/fp16 pairs in the A-fragment order

  // S = Q K^T of tile `it` into s (issued, not waited).
  auto issue_qk = [&](int it, int (&s)[32]) {
    const unsigned char* ks = stages + (it % kStages) * kStageBytes;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kD / 32; ++k)
      wgmma_s8_64x64(s, sw128_desc(qs + k * 32, 16, 1024), sw128_desc(ks + k * 32, 16, 1024), k > 0);
    wgmma_commit();
  };
  // The online softmax of tile `it` from its (completed) S: new maxima, the factors that
  // rescale the old sums and outputs, P into pn. Returns the two factors.
  auto softmax = [&](int it, int (&s)[32], uint32_t (&pn)[16], float& a0, float& a1) {
    const int tile = list ? list[it] : it;
    const float sc = q_scale * p.k_scale[int64_t(h) * kv_tiles + tile];
    const int valid = p.kv_rows - tile * kTile;
    float f[32];
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int key = j * 8 + t4 * 2;
      f[4 * j + 0] = key < valid ? float(s[4 * j + 0]) * sc : -INFINITY;
      f[4 * j + 1] = key + 1 < valid ? float(s[4 * j + 1]) * sc : -INFINITY;
      f[4 * j + 2] = key < valid ? float(s[4 * j + 2]) * sc : -INFINITY;
      f[4 * j + 3] = key + 1 < valid ? float(s[4 * j + 3]) * sc : -INFINITY;
      mx0 = fmaxf(mx0, fmaxf(f[4 * j], f[4 * j + 1]));
      mx1 = fmaxf(mx1, fmaxf(f[4 * j + 2], f[4 * j + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float base0 = mx0 == -INFINITY ? 0.0f : mx0, base1 = mx1 == -INFINITY ? 0.0f : mx1;
    a0 = ex2(m0 - base0);
    a1 = ex2(m1 - base1);
    m0 = mx0;
    m1 = mx1;
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float e0 = ex2(f[4 * j] - base0), e1 = ex2(f[4 * j + 1] - base0);
      const float e2 = ex2(f[4 * j + 2] - base1), e3 = ex2(f[4 * j + 3] - base1);
      s0 += e0 + e1;
      s1 += e2 + e3;
      // n-tiles 2kk and 2kk+1 of S are the A fragment of k-step kk: (g, 2kk), (g+8, 2kk),
      // (g, 2kk+1), (g+8, 2kk+1).
      pn[(j >> 1) * 4 + (j & 1) * 2 + 0] = pack2<T>(e0, e1);
      pn[(j >> 1) * 4 + (j & 1) * 2 + 1] = pack2<T>(e2, e3);
    }
    l0 = l0 * a0 + s0;
    l1 = l1 * a1 + s1;
  };
  auto issue_pv = [&](int it) {
    const unsigned char* vs = stages + (it % kStages) * kStageBytes + kKBytes;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kTile / 16; ++k) {
      const uint32_t a[4] = {pa[4 * k], pa[4 * k + 1], pa[4 * k + 2], pa[4 * k + 3]};
      wgmma_pv<T>(o, a, sw128_desc(vs + k * 16 * 128, kVBytes / 2, 1024));
    }
    wgmma_commit();
  };

  if (count > 0) {
    cp_wait<kStages - 2>();  // Q and the first K/V tile
    fence_async_shared();
    __syncthreads();
    int s[32];
    issue_qk(0, s);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) pin(s[i]);
    float a0, a1;
    softmax(0, s, pa, a0, a1);
  }
  for (int it = 0; it < count; ++it) {
    // Tile it+1 resident and every warpgroup past tile it-1, whose buffer is refilled.
    cp_wait<kStages - 3>();
    fence_async_shared();
    __syncthreads();
    if (it + kStages - 1 < count) load_kv(it + kStages - 1);
    cp_commit();
    const bool next = it + 1 < count;
    int s[32];
    issue_qk(next ? it + 1 : it, s);
    issue_pv(it);
    float a0 = 1.0f, a1 = 1.0f;
    uint32_t pn[16];
    wgmma_wait<1>();  // S of tile it+1; P·V of tile it still running
#pragma unroll
    for (int i = 0; i < 32; ++i) pin(s[i]);
    if (next) {
      softmax(it + 1, s, pn, a0, a1);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) pin(o[i]);
#pragma unroll
    for (int i = 0; i < 16; ++i) pin(pa[i]);
    if (next) {
#pragma unroll
      for (int n = 0; n < 16; ++n) {
        o[4 * n] *= a0;
        o[4 * n + 1] *= a0;
        o[4 * n + 2] *= a1;
        o[4 * n + 3] *= a1;
      }
#pragma unroll
      for (int i = 0; i < 16; ++i) pa[i] = pn[i];
    }
  }
  cp_wait<0>();

  if (qt >= q_tiles) return;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  T* out = static_cast<T*>(p.o) + h * p.o_head_stride;
  const int r0 = qt * kTile + warp * 16 + g, r1 = r0 + 8;
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    const int col = n * 8 + t4 * 2;
    if (r0 < p.q_rows)
      *reinterpret_cast<uint32_t*>(out + int64_t(r0) * p.o_row_stride + col) = pack2<T>(o[4 * n] * i0, o[4 * n + 1] * i0);
    if (r1 < p.q_rows)
      *reinterpret_cast<uint32_t*>(out + int64_t(r1) * p.o_row_stride + col) =
          pack2<T>(o[4 * n + 2] * i1, o[4 * n + 3] * i1);
  }
#endif
}

// Never launched: the sm_90a image has static shared memory, any other none, so its
// attributes tell which image the device loaded.
__global__ void sm90a_probe(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ int mark[32];
  mark[threadIdx.x & 31] = int(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = mark[(threadIdx.x + 1) & 31];
#endif
}

template <int WG, typename T>
cudaError_t launch(const Int8AttnParams& p, cudaStream_t stream) {
  constexpr int bytes = smem_bytes<WG>();
  cudaError_t e = cudaFuncSetAttribute(attention_sm90<WG, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  const dim3 grid((attn_tiles(p.q_rows) + WG - 1) / WG, p.heads);
  attention_sm90<WG, T><<<grid, WG * 128, bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

bool int8_attention_sm90_ready() {
  constexpr int kDevices = 64;
  static std::atomic<int> state[kDevices];  // 0 unknown, 1 ready, 2 not
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kDevices) return false;
  int s = state[dev].load(std::memory_order_relaxed);
  if (s == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaFuncAttributes a{};
    const bool image = major == 9 && minor == 0 && cudaFuncGetAttributes(&a, sm90a_probe) == cudaSuccess &&
                       a.sharedSizeBytes > 0;
    cudaGetLastError();  // a missing image is an answer, not an error to keep
    s = image ? 1 : 2;
    state[dev].store(s, std::memory_order_relaxed);
  }
  return s == 1;
}

cudaError_t int8_attention_sm90(const Int8AttnParams& p, cudaStream_t stream) {
  if (p.head_dim != kD || !int8_attention_sm90_ready()) return cudaErrorNotSupported;
  const bool bf16 = p.type == Elem::BF16;
  if (p.offsets) return bf16 ? launch<1, __nv_bfloat16>(p, stream) : launch<1, __half>(p, stream);
  return bf16 ? launch<2, __nv_bfloat16>(p, stream) : launch<2, __half>(p, stream);
}

}  // namespace sp::kernels
