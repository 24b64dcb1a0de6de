// The sm_90a (Hopper, wgmma) path of int8_attention, head_dim 128. int8_attention picks it by
// itself; these are for that choice and for tests that time or check one path.
#pragma once

#include "exec/kernels/int8_attention.cuh"

namespace sp::kernels {

// True when the current device is compute capability 9.0 and the sm_90a image of the kernel
// was built and loaded (probed once per device).
bool int8_attention_sm90_ready();

// cudaErrorNotSupported unless head_dim is 128 and int8_attention_sm90_ready().
cudaError_t int8_attention_sm90(const Int8AttnParams& p, cudaStream_t stream);

}  // namespace sp::kernels
