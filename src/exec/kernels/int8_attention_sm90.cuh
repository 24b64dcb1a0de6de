// The sm_90a (Hopper, wgmma) path of int8_attention, head_dim 128. int8_attention picks it by
// itself; these are for that choice and for tests that time or check one path.
#pragma once

#include "exec/kernels/int8_attention.cuh"

namespace sp::kernels {

// True when the current device is compute capability 9.0 and the sm_90a image of the kernel
// was built and loaded (probed once per device).
bool int8_attention_sm90_ready();

// Which sm_90a kernel runs: Auto the warp-specialized TMA one where it can (the driver's
// tensor-map encoder found, pointers and strides 16-byte aligned), else the cp.async one;
// CpAsync and WarpSpecialized force one (WarpSpecialized: cudaErrorNotSupported where it cannot).
// Both compute the same bits.
enum class Sm90Kernel { Auto, CpAsync, WarpSpecialized };

// cudaErrorNotSupported unless head_dim is 128 and int8_attention_sm90_ready().
cudaError_t int8_attention_sm90(const Int8AttnParams& p, cudaStream_t stream, Sm90Kernel kernel);
cudaError_t int8_attention_sm90(const Int8AttnParams& p, cudaStream_t stream);  // Sm90Kernel::Auto

}  // namespace sp::kernels
