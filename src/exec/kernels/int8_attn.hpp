// ATen adapter of the INT8 attention kernels (kernels/int8_attention.cuh).
//
// Design note. The K carrier (int8 K per 64-row tile less K's per-head mean, the tile scales,
// the fp32 tile means the routing needs, each head's largest row norm) is made once per K/V
// phase and reused by every streamed Q slab; each Q slab is quantized per tile (its scales carry
// softmax scale x log2 e; a byte per 16 rows flags the bounded softmax's redo,
// kernels/int8_attention_sm90.cuh) and attends against it and V. A TileList (CSR over (head,
// query tile)) restricts the key tiles; an empty one is dense. Checks name the tensor
// (c10::Error); without CUDA (built()) all entry points throw.
//
// Example:
//     auto kc = sp::exec::int8attn::quantize_k(k);           // k [G, kv_rows, D] on CUDA
//     auto qt = sp::exec::int8attn::quantize_q(q, scale, kc); // q [G, q_rows, D]
//     at::Tensor o = sp::exec::int8attn::attend(qt, kc, v, {});   // [G, q_rows, D]
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace sp::exec::int8attn {

inline constexpr int64_t kTile = 64;

bool built();

struct KCarrier {
  at::Tensor k8, scale, tile_mean, head_mean;  // [G, kt*64, D] int8, [G, kt], [G, kt, D], [G, D]
  // [G, D] each: K's channel j is multiplied by k_factor (1 / c_j) after the mean is subtracted,
  // Q's by q_factor (c_j), c_j = sqrt(K's range in channel j / the mean range of its head).
  at::Tensor k_factor, q_factor;
  at::Tensor norm;                             // [G] the largest scale x int8 row norm
  int64_t rows = 0;
};
struct QTiles {
  at::Tensor q8, scale, tile_mean;  // [G, qt*64, D] int8, [G, qt], [G, qt, D]
  at::Tensor norm;                  // [G, qt] each tile's largest scale x int8 row norm
  at::Tensor check;                 // [G, qt * 4] uint8: the bounded softmax's rows to redo
  int64_t rows = 0;
};
struct TileList {
  at::Tensor offsets, indices;  // int32 [G*qt + 1], [nnz]; undefined: dense
};
// The attention kernel: Auto is Sm90 (wgmma) for head_dim 128 on a compute capability 9.0
// device when the sm_90a image was built, else Portable (mma.sync, sm_80 and later).
enum class Kernel { Auto, Portable, Sm90 };

// Bytes the carrier and the Q tiles of these shapes hold (the Q tiles' with attend's flag temporaries).
int64_t k_carrier_bytes(int64_t heads, int64_t rows, int64_t head_dim);
int64_t q_tiles_bytes(int64_t heads, int64_t rows, int64_t head_dim);

// k, q, v: [G, rows, D] bf16 or fp16 on one CUDA device, unit last stride, D 64 or 128.
// factors false: every channel factor 1 (K's channels as they are).
KCarrier quantize_k(const at::Tensor& k, bool factors = true);
// The carrier of G x rows x D laid out in `bytes` (a contiguous int8 tensor of
// k_carrier_bytes elements): int8 K, then the tile scales, the tile means, the head means, the
// channel factors of K and of Q, and the head norms.
KCarrier carrier_view(const at::Tensor& bytes, int64_t heads, int64_t rows, int64_t head_dim);
// K rows [row0, row0 + k.size(1)) into the carrier, row0 a multiple of kTile. The first slab
// (row0 0) sets the per-head means every slab subtracts and the channel factors: softmax is
// invariant to any vector subtracted from every key, and a slab's mean removes K's common
// offset as well as all rows'; the factors scale Q against K, which leaves Q·K as it is.
void quantize_k_rows(const at::Tensor& k, const KCarrier& c, int64_t row0);
// Q's tiles for attending against `k` (its channel factors applied).
QTiles quantize_q(const at::Tensor& q, double softmax_scale, const KCarrier& k);
// [G, q rows, D] in v's dtype. A forced Sm90 where it cannot run is an error naming why. Query
// tiles whose scores' Cauchy-Schwarz bound exceeds kLooseBound (log2 units) skip the sm90
// kernels' bounded softmax for the online one at once: a bound that far above the scores would
// have the bounded pass flag them and the tile computed twice.
inline constexpr double kLooseBound = 256.0;
at::Tensor attend(const QTiles& q, const KCarrier& k, const at::Tensor& v, const TileList& tiles,
                  Kernel kernel = Kernel::Auto);
// The kernel Auto picks for head_dim on the current CUDA device (Portable without CUDA).
Kernel auto_kernel(int64_t head_dim);

}  // namespace sp::exec::int8attn
