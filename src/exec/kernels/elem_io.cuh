// Loading and storing one element of the kernels' element types as fp32 (device code only;
// included by the .cu files of this folder).
//
// Example:
//     float v = sp::kernels::Io<T>::load(x + i);
//     sp::kernels::Io<__nv_bfloat16>::store(out + i, v);
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace sp::kernels {

template <typename T>
struct Io;
template <>
struct Io<float> {
  static __device__ float load(const float* p) { return *p; }
  static __device__ void store(float* p, float v) { *p = v; }
};
template <>
struct Io<__half> {
  static __device__ float load(const __half* p) { return __half2float(*p); }
  static __device__ void store(__half* p, float v) { *p = __float2half_rn(v); }
};
template <>
struct Io<__nv_bfloat16> {
  static __device__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  static __device__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
};

}  // namespace sp::kernels
