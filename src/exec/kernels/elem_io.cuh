// Loading and storing one element of the kernels' element types as fp32 (device code), and
// the host's dispatch of a launch on an Elem (included by the .cu files of this folder).
//
// Example:
//     float v = sp::kernels::Io<T>::load(x + i);
//     sp::kernels::Io<__nv_bfloat16>::store(out + i, v);
//     with_elem(p.type, [&](auto t) { kernel<decltype(t)><<<grid, block, 0, stream>>>(p); });
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exec/kernels/row_kernels.cuh"

namespace sp::kernels {

// f(T{}) with T the type `e` stands for: __half, __nv_bfloat16 or float.
template <typename F>
decltype(auto) with_elem(Elem e, F&& f) {
  switch (e) {
    case Elem::F16: return f(__half{});
    case Elem::BF16: return f(__nv_bfloat16{});
    default: return f(float{});
  }
}

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
