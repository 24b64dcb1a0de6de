// The sm_90a (Hopper, wgmma) path of int8_attention, head_dim 128. int8_attention picks it by
// itself; these are for that choice and for tests that time or check one path.
#pragma once

#include "exec/kernels/int8_attention.cuh"

namespace sp::kernels {

// True when the current device is compute capability 9.0 and the sm_90a image of the kernel
// was built and loaded (probed once per device).
bool int8_attention_sm90_ready();

// The softmax of one launch. Exact: the online softmax (running row maxima, the sums and
// outputs rescaled when they grow). Bounded: each row's exponent offset fixed before its first
// key from the Cauchy-Schwarz bound of its scores (Int8AttnParams::k_norm and the row's norm),
// so the steps take no maxima and never rescale; the rows whose offset was too far above their
// scores are flagged in Int8AttnParams::check. Redo: the online softmax on the CTAs whose query
// tiles are flagged there; the others return at once. check arrives filled: the Bounded pass
// skips CTAs whose every tile is flagged already (left to Redo) and writes the others' flags.
// Bounded and Redo need bounded_softmax_takes(p).
enum class SoftmaxPass { Exact, Bounded, Redo };

// bf16 V and O (fp16 P would not hold the bounded pass's range), k_norm and check set.
inline bool bounded_softmax_takes(const Int8AttnParams& p) {
  return p.type == Elem::BF16 && p.k_norm != nullptr && p.check != nullptr;
}

// One launch of one pass on the warp-specialized kernels (int8_attention_sm90_ws.cuh);
// cudaErrorNotSupported, launching nothing, unless head_dim is 128, int8_attention_sm90_ready()
// and the kernels take the parameters (int8_attention then runs the portable kernel).
cudaError_t int8_attention_sm90_pass(const Int8AttnParams& p, cudaStream_t stream, SoftmaxPass pass);
// The passes of one attention, each through launch(pass): Bounded then Redo where
// bounded_softmax_takes(p), else Exact.
template <typename Launch>
cudaError_t run_softmax_passes(const Int8AttnParams& p, Launch&& launch) {
  if (!bounded_softmax_takes(p)) return launch(SoftmaxPass::Exact);
  const cudaError_t e = launch(SoftmaxPass::Bounded);
  return e != cudaSuccess ? e : launch(SoftmaxPass::Redo);
}
// The attention: run_softmax_passes of int8_attention_sm90_pass.
cudaError_t int8_attention_sm90(const Int8AttnParams& p, cudaStream_t stream);

}  // namespace sp::kernels
