// The sm_90a path of int8_attention (see int8_attention.cuh for the design): whether the device
// loaded the sm_90a image, and the passes of an attention on the warp-specialized kernels
// (int8_attention_sm90_ws.cu). Compiled for sm_90a only; on any other architecture the probe
// is empty and int8_attention_sm90_ready() is false, so int8_attention keeps the portable path.
#include "exec/kernels/int8_attention_sm90.cuh"

#include <atomic>

#include "exec/kernels/int8_attention_sm90_ws.cuh"

namespace sp::kernels {

namespace {

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

cudaError_t int8_attention_sm90_pass(const Int8AttnParams& p, cudaStream_t stream, SoftmaxPass pass) {
  return int8_attention_sm90_ws(p, stream, {}, pass);  // it answers cudaErrorNotSupported where it cannot run
}

cudaError_t int8_attention_sm90(const Int8AttnParams& p, cudaStream_t stream) {
  return run_softmax_passes(p, [&](SoftmaxPass pass) { return int8_attention_sm90_pass(p, stream, pass); });
}

}  // namespace sp::kernels
