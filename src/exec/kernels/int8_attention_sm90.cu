// The sm_90a path of int8_attention (see int8_attention.cuh for the design): wgmma instead of
// mma.sync, head_dim 128. Compiled for sm_90a only; on any other architecture the kernels are
// empty and int8_attention_sm90_ready() is false, so int8_attention keeps the portable path.
#include "exec/kernels/int8_attention_sm90.cuh"

#include <atomic>

#include "exec/kernels/attn_ptx.cuh"
#include "exec/kernels/int8_attention_sm90_dev.cuh"
#include "exec/kernels/int8_attention_sm90_ws.cuh"

namespace sp::kernels {

namespace {

using namespace attn;
using namespace sm90;

// A configuration: WG warpgroups of 64 query rows share each step's NT key tiles (QK^T is one
// m64n(64 NT)k32 chain, P·V 4 NT k-steps); Stages steps of K/V in flight.
template <int WG, int NT, int Stages>
struct Cfg {
  static constexpr int kThreads = WG * 128;
  static constexpr int kStageBytes = NT * (kKBytes + kVBytes);  // NT K tiles, then NT V tiles
  static constexpr int kSmem = WG * kQBytes + Stages * kStageBytes + 1024;  // + alignment
};

// One CTA: WG warpgroups, each 64 query rows (query tiles blockIdx.x * WG + wg), sharing the
// key tiles of the CTA's list, NT of them per step. Dense runs WG = 2 (the K/V tiles read once
// per 128 query rows), the block-sparse path WG = 1 (one list per 64-row query tile).
template <int WG, int NT, int Stages, bool Bounded, typename T>
__global__ void __launch_bounds__(Cfg<WG, NT, Stages>::kThreads, WG == 1 ? 2 : 1)
    attention_sm90(Int8AttnParams p, int redo) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Cfg<WG, NT, Stages>;
  constexpr int kN = 64 * NT;  // keys per step
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // swizzle atoms are 1024-byte aligned
  const int tid = threadIdx.x, wg = tid >> 7;
  const int warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.y;
  const int q_tiles = (p.q_rows + kTile - 1) / kTile, kv_tiles = (p.kv_rows + kTile - 1) / kTile;
  const int qt = blockIdx.x * WG + wg;
  if (skip_cta<Bounded>(p.check, redo, h, q_tiles, int(blockIdx.x) * WG, WG)) return;  // the whole CTA

  int count = kv_tiles;
  const int32_t* list = nullptr;
  if (p.offsets) {  // WG == 1
    const int begin = p.offsets[int64_t(h) * q_tiles + blockIdx.x];
    count = p.offsets[int64_t(h) * q_tiles + blockIdx.x + 1] - begin;
    list = p.indices + begin;
  }
  const int steps = (count + NT - 1) / NT;
  auto tile_at = [&](int j) { return j < count ? (list ? list[j] : j) : -1; };  // -1: past the list
  unsigned char* qs = smem + wg * kQBytes;
  unsigned char* stages = smem + WG * kQBytes;

  // Each thread's share of a step's loads: K rows of 128 bytes in 16-byte chunks, V rows of
  // 16 chunks (two 64-column halves); the chunk of a thread is the same in every row group.
  constexpr int kKRows = C::kThreads / 8, kVRows = C::kThreads / 16;  // rows per pass
  const int k_row = tid >> 3, k_chunk = tid & 7, v_row = tid >> 4, v_chunk = tid & 15;
  const int k_smem = sw128(k_row, k_chunk);
  const int v_smem = (v_chunk >> 3) * (kVBytes / 2) + sw128(v_row, v_chunk & 7);
  const int8_t* kbase = p.k + int64_t(h) * kv_tiles * kTile * kD + k_row * kD + k_chunk * 16;
  const T* vbase = static_cast<const T*>(p.v) + h * p.v_head_stride;
  // K tiles: 64 rows of 128 bytes, swizzled, NT of them contiguous. V tiles: two 64-column
  // halves, each 64 rows of 128 bytes, swizzled (N-major B operand); rows past kv_rows and
  // tiles past the list zero-filled (their keys are masked).
  const int64_t v_pass = int64_t(kVRows) * p.v_row_stride;  // elements between a thread's V rows
  const uint32_t stages_s = smem_addr(stages);
  auto load_step = [&](int step, const int (&ids)[NT]) {
    const uint32_t ks = stages_s + (step % Stages) * C::kStageBytes + k_smem;
    const uint32_t vs = stages_s + (step % Stages) * C::kStageBytes + NT * kKBytes + v_smem;
#pragma unroll
    for (int b = 0; b < NT; ++b) {
      const bool present = ids[b] >= 0;
      const int tile = present ? ids[b] : 0;
      const int8_t* kg = kbase + int64_t(tile) * kTile * kD;
#pragma unroll
      for (int n = 0; n < kTile / kKRows; ++n)
        cp_async16(ks + b * kKBytes + n * kKRows * 128, kg + n * kKRows * kD, present);
      const int rows = present ? min(kTile, p.kv_rows - tile * kTile) - v_row : 0;  // this thread's rows
      const T* vg = vbase + (int64_t(tile) * kTile + v_row) * p.v_row_stride + v_chunk * 8;
#pragma unroll
      for (int n = 0; n < kTile / kVRows; ++n) {
        const bool ok = n * kVRows < rows;
        cp_async16(vs + b * kVBytes + n * kVRows * 128, ok ? vg + n * v_pass : vbase, ok);
      }
    }
  };

  // Q tiles (zero where the CTA's second tile is past the end) with the first K/V step.
  for (int i = tid; i < WG * kTile * 8; i += C::kThreads) {
    const int w = i / (kTile * 8), r = (i >> 3) & (kTile - 1), c = i & 7;
    const int t = blockIdx.x * WG + w;
    const bool ok = t < q_tiles;
    const int8_t* src = ok ? p.q + ((int64_t(h) * q_tiles + t) * kTile + r) * kD + c * 16 : p.q;
    cp_async16(smem + w * kQBytes + sw128(r, c), src, ok);
  }
  const float q_scale = qt < q_tiles ? p.q_scale[int64_t(h) * q_tiles + qt] : 0.0f;
  // Tile ids of the steps ahead: at the top of step it those of it+1 .. it+Stages-1, so that
  // neither the loads nor the scales wait on the list.
  int ring[Stages - 1][NT];
#pragma unroll
  for (int s = 0; s < Stages - 1; ++s) {
    int ids[NT];
#pragma unroll
    for (int b = 0; b < NT; ++b) ids[b] = tile_at(s * NT + b);
    if (s < steps) load_step(s, ids);
    cp_commit();
  }
#pragma unroll
  for (int s = 0; s < Stages - 1; ++s)
#pragma unroll
    for (int b = 0; b < NT; ++b) ring[s][b] = tile_at((s + 1) * NT + b);
  // The scales of a step's tiles, q_scale * k_scale (1 past the list).
  auto scales = [&](const int (&ids)[NT], float (&sc)[NT]) {
#pragma unroll
    for (int b = 0; b < NT; ++b) sc[b] = q_scale * (ids[b] >= 0 ? p.k_scale[int64_t(h) * kv_tiles + ids[b]] : 1.0f);
  };

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  RowState st;
  if constexpr (Bounded) {
    uint32_t qf[16];
    load_q_fragments(p, h, q_tiles, qt, warp, g, t4, qf);
    st = bounded_state(qf, q_scale, __ldg(p.k_norm + h));
  }
  // P of a step, bf16/fp16 pairs in the A-fragment order: steps alternate between the two.
  uint32_t pa[16 * NT], pb[16 * NT];

  // S = Q K^T of step `step` into s (issued, not waited).
  auto issue_qk = [&](int step, int (&s)[32 * NT]) {
    const unsigned char* ks = stages + (step % Stages) * C::kStageBytes;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kD / 32; ++k)
      wgmma_s8<kN>(s, sw128_desc(qs + k * 32, 16, 1024), sw128_desc(ks + k * 32, 16, 1024), k > 0);
    wgmma_commit();
  };
  if (steps > 0) {
    cp_wait<Stages - 2>();  // Q and the first K/V step
    fence_async_shared();
    __syncthreads();
    int ids[NT];
    float sc[NT];
#pragma unroll
    for (int b = 0; b < NT; ++b) ids[b] = tile_at(b);
    scales(ids, sc);
    int s[32 * NT];
    issue_qk(0, s);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32 * NT; ++i) pin(s[i]);
    float a0, a1;
    softmax_step<Bounded, NT, T>(st, ids, sc, p.kv_rows, t4, s, pa, a0, a1);
  }
  // Step it: P·V of step it (its P in pc) overlaps the softmax of step it+1 (into pn).
  auto run_step = [&](int it, uint32_t (&pc)[16 * NT], uint32_t (&pn)[16 * NT]) {
    // Step it+1 resident and every warpgroup past step it-1, whose buffer is refilled.
    cp_wait<Stages - 3>();
    fence_async_shared();
    __syncthreads();
    if (it + Stages - 1 < steps) load_step(it + Stages - 1, ring[Stages - 2]);
    cp_commit();
    const bool next = it + 1 < steps;
    int ids[NT];  // step it+1
    float sc[NT];
#pragma unroll
    for (int b = 0; b < NT; ++b) ids[b] = ring[0][b];
    scales(ids, sc);  // read while QK^T runs
#pragma unroll
    for (int s = 0; s < Stages - 2; ++s)
#pragma unroll
      for (int b = 0; b < NT; ++b) ring[s][b] = ring[s + 1][b];
#pragma unroll
    for (int b = 0; b < NT; ++b) ring[Stages - 2][b] = tile_at((it + Stages) * NT + b);  // used a step on
    int s[32 * NT];
    issue_qk(next ? it + 1 : it, s);  // unconditional: the waits below stay in step
    issue_pv<NT, T>(o, pc, stages + (it % Stages) * C::kStageBytes + NT * kKBytes);
    float a0 = 1.0f, a1 = 1.0f;
    wgmma_wait<1>();  // S of step it+1; P·V of step it still running
#pragma unroll
    for (int i = 0; i < 32 * NT; ++i) pin(s[i]);
    if (next) softmax_step<Bounded, NT, T>(st, ids, sc, p.kv_rows, t4, s, pn, a0, a1);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) pin(o[i]);
#pragma unroll
    for (int i = 0; i < 16 * NT; ++i) pin(pc[i]);
    if (next) rescale_step<Bounded>(o, a0, a1);  // most steps leave the maxima
  };
  for (int it = 0; it < steps; it += 2) {
    run_step(it, pa, pb);
    if (it + 1 < steps) run_step(it + 1, pb, pa);
  }
  cp_wait<0>();

  if (qt < q_tiles) store_rows<T>(p, h, qt, warp, g, t4, st, o, Bounded ? p.check : nullptr, steps > 0);
#endif
}

// The block-sparse kernel: one warpgroup per 64-row query tile and its own list, NT listed
// key tiles per step, two CTAs per SM. Q stays in registers (the A operand of QK^T), so shared
// memory holds only K and V, in rings of their own, each step's tiles loaded Ahead steps before
// their first use: at step it the K slots hold it+1 (QK^T now) .. it+Ahead+1 (loading), the V
// slots it (P·V now) .. it+Ahead (loading); one cp.async group per step carries K of
// it+Ahead+1 and V of it+Ahead.
template <int NT, int Ahead>
struct SparseCfg {
  static constexpr int kSlots = Ahead + 1;
  static constexpr int kKSlot = NT * kKBytes, kVSlot = NT * kVBytes;
  static constexpr int kSmem = kSlots * (kKSlot + kVSlot) + 1024;
};

template <int NT, int Ahead, bool Bounded, typename T>
__global__ void __launch_bounds__(128, 2) attention_sm90_sparse(Int8AttnParams p, int redo) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = SparseCfg<NT, Ahead>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* kslots = smem;
  unsigned char* vslots = smem + C::kSlots * C::kKSlot;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.y, qt = blockIdx.x;
  const int q_tiles = (p.q_rows + kTile - 1) / kTile, kv_tiles = (p.kv_rows + kTile - 1) / kTile;
  if (skip_cta<Bounded>(p.check, redo, h, q_tiles, qt, 1)) return;
  int count = kv_tiles;
  const int32_t* list = nullptr;
  if (p.offsets) {
    const int begin = p.offsets[int64_t(h) * q_tiles + qt];
    count = p.offsets[int64_t(h) * q_tiles + qt + 1] - begin;
    list = p.indices + begin;
  }
  const int steps = (count + NT - 1) / NT;
  auto tile_at = [&](int j) { return j < count ? (list ? list[j] : j) : -1; };  // -1: past the list

  uint32_t qa[16];
  load_q_fragments(p, h, q_tiles, qt, warp, g, t4, qa);
  const float q_scale = p.q_scale[int64_t(h) * q_tiles + qt];

  const int k_row = tid >> 3, k_chunk = tid & 7, v_row = tid >> 4, v_chunk = tid & 15;
  const uint32_t ks0 = smem_addr(kslots) + sw128(k_row, k_chunk);
  const uint32_t vs0 = smem_addr(vslots) + (v_chunk >> 3) * (kVBytes / 2) + sw128(v_row, v_chunk & 7);
  const int8_t* kbase = p.k + int64_t(h) * kv_tiles * kTile * kD + k_row * kD + k_chunk * 16;
  const T* vbase = static_cast<const T*>(p.v) + h * p.v_head_stride;
  const int64_t v_pass = int64_t(8) * p.v_row_stride;
  // A tile past the list is not loaded: its keys are masked and its P is zero, but its slot's
  // old V rows are finite (V tiles or zeros), so P·V adds nothing.
  auto load_k = [&](int step, const int (&id)[NT]) {
#pragma unroll
    for (int b = 0; b < NT; ++b) {
      if (id[b] < 0) continue;
      const uint32_t ks = ks0 + (step % C::kSlots) * C::kKSlot + b * kKBytes;
      const int8_t* kg = kbase + int64_t(id[b]) * kTile * kD;
#pragma unroll
      for (int n = 0; n < 4; ++n) cp_async16(ks + n * 16 * 128, kg + n * 16 * kD, true);
    }
  };
  auto load_v = [&](int step, const int (&id)[NT]) {  // rows past kv_rows zero-filled
#pragma unroll
    for (int b = 0; b < NT; ++b) {
      if (id[b] < 0) continue;
      const uint32_t vs = vs0 + (step % C::kSlots) * C::kVSlot + b * kVBytes;
      const int rows = min(kTile, p.kv_rows - id[b] * kTile) - v_row;
      const T* vg = vbase + (int64_t(id[b]) * kTile + v_row) * p.v_row_stride + v_chunk * 8;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const bool ok = n * 8 < rows;
        cp_async16(vs + n * 8 * 128, ok ? vg + n * v_pass : vbase, ok);
      }
    }
  };
  auto issue_qk = [&](int step, int (&s)[32 * NT]) {
    const unsigned char* ks = kslots + (step % C::kSlots) * C::kKSlot;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t a[4] = {qa[4 * k], qa[4 * k + 1], qa[4 * k + 2], qa[4 * k + 3]};
      wgmma_s8_ra<64 * NT>(s, a, sw128_desc(ks + k * 32, 16, 1024), k > 0);
    }
    wgmma_commit();
  };
  auto scales = [&](const int (&id)[NT], float (&sc)[NT]) {
#pragma unroll
    for (int b = 0; b < NT; ++b) sc[b] = q_scale * (id[b] >= 0 ? p.k_scale[int64_t(h) * kv_tiles + id[b]] : 1.0f);
  };

  // V slots never loaded hold zeros, so that the P·V of a step with tiles past the list is finite.
  for (int i = tid * 16; i < C::kSlots * C::kVSlot; i += 128 * 16)
    *reinterpret_cast<uint4*>(vslots + i) = make_uint4(0, 0, 0, 0);
  __syncthreads();  // before any cp.async into them
  // ids[i]: the tiles of step it + i at the top of step it.
  int ids[Ahead + 3][NT];
#pragma unroll
  for (int i = 0; i < Ahead + 3; ++i)
#pragma unroll
    for (int b = 0; b < NT; ++b) ids[i][b] = tile_at(i * NT + b);
  load_k(0, ids[0]);
#pragma unroll
  for (int i = 0; i < Ahead; ++i) {  // group i: K of i+1, V of i
    load_k(i + 1, ids[i + 1]);
    load_v(i, ids[i]);
    cp_commit();
  }

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  RowState st;
  if constexpr (Bounded)
    st = bounded_state(qa, q_scale, __ldg(p.k_norm + h));
  uint32_t pa[16 * NT], pb[16 * NT];
  float sc1[NT];  // of step it+1 at the top of step it
  scales(ids[1], sc1);
  if (steps > 0) {
    cp_wait<Ahead - 1>();  // K of step 0
    fence_async_shared();
    __syncthreads();
    float sc0[NT];
    scales(ids[0], sc0);
    int s[32 * NT];
    issue_qk(0, s);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32 * NT; ++i) pin(s[i]);
    float a0, a1;
    softmax_step<Bounded, NT, T>(st, ids[0], sc0, p.kv_rows, t4, s, pa, a0, a1);
  }
  // Step it: P·V of step it (its P in pc) overlaps the softmax of step it+1 (into pn).
  auto run_step = [&](int it, uint32_t (&pc)[16 * NT], uint32_t (&pn)[16 * NT]) {
    cp_wait<Ahead - 1>();  // K of it+1, V of it
    fence_async_shared();
    __syncthreads();  // and every thread past step it-1, whose K and V slots are refilled
    load_k(it + Ahead + 1, ids[Ahead + 1]);
    load_v(it + Ahead, ids[Ahead]);
    cp_commit();
    const bool next = it + 1 < steps;
    int s[32 * NT];
    issue_qk(next ? it + 1 : it, s);  // unconditional: the waits below stay in step
    issue_pv<NT, T>(o, pc, vslots + (it % C::kSlots) * C::kVSlot);
    float sc2[NT];
    scales(ids[2], sc2);  // read while QK^T runs, used a step on
    float a0 = 1.0f, a1 = 1.0f;
    wgmma_wait<1>();  // S of step it+1; P·V of step it still running
#pragma unroll
    for (int i = 0; i < 32 * NT; ++i) pin(s[i]);
    if (next) softmax_step<Bounded, NT, T>(st, ids[1], sc1, p.kv_rows, t4, s, pn, a0, a1);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) pin(o[i]);
#pragma unroll
    for (int i = 0; i < 16 * NT; ++i) pin(pc[i]);
    if (next) rescale_step<Bounded>(o, a0, a1);
#pragma unroll
    for (int i = 0; i < Ahead + 2; ++i)
#pragma unroll
      for (int b = 0; b < NT; ++b) ids[i][b] = ids[i + 1][b];
#pragma unroll
    for (int b = 0; b < NT; ++b) ids[Ahead + 2][b] = tile_at((it + Ahead + 3) * NT + b);
#pragma unroll
    for (int b = 0; b < NT; ++b) sc1[b] = sc2[b];
  };
  for (int it = 0; it < steps; it += 2) {
    run_step(it, pa, pb);
    if (it + 1 < steps) run_step(it + 1, pb, pa);
  }
  cp_wait<0>();
  store_rows<T>(p, h, qt, warp, g, t4, st, o, Bounded ? p.check : nullptr, steps > 0);
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

template <int WG, int NT, int Stages, bool Bounded, typename T>
cudaError_t launch(const Int8AttnParams& p, cudaStream_t stream, bool redo) {
  using C = Cfg<WG, NT, Stages>;
  auto* kernel = attention_sm90<WG, NT, Stages, Bounded, T>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
  if (e != cudaSuccess) return e;
  const dim3 grid((attn_tiles(p.q_rows) + WG - 1) / WG, p.heads);
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(p, int(redo));
  return cudaGetLastError();
}

// Dense: 128 query rows and 128 keys per step, 4 steps in flight (209 KiB, one CTA per SM).
// Block-sparse: two listed tiles (128 keys) per step, loaded a step ahead (97 KiB, two CTAs per
// SM). The variants measured against these: docs/kernels_measured.md.
template <bool Bounded, typename T>
cudaError_t launch_sparse(const Int8AttnParams& p, cudaStream_t stream, bool redo) {
  constexpr int NT = 2, Ahead = 1;
  auto* kernel = attention_sm90_sparse<NT, Ahead, Bounded, T>;
  constexpr int smem = SparseCfg<NT, Ahead>::kSmem;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  kernel<<<dim3(attn_tiles(p.q_rows), p.heads), 128, smem, stream>>>(p, int(redo));
  return cudaGetLastError();
}

template <bool Bounded, typename T>
cudaError_t launch_type(const Int8AttnParams& p, cudaStream_t stream, bool redo) {
  return p.offsets ? launch_sparse<Bounded, T>(p, stream, redo) : launch<2, 2, 4, Bounded, T>(p, stream, redo);
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

cudaError_t int8_attention_sm90_pass(const Int8AttnParams& p, cudaStream_t stream, Sm90Kernel kernel,
                                     SoftmaxPass pass) {
  if (p.head_dim != kD || !int8_attention_sm90_ready()) return cudaErrorNotSupported;
  if (kernel != Sm90Kernel::CpAsync) {  // an invalid pass: cudaErrorInvalidValue from either
    const cudaError_t e = int8_attention_sm90_ws(p, stream, {}, pass);
    if (e != cudaErrorNotSupported || kernel == Sm90Kernel::WarpSpecialized) return e;
  }
  Int8AttnParams p16 = p;  // the cp.async kernels run P·V in 16 bits
  p16.v8 = nullptr;
  return launch_pass(p16, pass, [&](auto bounded, auto type, bool redo) {
    return launch_type<decltype(bounded)::value, decltype(type)>(p16, stream, redo);
  });
}

cudaError_t int8_attention_sm90(const Int8AttnParams& p, cudaStream_t stream, Sm90Kernel kernel) {
  return run_softmax_passes(p, [&](SoftmaxPass pass) { return int8_attention_sm90_pass(p, stream, kernel, pass); });
}

cudaError_t int8_attention_sm90(const Int8AttnParams& p, cudaStream_t stream) {
  return int8_attention_sm90(p, stream, Sm90Kernel::Auto);
}

}  // namespace sp::kernels
