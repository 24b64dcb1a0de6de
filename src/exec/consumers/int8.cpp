// "int8": dense attention with Q and K quantized to int8 per 64-row tile (K smoothed by its
// per-head mean) and P·V in 16 bits (kernels/int8_attention.cuh). CUDA only, sm_80 or newer.
#include "exec/consumers/int8_common.hpp"

namespace sp::exec::consumers {

void register_int8_attention(contracts::Registry& reg) {
  reg.add(int8c::caps("int8",
                      "INT8 QK^T (per-tile scales, smoothed K), 16-bit PV on tensor cores; "
                      "CUDA sm_80+, head_dim 64/128",
                      /*routed=*/false));
}

}  // namespace sp::exec::consumers
