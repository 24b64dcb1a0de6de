// Warp-specialized sm_90a kernels of int8_attention, head_dim 128 (see int8_attention.cuh for
// the arithmetic). One CTA = a producer warpgroup, one warp of which loads K and V tiles by TMA
// into mbarrier-guarded rings (writing each step's tile ids and k scales into the slot),
// and WG consumer warpgroups of 64 query rows with no block barrier in the loop; the layout,
// barriers and configurations: docs/kernels_measured.md. The tensor maps are encoded with
// cuTensorMapEncodeTiled from the driver at run time (cudaGetDriverEntryPoint), so nothing
// links libcuda; where that or the alignment fails, int8_attention_sm90_ws says
// cudaErrorNotSupported and int8_attention runs the portable kernel.
#include "exec/kernels/int8_attention_sm90_ws.cuh"

#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes from the runtime

#include <type_traits>

#include "exec/kernels/int8_attention_sm90.cuh"
#include "exec/kernels/int8_attention_sm90_dev.cuh"

namespace sp::kernels {

namespace {

using namespace sm90;

// Shared memory of a CTA: V slots, K slots, Q (dense), then the mbarriers (K full, K empty,
// V full, V empty per slot, Q full) and each slot's tile ids and k scales.
template <int WG, int NT, int Stages>
struct WsCfg {
  static constexpr bool kQSmem = WG > 1;
  static constexpr int kThreads = (WG + 1) * 128;
  static constexpr int kKSlot = NT * kKBytes, kVSlot = NT * kVBytes;
  static constexpr int kVOff = 0;
  static constexpr int kKOff = kVOff + Stages * kVSlot;
  static constexpr int kQOff = kKOff + Stages * kKSlot;
  static constexpr int kBarOff = kQOff + (kQSmem ? WG * kQBytes : 0);
  static constexpr int kIdOff = kBarOff + (4 * Stages + 1) * 8;
  static constexpr int kScaleOff = kIdOff + Stages * NT * 4;
  static constexpr int kSmem = kScaleOff + Stages * NT * 4 + 1024;  // + alignment
  // Registers per thread after setmaxnreg: the producer's few, the rest to the consumers
  // (the CTAs of an SM share 64 K registers).
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = WG == 1 ? 232 : 240;
  static_assert(kSmem <= 227 * 1024, "shared memory");
};

template <int WG, int NT, int Stages, bool PingPong, bool Bounded, typename T>
__global__ void __launch_bounds__(WsCfg<WG, NT, Stages>::kThreads, WG == 1 ? 2 : 1)
    attention_sm90_ws(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_v, const Int8AttnParams p, int redo) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WsCfg<WG, NT, Stages>;
  static_assert(!PingPong || WG == 2, "ping-pong takes two consumer warpgroups");
  static_assert(!Bounded || sizeof(T) == 2, "bounded softmax: 16-bit P");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // swizzle atoms: 1024 B
  const uint32_t sbase = smem_addr(smem);
  const int tid = threadIdx.x, role = tid >> 7, lane = tid & 31;
  const int h = blockIdx.y;
  const int q_tiles = (p.q_rows + kTile - 1) / kTile, kv_tiles = (p.kv_rows + kTile - 1) / kTile;
  if (skip_cta<Bounded>(p.check, redo, h, q_tiles, int(blockIdx.x) * WG, WG)) return;  // the whole CTA
  int count = kv_tiles;
  const int32_t* list = nullptr;
  if (WG == 1 && p.offsets) {
    const int begin = p.offsets[int64_t(h) * q_tiles + blockIdx.x];
    count = p.offsets[int64_t(h) * q_tiles + blockIdx.x + 1] - begin;
    list = p.indices + begin;
  }
  const int steps = (count + NT - 1) / NT;
  auto k_full = [&](int slot) { return sbase + C::kBarOff + 8 * slot; };
  auto k_empty = [&](int slot) { return sbase + C::kBarOff + 8 * (Stages + slot); };
  auto v_full = [&](int slot) { return sbase + C::kBarOff + 8 * (2 * Stages + slot); };
  auto v_empty = [&](int slot) { return sbase + C::kBarOff + 8 * (3 * Stages + slot); };
  const uint32_t q_full = sbase + C::kBarOff + 8 * 4 * Stages;
  int* slot_ids = reinterpret_cast<int*>(smem + C::kIdOff);
  float* slot_scales = reinterpret_cast<float*>(smem + C::kScaleOff);

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < Stages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), 4 * WG);  // one arrival per consumer warp
      mbar_init(v_empty(s), 4 * WG);
    }
    mbar_init(q_full, 1);
    mbar_init_fence();
  }
  // V slots zeroed: a slot of a tile past the list keeps finite values (its P is zero).
  for (int i = tid * 16; i < Stages * C::kVSlot; i += C::kThreads * 16)
    *reinterpret_cast<uint4*>(smem + C::kVOff + i) = make_uint4(0, 0, 0, 0);
  fence_async_shared();  // before the copy engine writes them
  __syncthreads();

  if (role == 0) {
    // ---------------- producer ----------------
    setmaxnreg_dec<C::kProducerRegs>();
    if (tid >= 32) return;
    if (lane == 0) {
      tma_prefetch_map(&tm_k);
      tma_prefetch_map(&tm_v);
      if constexpr (C::kQSmem) {
        tma_prefetch_map(&tm_q);
        mbar_arrive_expect_tx(q_full, WG * kQBytes);
#pragma unroll
        for (int w = 0; w < WG; ++w)  // a tile past the end: the next head's or zeros, never stored
          tma_load_2d(sbase + C::kQOff + w * kQBytes, &tm_q, q_full, 0,
                      (h * q_tiles + int(blockIdx.x) * WG + w) * kTile);
      }
    }
    const float* kscale = p.k_scale + int64_t(h) * kv_tiles;
    int chunk_base = -1, chunk_id = -1;  // the list read 32 entries at a time, one per lane
    float chunk_scale = 1.0f;
    for (int s = 0; s < steps; ++s) {
      const int slot = s % Stages;
      const uint32_t parity = ((s / Stages) & 1) ^ 1;  // the previous use of the slot released
      int ids[NT];
      float ks[NT];
#pragma unroll
      for (int b = 0; b < NT; ++b) {
        const int j = s * NT + b;
        if (list) {
          if ((j & ~31) != chunk_base) {
            chunk_base = j & ~31;
            chunk_id = chunk_base + lane < count ? list[chunk_base + lane] : -1;
            chunk_scale = chunk_id >= 0 ? kscale[chunk_id] : 1.0f;
          }
          ids[b] = __shfl_sync(0xffffffffu, chunk_id, j & 31);
          ks[b] = __shfl_sync(0xffffffffu, chunk_scale, j & 31);
        } else {
          ids[b] = j < count ? j : -1;
          ks[b] = ids[b] >= 0 && lane == 0 ? kscale[ids[b]] : 1.0f;
        }
      }
      if (lane == 0) {
        int present = 0;
#pragma unroll
        for (int b = 0; b < NT; ++b) present += ids[b] >= 0;
        if (s >= Stages) mbar_wait(k_empty(slot), parity);
#pragma unroll
        for (int b = 0; b < NT; ++b) {
          slot_ids[slot * NT + b] = ids[b];
          slot_scales[slot * NT + b] = ks[b];
        }
        mbar_arrive_expect_tx(k_full(slot), present * kKBytes);  // releases the ids and scales too
        const uint32_t kdst = sbase + C::kKOff + slot * C::kKSlot;
#pragma unroll
        for (int b = 0; b < NT; ++b)
          if (ids[b] >= 0) tma_load_2d(kdst + b * kKBytes, &tm_k, k_full(slot), 0, (h * kv_tiles + ids[b]) * kTile);
        if (s >= Stages) mbar_wait(v_empty(slot), parity);
        mbar_arrive_expect_tx(v_full(slot), present * kVBytes);
        const uint32_t vdst = sbase + C::kVOff + slot * C::kVSlot;
#pragma unroll
        for (int b = 0; b < NT; ++b)
          if (ids[b] >= 0) {
            tma_load_3d(vdst + b * kVBytes, &tm_v, v_full(slot), 0, ids[b] * kTile, h);
            tma_load_3d(vdst + b * kVBytes + kVBytes / 2, &tm_v, v_full(slot), 64, ids[b] * kTile, h);
          }
      }
      __syncwarp();
    }
    return;
  }

  // ---------------- consumers ----------------
  setmaxnreg_inc<C::kConsumerRegs>();
  const int wg = role - 1, warp = (tid >> 5) & 3, g = lane >> 2, t4 = lane & 3;
  const int qt = int(blockIdx.x) * WG + wg;
  const float q_scale = qt < q_tiles ? p.q_scale[int64_t(h) * q_tiles + qt] : 0.0f;
  uint32_t qa[16];
  if constexpr (!C::kQSmem) load_q_fragments(p, h, q_tiles, qt, warp, g, t4, qa);
  const unsigned char* qs = smem + C::kQOff + wg * kQBytes;
  RowState st;
  if constexpr (Bounded) {
    const float k_bound = __ldg(p.k_norm + h);
    if constexpr (C::kQSmem) {
      uint32_t qf[16];
      load_q_fragments(p, h, q_tiles, qt, warp, g, t4, qf);
      st = bounded_state(qf, q_scale, k_bound);
    } else {
      st = bounded_state(qa, q_scale, k_bound);
    }
  }

  // S = Q K^T of the K tiles in slot (issued, not waited).
  auto issue_qk = [&](int slot, int (&s)[32 * NT]) {
    const unsigned char* ks = smem + C::kKOff + slot * C::kKSlot;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kD / 32; ++k) {
      if constexpr (C::kQSmem) {
        wgmma_s8<64 * NT>(s, sw128_desc(qs + k * 32, 16, 1024), sw128_desc(ks + k * 32, 16, 1024), k > 0);
      } else {
        const uint32_t a[4] = {qa[4 * k], qa[4 * k + 1], qa[4 * k + 2], qa[4 * k + 3]};
        wgmma_s8_ra<64 * NT>(s, a, sw128_desc(ks + k * 32, 16, 1024), k > 0);
      }
    }
    wgmma_commit();
  };
  // The tile ids of the step in slot and their scales q_scale * k_scale (1 past the list).
  auto read_slot = [&](int slot, int (&ids)[NT], float (&sc)[NT]) {
#pragma unroll
    for (int b = 0; b < NT; ++b) {
      ids[b] = slot_ids[slot * NT + b];
      sc[b] = q_scale * slot_scales[slot * NT + b];
    }
  };
  auto release = [&](uint32_t bar) {
    if (lane == 0) mbar_arrive(bar);
  };
  // Ping-pong: a warpgroup issues its wgmma only after the other one issued its previous ones.
  auto turn_begin = [&]() {
    if constexpr (PingPong) named_sync(1 + wg, 256);
  };
  auto turn_end = [&]() {
    if constexpr (PingPong) named_arrive(1 + (wg ^ 1), 256);
  };

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  // P of a step, 16-bit pairs in the A-fragment order: steps alternate between the two.
  uint32_t pa[16 * NT], pb[16 * NT];

  if (steps > 0) {
    if constexpr (C::kQSmem) mbar_wait(q_full, 0);
    if (PingPong && wg == 1) named_arrive(1, 256);  // warpgroup 0 issues first
    mbar_wait(k_full(0), 0);
    int ids[NT];
    float sc[NT];
    read_slot(0, ids, sc);
    int s[32 * NT];
    turn_begin();
    issue_qk(0, s);
    turn_end();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32 * NT; ++i) pin(s[i]);
    release(k_empty(0));
    float a0, a1;
    softmax_step<Bounded, NT, T>(st, ids, sc, p.kv_rows, t4, s, pa, a0, a1);
  }
  // Step it (it + 1 < steps): P·V of step it (its P in pc) overlaps the softmax of it+1 (into pn).
  auto run_step = [&](int it, uint32_t (&pc)[16 * NT], uint32_t (&pn)[16 * NT]) {
    const int cs = it % Stages, ns = (it + 1) % Stages;
    mbar_wait(k_full(ns), ((it + 1) / Stages) & 1);
    int ids[NT];
    float sc[NT];
    read_slot(ns, ids, sc);
    mbar_wait(v_full(cs), (it / Stages) & 1);
    int s[32 * NT];
    turn_begin();
    issue_qk(ns, s);
    issue_pv<NT, T>(o, pc, smem + C::kVOff + cs * C::kVSlot);
    turn_end();
    wgmma_wait<1>();  // S of step it+1; P·V of step it still running
#pragma unroll
    for (int i = 0; i < 32 * NT; ++i) pin(s[i]);
    release(k_empty(ns));
    float a0, a1;
    softmax_step<Bounded, NT, T>(st, ids, sc, p.kv_rows, t4, s, pn, a0, a1);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) pin(o[i]);
#pragma unroll
    for (int i = 0; i < 16 * NT; ++i) pin(pc[i]);
    release(v_empty(cs));
    rescale_step<Bounded>(o, a0, a1);  // most steps leave the maxima
  };
  // The last step: P·V only.
  auto last_step = [&](int it, uint32_t (&pc)[16 * NT]) {
    const int cs = it % Stages;
    mbar_wait(v_full(cs), (it / Stages) & 1);
    turn_begin();
    issue_pv<NT, T>(o, pc, smem + C::kVOff + cs * C::kVSlot);
    if (wg == 0) turn_end();  // warpgroup 1's last turn: none left to give
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) pin(o[i]);
#pragma unroll
    for (int i = 0; i < 16 * NT; ++i) pin(pc[i]);
    release(v_empty(cs));
  };
  for (int it = 0; it < steps;) {
    if (it + 1 == steps) {
      last_step(it, pa);
      break;
    }
    run_step(it, pa, pb);
    if (++it + 1 == steps) {
      last_step(it, pb);
      break;
    }
    run_step(it, pb, pa);
    ++it;
  }
  if (qt < q_tiles) store_rows<T>(p, h, qt, warp, g, t4, st, o, Bounded ? p.check : nullptr, steps > 0);
#endif
}

// ---------------- host ----------------

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver the runtime loaded, or null.
EncodeTiled encoder() {
  static const EncodeTiled fn = []() -> EncodeTiled {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !f) {
      cudaGetLastError();  // an answer, not an error to keep
      return nullptr;
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

// An int8 carrier [rows][128] (Q or K) in boxes of 64 rows, 128-byte swizzle.
bool encode_carrier(EncodeTiled enc, CUtensorMap* map, const int8_t* ptr, int64_t rows) {
  const cuuint64_t dims[2] = {cuuint64_t(kD), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(kD)};
  const cuuint32_t box[2] = {cuuint32_t(kD), cuuint32_t(kTile)}, unit[2] = {1, 1};
  return enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<int8_t*>(ptr), dims, strides, box, unit,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// V [heads][kv_rows][128] 16-bit with its strides, in boxes of 64 rows x 64 columns (one
// 128-byte swizzle row each); rows past kv_rows zero-filled.
bool encode_v(EncodeTiled enc, CUtensorMap* map, const Int8AttnParams& p) {
  const int64_t row_bytes = p.v_row_stride * 2;
  const int64_t head_bytes = p.heads > 1 ? p.v_head_stride * 2 : row_bytes * p.kv_rows;  // any, for one head
  if (!aligned16(p.v) || row_bytes <= 0 || row_bytes % 16 || head_bytes <= 0 || head_bytes % 16) return false;
  const cuuint64_t dims[3] = {cuuint64_t(kD), cuuint64_t(p.kv_rows), cuuint64_t(p.heads)};
  const cuuint64_t strides[2] = {cuuint64_t(row_bytes), cuuint64_t(head_bytes)};
  const cuuint32_t box[3] = {64, cuuint32_t(kTile), 1}, unit[3] = {1, 1, 1};
  return enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void*>(p.v), dims, strides, box, unit,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int WG, int NT, int Stages, bool PingPong, bool Bounded, typename T>
cudaError_t launch_ws(const CUtensorMap& tq, const CUtensorMap& tk, const CUtensorMap& tv, const Int8AttnParams& p,
                      cudaStream_t stream, bool redo) {
  using C = WsCfg<WG, NT, Stages>;
  auto* kernel = attention_sm90_ws<WG, NT, Stages, PingPong, Bounded, T>;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
  if (e != cudaSuccess) return e;
  const dim3 grid((attn_tiles(p.q_rows) + WG - 1) / WG, p.heads);
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(tq, tk, tv, p, int(redo));
  return cudaGetLastError();
}

// The launch of one pass: launch(std::bool_constant<Bounded>{}, T{}, redo), the
// bounded softmax for bf16 only (bounded_softmax_takes), the online one for bf16 and fp16;
// cudaErrorInvalidValue for a Bounded or Redo pass the parameters do not take.
template <typename Launch>
cudaError_t launch_pass(const Int8AttnParams& p, SoftmaxPass pass, Launch&& launch) {
  if (pass != SoftmaxPass::Exact && !bounded_softmax_takes(p)) return cudaErrorInvalidValue;
  if (pass == SoftmaxPass::Bounded) return launch(std::true_type{}, __nv_bfloat16{}, false);
  const bool redo = pass == SoftmaxPass::Redo;
  return p.type == Elem::BF16 ? launch(std::false_type{}, __nv_bfloat16{}, redo)
                              : launch(std::false_type{}, __half{}, redo);
}

template <bool Bounded, typename T>
cudaError_t launch_type(const CUtensorMap& tq, const CUtensorMap& tk, const CUtensorMap& tv, const Int8AttnParams& p,
                        cudaStream_t stream, const Sm90WsOptions& o, bool redo) {
  if (p.offsets) return launch_ws<1, 2, 2, false, Bounded, T>(tq, tk, tv, p, stream, redo);
  return o.ping_pong ? launch_ws<2, 2, 4, true, Bounded, T>(tq, tk, tv, p, stream, redo)
                     : launch_ws<2, 2, 4, false, Bounded, T>(tq, tk, tv, p, stream, redo);
}

}  // namespace

cudaError_t int8_attention_sm90_ws(const Int8AttnParams& p, cudaStream_t stream, const Sm90WsOptions& options,
                                   SoftmaxPass pass) {
  if (p.head_dim != kD || p.q_rows <= 0 || p.kv_rows <= 0 || p.heads <= 0 || !int8_attention_sm90_ready())
    return cudaErrorNotSupported;
  if (p.type != Elem::BF16 && p.type != Elem::F16) return cudaErrorNotSupported;
  return launch_pass(p, pass, [&](auto bounded, auto type, bool redo) {
    const EncodeTiled enc = encoder();
    if (!enc || !aligned16(p.q) || !aligned16(p.k)) return cudaErrorNotSupported;
    alignas(64) CUtensorMap tq, tk, tv;
    const int64_t q_rows = int64_t(p.heads) * attn_tiles(p.q_rows) * kTile;
    const int64_t k_rows = int64_t(p.heads) * attn_tiles(p.kv_rows) * kTile;
    if (!encode_carrier(enc, &tq, p.q, q_rows) || !encode_carrier(enc, &tk, p.k, k_rows) || !encode_v(enc, &tv, p))
      return cudaErrorNotSupported;
    return launch_type<decltype(bounded)::value, decltype(type)>(tq, tk, tv, p, stream, options, redo);
  });
}

}  // namespace sp::kernels
