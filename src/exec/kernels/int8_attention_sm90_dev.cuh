// Device pieces of the sm_90a int8 attention kernels (int8_attention_sm90_ws.cu): wgmma
// descriptors and wrappers, the online and bounded softmax of a step, P·V, the
// Q fragments, the output rows, and the mbarrier / bulk tensor copy (TMA) wrappers. Everything
// past the constants exists only in the sm_90a image (__CUDA_ARCH_FEAT_SM90_ALL).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#ifdef SP_ATTN_WATCHDOG
#include <cstdio>
#endif

#include "exec/kernels/attn_ptx.cuh"
#include "exec/kernels/int8_attention_sm90.cuh"

namespace sp::kernels::sm90 {

using attn::ex2;
using attn::pack2;
using attn::smem_addr;

constexpr int kTile = kAttnTile;  // 64 query rows per warpgroup, 64 keys per tile
constexpr int kD = 128;           // head_dim: one int8 row is one 128-byte swizzle row
constexpr int kQBytes = kTile * kD;      // int8
constexpr int kKBytes = kTile * kD;      // int8
constexpr int kVBytes = kTile * kD * 2;  // 16-bit, two 64-column halves of 8 KiB

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Shared-memory matrix descriptor, 128-byte swizzle; offsets in bytes.
__device__ __forceinline__ uint64_t sw128_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint64_t a = smem_addr(p);
  return ((a & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Orders the compiler's uses of an asynchronous operand after the wait that completes it.
template <typename R>
__device__ __forceinline__ void pin(R& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void pin(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// The 64 accumulator registers of an m64n128 wgmma: their operand numbers in the instruction
// text, and the operand list (constraint c, array d).
#define SP_ACC64_REGS                                                                              \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "               \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "               \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SP_ACC8(c, d, i) \
  c(d[i]), c(d[i + 1]), c(d[i + 2]), c(d[i + 3]), c(d[i + 4]), c(d[i + 5]), c(d[i + 6]), c(d[i + 7])
#define SP_ACC64(c, d)                                                                             \
  SP_ACC8(c, d, 0), SP_ACC8(c, d, 8), SP_ACC8(c, d, 16), SP_ACC8(c, d, 24), SP_ACC8(c, d, 32),      \
      SP_ACC8(c, d, 40), SP_ACC8(c, d, 48), SP_ACC8(c, d, 56)

// D[64xN] (+)= A[64x32] * B[32xN], s8 x s8 -> s32, A and B in shared memory (K-major).
template <int N>
__device__ __forceinline__ void wgmma_s8(int (&d)[N / 2], uint64_t a, uint64_t b, int accumulate);
template <>
__device__ __forceinline__ void wgmma_s8<128>(int (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
      SP_ACC64_REGS
      "}, %64, %65, p;\n}\n"
      : SP_ACC64("+r", d)
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
      SP_ACC64_REGS
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : SP_ACC64("+f", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_pv<__half>(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      SP_ACC64_REGS
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : SP_ACC64("+f", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// D[64xN] (+)= A[64x32] * B[32xN], s8 x s8 -> s32, A in registers (each warp's 16 rows: rows
// g and g+8, bytes 4 t4 .. 4 t4 + 3 and 16 + 4 t4 ..), B in shared memory (K-major).
template <int N>
__device__ __forceinline__ void wgmma_s8_ra(int (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, int accumulate);
template <>
__device__ __forceinline__ void wgmma_s8_ra<128>(int (&d)[64], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
      SP_ACC64_REGS
      "}, {%64, %65, %66, %67}, %68, p;\n}\n"
      : SP_ACC64("+r", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// The online softmax state of a thread's two rows (g and g + 8 of its warp's 16).
struct RowState {
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
};

// A step's int32 products x read as the floats 1.5 * 2^23 + x (exact: |x| <= 127 * 127 * 128 <
// 2^22), an add instead of a conversion; keys past kv_rows and tiles past the list (ids[b] < 0)
// masked to -inf.
template <int NT>
__device__ __forceinline__ void step_scores(const int (&ids)[NT], int kv_rows, int t4, const int (&s)[32 * NT],
                                            float (&f)[32 * NT]) {
#pragma unroll
  for (int i = 0; i < 32 * NT; ++i) f[i] = __int_as_float(s[i] + 0x4B400000);
#pragma unroll
  for (int b = 0; b < NT; ++b) {
    const int valid = ids[b] >= 0 ? kv_rows - ids[b] * kTile : 0;
    if (valid < kTile) {  // the last tile: keys past kv_rows; a step past the list: all
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if ((i >> 2) * 8 + t4 * 2 + (i & 1) >= valid) f[32 * b + i] = -INFINITY;
    }
  }
}
constexpr float kScoreOffset = 12582912.0f;  // the 1.5 * 2^23 of step_scores

// P = 2^(x * sc - base) of rows g (base0) and g + 8 (base1) into pn, in the A-fragment order of
// P·V; their sums into s0, s1. The offset of step_scores folds into the fma, whose only rounding
// beyond the product is that of the per-row constant.
template <int NT, typename T>
__device__ __forceinline__ void step_exp(const float (&f)[32 * NT], const float (&sc)[NT], float base0, float base1,
                                         uint32_t (&pn)[16 * NT], float& s0, float& s1) {
  s0 = 0.0f;
  s1 = 0.0f;
#pragma unroll
  for (int j = 0; j < 8 * NT; ++j) {
    const float c = sc[j / 8], n0 = -fmaf(kScoreOffset, c, base0), n1 = -fmaf(kScoreOffset, c, base1);
    const float e0 = ex2(fmaf(f[4 * j], c, n0)), e1 = ex2(fmaf(f[4 * j + 1], c, n0));
    const float e2 = ex2(fmaf(f[4 * j + 2], c, n1)), e3 = ex2(fmaf(f[4 * j + 3], c, n1));
    s0 += e0 + e1;
    s1 += e2 + e3;
    // n-tiles 2kk and 2kk+1 of S are the A fragment of k-step kk: (g, 2kk), (g+8, 2kk),
    // (g, 2kk+1), (g+8, 2kk+1).
    pn[(j >> 1) * 4 + (j & 1) * 2 + 0] = pack2<T>(e0, e1);
    pn[(j >> 1) * 4 + (j & 1) * 2 + 1] = pack2<T>(e2, e3);
  }
}

// The online softmax of one step of NT key tiles from its (completed) S: new maxima, the
// factors a0, a1 that rescale the old sums and outputs, P into pn. The maxima are taken on the
// floats of step_scores (the scales are positive).
template <int NT, typename T>
__device__ __forceinline__ void online_softmax(RowState& st, const int (&ids)[NT], const float (&sc)[NT],
                                               int kv_rows, int t4, const int (&s)[32 * NT],
                                               uint32_t (&pn)[16 * NT], float& a0, float& a1) {
  float f[32 * NT];
  step_scores<NT>(ids, kv_rows, t4, s, f);
  float mx0 = st.m0, mx1 = st.m1;
#pragma unroll
  for (int b = 0; b < NT; ++b) {
    const float* fb = f + 32 * b;
    // The maxima of the 16 values of each row as a tree (4 dependent steps, not 9).
    float t0[8], t1[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      t0[i] = fmaxf(fb[4 * i], fb[4 * i + 1]);
      t1[i] = fmaxf(fb[4 * i + 2], fb[4 * i + 3]);
    }
#pragma unroll
    for (int w = 4; w > 0; w /= 2)
#pragma unroll
      for (int i = 0; i < w; ++i) {
        t0[i] = fmaxf(t0[i], t0[i + w]);
        t1[i] = fmaxf(t1[i], t1[i + w]);
      }
    mx0 = fmaxf(mx0, (t0[0] - kScoreOffset) * sc[b]);
    mx1 = fmaxf(mx1, (t1[0] - kScoreOffset) * sc[b]);
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float base0 = mx0 == -INFINITY ? 0.0f : mx0, base1 = mx1 == -INFINITY ? 0.0f : mx1;
  a0 = ex2(st.m0 - base0);
  a1 = ex2(st.m1 - base1);
  st.m0 = mx0;
  st.m1 = mx1;
  float s0, s1;
  step_exp<NT, T>(f, sc, base0, base1, pn, s0, s1);
  st.l0 = st.l0 * a0 + s0;
  st.l1 = st.l1 * a1 + s1;
}

// The bounded softmax. Every score of a query row lies below its Cauchy-Schwarz bound
// |q| * max |k| over the int8 rows (in the scales' log2 domain: k_norm holds the head's largest
// k_scale * row norm), so the row's exponent offset can be fixed before its first key at
// the bound less kBoundHeadroom: no maxima, no rescaling, P <= 2^64 (bf16 and fp32 hold it; fp16
// would not, so fp16 keeps the online softmax). The result is the online softmax's up to
// rounding as long as the row's largest term 2^(max - offset) is not far below 1; a row whose
// sum ends under kBoundLeast, or whose output is not finite, is flagged in `check`, and its tile
// recomputed with the online softmax (SoftmaxPass::Redo). That takes scores more than
// 64 + 64 log2 units (89 in natural log) below their bound.
constexpr float kBoundHeadroom = 64.0f;
constexpr float kBoundLeast = 0x1p-64f;

// The fixed offsets of rows g and g + 8 from their int8 Q fragments (load_q_fragments' layout:
// the quad's four threads hold 32 bytes of each row).
__device__ __forceinline__ RowState bounded_state(const uint32_t (&qa)[16], float q_scale, float k_bound) {
  int s0 = 0, s1 = 0;
#pragma unroll
  for (int i = 0; i < 16; i += 2) {
    s0 = __dp4a(int(qa[i]), int(qa[i]), s0);
    s1 = __dp4a(int(qa[i + 1]), int(qa[i + 1]), s1);
  }
  s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
  s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
  s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
  s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
  RowState st;
  st.m0 = sqrtf(float(s0)) * q_scale * k_bound - kBoundHeadroom;
  st.m1 = sqrtf(float(s1)) * q_scale * k_bound - kBoundHeadroom;
  return st;
}

// One step of the bounded softmax: P against the fixed offsets st.m0, st.m1 into pn, the sums
// into st.l0, st.l1 (online_softmax without the maxima).
template <int NT, typename T>
__device__ __forceinline__ void bounded_softmax(RowState& st, const int (&ids)[NT], const float (&sc)[NT],
                                                int kv_rows, int t4, const int (&s)[32 * NT],
                                                uint32_t (&pn)[16 * NT]) {
  float f[32 * NT];
  step_scores<NT>(ids, kv_rows, t4, s, f);
  float s0, s1;
  step_exp<NT, T>(f, sc, st.m0, st.m1, pn, s0, s1);
  st.l0 += s0;
  st.l1 += s1;
}

// The softmax of a step, bounded or online; a0, a1 the factors for rescale_step.
template <bool Bounded, int NT, typename T>
__device__ __forceinline__ void softmax_step(RowState& st, const int (&ids)[NT], const float (&sc)[NT], int kv_rows,
                                             int t4, const int (&s)[32 * NT], uint32_t (&pn)[16 * NT], float& a0,
                                             float& a1) {
  if constexpr (Bounded) {
    bounded_softmax<NT, T>(st, ids, sc, kv_rows, t4, s, pn);
    a0 = a1 = 1.0f;
  } else {
    online_softmax<NT, T>(st, ids, sc, kv_rows, t4, s, pn, a0, a1);
  }
}

// O = O * a (rows g, g + 8), skipped when no row of the warp changed its maximum.
__device__ __forceinline__ void rescale(float (&o)[64], float a0, float a1) {
  if (__any_sync(0xffffffffu, a0 != 1.0f || a1 != 1.0f)) {
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      o[4 * n] *= a0;
      o[4 * n + 1] *= a0;
      o[4 * n + 2] *= a1;
      o[4 * n + 3] *= a1;
    }
  }
}

template <bool Bounded>
__device__ __forceinline__ void rescale_step(float (&o)[64], float a0, float a1) {
  if constexpr (!Bounded) rescale(o, a0, a1);
}

// Redo pass: whether the bounded pass flagged any of query tiles [first, first + n) of head h.
__device__ __forceinline__ bool flagged(const uint8_t* check, int h, int q_tiles, int first, int n) {
  bool any = false;
  for (int i = 0; i < n; ++i)
    if (first + i < q_tiles) any |= reinterpret_cast<const uint32_t*>(check)[int64_t(h) * q_tiles + first + i] != 0;
  return any;
}
// Whether a CTA of query tiles [first, first + n) of head h has nothing to do in this pass: the
// Redo pass skips CTAs with no flagged tile; the Bounded pass those whose every tile arrived
// flagged (Int8AttnParams::check filled before it: bounds too loose to try), left to Redo.
template <bool Bounded>
__device__ __forceinline__ bool skip_cta(const uint8_t* check, int redo, int h, int q_tiles, int first, int n) {
  if constexpr (Bounded) {
    bool all = true;
    for (int i = 0; i < n; ++i)
      if (first + i < q_tiles) all &= reinterpret_cast<const uint32_t*>(check)[int64_t(h) * q_tiles + first + i] != 0;
    return all;
  }
  return redo && !flagged(check, h, q_tiles, first, n);
}

// O += P V for NT key tiles of V at vs (each [64 keys][128] as two 64-column halves).
template <int NT, typename T>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pc)[16 * NT], const unsigned char* vs) {
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 4 * NT; ++k) {
    const uint32_t a[4] = {pc[4 * k], pc[4 * k + 1], pc[4 * k + 2], pc[4 * k + 3]};
    wgmma_pv<T>(o, a, sw128_desc(vs + (k >> 2) * kVBytes + (k & 3) * 16 * 128, kVBytes / 2, 1024));
  }
  wgmma_commit();
}

// Q of a warp's 16 rows of query tile qt as the A fragments of QK^T's 4 k-steps of 32 (zero
// past the last tile).
__device__ __forceinline__ void load_q_fragments(const Int8AttnParams& p, int h, int q_tiles, int qt, int warp,
                                                 int g, int t4, uint32_t (&qa)[16]) {
  const int8_t* qrow = p.q + ((int64_t(h) * q_tiles + qt) * kTile + warp * 16 + g) * kD + t4 * 4;
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int j = 0; j < 4; ++j)  // rows g, g+8, g, g+8; bytes 4 t4 and 16 + 4 t4 of the k-step
      qa[4 * k + j] = qt < q_tiles ? __ldg(reinterpret_cast<const uint32_t*>(qrow + (j & 1) * 8 * kD + k * 32 +
                                                                              (j >> 1) * 16))
                                   : 0u;
}

// The normalized rows of a 64-row query tile into o (rows past q_rows not written). With
// `check` (the bounded pass), the warp's byte of it says whether one of its rows must be redone
// (never where the tile visited no key: an empty list's rows are zero either way).
template <typename T>
__device__ __forceinline__ void store_rows(const Int8AttnParams& p, int h, int qt, int warp, int g, int t4,
                                           RowState st, const float (&o)[64], uint8_t* check = nullptr,
                                           bool visited = true) {
  st.l0 += __shfl_xor_sync(0xffffffffu, st.l0, 1);
  st.l0 += __shfl_xor_sync(0xffffffffu, st.l0, 2);
  st.l1 += __shfl_xor_sync(0xffffffffu, st.l1, 1);
  st.l1 += __shfl_xor_sync(0xffffffffu, st.l1, 2);
  const float i0 = st.l0 > 0.0f ? 1.0f / st.l0 : 0.0f, i1 = st.l1 > 0.0f ? 1.0f / st.l1 : 0.0f;
  T* out = static_cast<T*>(p.o) + h * p.o_head_stride;
  const int r0 = qt * kTile + warp * 16 + g, r1 = r0 + 8;
  float z0 = 0.0f, z1 = 0.0f;  // 0 while every output is finite, else NaN
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    const int col = n * 8 + t4 * 2;
    const float x0 = o[4 * n] * i0, x1 = o[4 * n + 1] * i0, x2 = o[4 * n + 2] * i1, x3 = o[4 * n + 3] * i1;
    z0 += x0 * 0.0f + x1 * 0.0f;
    z1 += x2 * 0.0f + x3 * 0.0f;
    if (r0 < p.q_rows) *reinterpret_cast<uint32_t*>(out + int64_t(r0) * p.o_row_stride + col) = pack2<T>(x0, x1);
    if (r1 < p.q_rows) *reinterpret_cast<uint32_t*>(out + int64_t(r1) * p.o_row_stride + col) = pack2<T>(x2, x3);
  }
  if (check) {
    const bool bad = visited && ((r0 < p.q_rows && !(st.l0 >= kBoundLeast && st.l0 < INFINITY && z0 == 0.0f)) ||
                                 (r1 < p.q_rows && !(st.l1 >= kBoundLeast && st.l1 < INFINITY && z1 == 0.0f)));
    const bool any = __any_sync(0xffffffffu, bad);
    if ((threadIdx.x & 31) == 0) check[(int64_t(h) * ((p.q_rows + kTile - 1) / kTile) + qt) * 4 + warp] = any;
  }
}


// mbarriers (shared::cta) and the bulk tensor copy engine. A wait spins on try_wait (which
// itself suspends for a while) until the phase of the given parity has completed.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the async proxy (the copy engine) too.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Built with SP_ATTN_WATCHDOG (tests), a wait of more than about 2^32 cycles traps.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
#ifdef SP_ATTN_WATCHDOG
  const long long t0 = clock64();
#endif
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
#ifdef SP_ATTN_WATCHDOG
    if (!done && clock64() - t0 > (1ll << 32)) {
      printf("mbarrier wait timed out: block (%d, %d) thread %d barrier %u parity %u\n", int(blockIdx.x),
             int(blockIdx.y), int(threadIdx.x), bar, parity);
      __trap();
    }
#endif
  } while (!done);
}
// A box of a 2D / 3D tensor map (coordinates in elements, innermost first) into shared memory
// at dst, completing `bytes of the box` on bar; elements outside the tensor are zero-filled.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// Named barrier among `threads` threads (ids 1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace sp::kernels::sm90
