// "int8": dense attention with Q and K quantized to int8 per 64-row tile (K smoothed by its
// per-head mean) and P·V in 16 bits (kernels/int8_attention.cuh). CUDA only, sm_80 or newer.
#include "exec/consumers/int8_common.hpp"

namespace sp::exec::consumers {

void register_int8_attention(contracts::Registry& reg) {
  using contracts::Cap;
  contracts::ConsumerCaps c;
  c.name = "int8";
  c.description = "INT8 QK^T (per-tile scales, smoothed K), 16-bit PV on tensor cores; CUDA sm_80+, head_dim 64/128";
  c.accepts_bounded_q = c.requires_global_k = c.requires_global_v = c.slab_output = Cap::Yes;
  c.dtypes = {ir::DType::BF16, ir::DType::F16};
  c.call_bytes = int8c::call_bytes;
  c.call_allocations = 3;  // output, quantized Q; uncarried K: its carrier (scales and samples are small)
  int8c::declare_carrier(c);
  c.impl = int8c::consumer("int8", /*routed=*/false);
  reg.add(c);
}

}  // namespace sp::exec::consumers
