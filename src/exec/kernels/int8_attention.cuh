// INT8 attention with optional block sparsity, as plain CUDA (no ATen).
//
// Design note. Attention is cut into tiles of 64 query rows by 64 key rows (kAttnTile).
// attn_quantize turns Q or K [heads, rows, head_dim] (16-bit, any head and row stride) into
// int8 per head and per 64-row tile, scale = absmax / 127 of the tile, into a padded carrier
// [heads, tiles * 64, head_dim] whose rows past the end are zero; in the same pass it can
// write each tile's fp32 mean (the routing's tile means). K is smoothed first: its per-head
// mean over all key rows is subtracted (softmax is invariant to a per-query constant, and
// the smaller range keeps more int8 resolution); attn_head_mean folds the tile means into
// that per-head mean, so K is read twice (means, then quantization) and Q once. A per-channel
// factor can follow the subtraction: K's channel j divided by c_j and Q's multiplied by it
// leave every Q·K product as it is and move range from K's outlier channels into Q's.
// int8_attention is FlashAttention-2 style: one CTA of 4 warps per (64-row query tile, head),
// each warp 16 query rows; QK^T runs on int8 tensor cores (mma.sync m16n8k32 s8, int32
// accumulation, scaled per tile pair by q_scale * k_scale into the log2 domain), the online
// softmax in fp32, P·V with P rounded to V's 16-bit type on mma.sync m16n8k16 with fp32
// accumulation. K (int8) and V tiles are double-buffered in shared memory by cp.async,
// rows padded by 16 bytes so ldmatrix reads are free of bank conflicts. Keys past kv_rows
// are masked (-inf), V rows past the end are zero-filled, rows past q_rows are not written.
// Block sparsity: per (head, query tile) a CSR list of the key tiles to visit
// (offsets [heads * q_tiles + 1], indices); no list visits all key tiles (dense).
// Two kernels run this, with the same parameters and arithmetic (results equal up to the
// order of sums): the portable one above (int8_attention.cu, sm_80 and later) and, for
// head_dim 128 on compute capability 9.0 when the sm_90a image is built, a warp-specialized
// wgmma one (int8_attention_sm90.cuh, kernels/README.md), which with bf16 V, k_norm and check
// runs the bounded softmax. AttnPath::Auto picks, once per device
// (int8_attention_sm90_ready; the portable kernel where the sm_90a one does not take the
// parameters); Portable and Sm90 force.
//
// Example:
//     sp::kernels::AttnQuantParams qp;   // Q: scales carry softmax scale * log2(e)
//     qp.x = q; qp.head_stride = rows * 128; qp.row_stride = 128; qp.heads = h; qp.rows = rows;
//     qp.head_dim = 128; qp.extra_scale = scale * 1.4426950408889634f; qp.out = q8; qp.scale = qs;
//     sp::kernels::attn_quantize(qp, stream);
//     ... the same for K with qp.subtract = head_mean ...
//     sp::kernels::Int8AttnParams p{...};
//     sp::kernels::int8_attention(p, stream);
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "exec/kernels/row_kernels.cuh"

namespace sp::kernels {

inline constexpr int kAttnTile = 64;

inline int64_t attn_tiles(int64_t rows) { return (rows + kAttnTile - 1) / kAttnTile; }

struct AttnQuantParams {
  const void* x = nullptr;  // [heads, rows, head_dim], element (h, r, d) at h*head_stride + r*row_stride + d
  int64_t head_stride = 0, row_stride = 0;
  Elem type = Elem::BF16;
  int heads = 0, rows = 0, head_dim = 0;  // head_dim a multiple of 16, at most 256
  const float* subtract = nullptr;  // [heads, head_dim] subtracted before quantizing, or null
  const float* factor = nullptr;    // [heads, head_dim] multiplied in after the subtraction, or null
  float extra_scale = 1.0f;         // multiplied into each stored scale
  int8_t* out = nullptr;            // [heads, tiles * 64, head_dim], or null: means only
  float* scale = nullptr;           // [heads, tiles]
  float* tile_mean = nullptr;       // [heads, tiles, head_dim] fp32 means of x, or null
  // [heads]: the largest over the tiles written of the stored scale times the L2 norm of an int8
  // row (with out), maxed into what it holds (zero it before a carrier's first slab), or null;
  // K's bound for the bounded softmax (Int8AttnParams::k_norm).
  float* norm = nullptr;
  float* tile_norm = nullptr;  // [heads, tiles]: each tile's stored scale times its largest int8 row norm, or null
  // Tiles per head of out, scale and tile_mean (0: the tiles of `rows`), and the first tile
  // written: rows of a longer carrier quantized slab by slab.
  int out_tiles = 0, tile_offset = 0;
};
cudaError_t attn_quantize(const AttnQuantParams& p, cudaStream_t stream);

// head_mean[h, d] = the mean over all `rows` rows, from the tile means attn_quantize wrote.
cudaError_t attn_head_mean(const float* tile_mean, int heads, int rows, int head_dim, float* head_mean,
                           cudaStream_t stream);

// Which kernel int8_attention runs: Auto takes the sm_90a (wgmma) kernel for head_dim 128
// where int8_attention_sm90_ready(), else the portable one; the others force one (Sm90 fails
// with cudaErrorNotSupported where it cannot run).
enum class AttnPath { Auto, Portable, Sm90 };

struct Int8AttnParams {
  const int8_t* q = nullptr;      // [heads, q_tiles * 64, head_dim] (attn_quantize)
  const float* q_scale = nullptr; // [heads, q_tiles], including softmax scale * log2(e)
  const int8_t* k = nullptr;      // [heads, kv_tiles * 64, head_dim]
  const float* k_scale = nullptr; // [heads, kv_tiles]
  const void* v = nullptr;        // [heads, kv_rows, head_dim], 16-byte aligned rows
  int64_t v_head_stride = 0, v_row_stride = 0;
  void* o = nullptr;              // [heads, q_rows, head_dim]
  int64_t o_head_stride = 0, o_row_stride = 0;
  Elem type = Elem::BF16;         // of v and o: BF16 or F16
  int heads = 0, q_rows = 0, kv_rows = 0, head_dim = 0;  // head_dim 64 or 128
  const int32_t* offsets = nullptr;  // [heads * q_tiles + 1], or null: dense
  const int32_t* indices = nullptr;  // key tiles, ascending or not
  AttnPath path = AttnPath::Auto;
  // The bounded softmax (sm_90a path, bf16): with both set, each query row's exponent offset
  // is fixed before its first key (see int8_attention_sm90.cuh) and the rows it cannot hold are
  // recomputed with the online softmax.
  const float* k_norm = nullptr;  // [heads] (AttnQuantParams::norm of K)
  uint8_t* check = nullptr;       // [heads, q_tiles, 4] scratch: one byte per 16 query rows
};
cudaError_t int8_attention(const Int8AttnParams& p, cudaStream_t stream);

}  // namespace sp::kernels
