// The warp-specialized sm_90a kernels of int8_attention (int8_attention_sm90_ws.cu): a producer
// warp loads K and V tiles with the bulk tensor copy engine (TMA) into a ring of shared-memory
// stages guarded by mbarriers, consumer warpgroups run QK^T, the online softmax and P·V on
// wgmma. Reached through int8_attention_sm90.
#pragma once

#include "exec/kernels/int8_attention_sm90.cuh"

namespace sp::kernels {

// Options of the warp-specialized kernels (for tests and timings; the defaults are the ones
// int8_attention runs).
struct Sm90WsOptions {
  // Dense kernel: the two consumer warpgroups take turns issuing their wgmma (a named barrier
  // pair), so that one's softmax runs while the other's products do. Off by default: without the
  // turns the kernel measured 0.3-2% faster on the H200 (kernels/README.md).
  bool ping_pong = false;
};

// cudaErrorNotSupported, before launching anything, when the kernel cannot run these
// parameters: head_dim not 128, the driver's tensor-map encoder not found or refusing the
// tensors (pointers and strides must be 16-byte aligned), or not sm_90a-ready;
// cudaErrorInvalidValue for a Bounded or Redo pass where bounded_softmax_takes(p) is false.
cudaError_t int8_attention_sm90_ws(const Int8AttnParams& p, cudaStream_t stream, const Sm90WsOptions& options = {},
                                   SoftmaxPass pass = SoftmaxPass::Exact);

}  // namespace sp::kernels
