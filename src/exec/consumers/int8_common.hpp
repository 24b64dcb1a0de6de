// What the `int8` and `sparse` attention consumers share: their implementation, the device
// requirement and its self-test, the K carrier made once per K/V phase, and a call's bytes.
//
// Design note. Both consumers change the result, so they never fall back: require() throws a
// ContractError naming the consumer and the reason. The self-test (once per device and
// process) runs awkward shapes dense against fp32 attention and block-sparse against the
// masked reference, rel L2 <= 2e-2. A planned run's K/V phase fills the K carrier
// (kernels/int8_attn.hpp) slab by slab in the arena (carry_k); calls that hand over 16-bit K
// (the naive schedule, hosts) get a carrier cached for the most recent K, keyed by K's
// pointer, shape, strides and a sample of 64 rows compared on the device (the arena's buffers
// share one version counter), and freed after the slab that ends the phase (after_slab).
//
// Example:
//     contracts::ConsumerCaps c = sp::exec::int8c::caps("sparse", "routed ...", /*routed=*/true);
//     c.work_fraction = routed_share;  // what only the routed consumer adds
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "contracts/contracts.hpp"
#include "exec/consumers/consumer.hpp"
#include "exec/kernels/int8_attn.hpp"

namespace sp::exec::int8c {

// The capabilities both consumers declare (bf16/fp16, bounded Q slabs, global K/V, slab
// output, the K carrier, an int8 call's bytes and allocations) with the implementation of the
// consumer `name`: dense attention ("int8") or, `routed`, routed block-sparse attention with
// its phases tallied ("sparse", sparse.hpp).
contracts::ConsumerCaps caps(const std::string& name, const std::string& description, bool routed);
// Frees the cached K carrier (the next call makes a new one; benchmarks time that too).
void drop_carrier();
// Output and Q tiles, and where K is not carried the cached K carrier and its samples: what an
// int8 call holds.
int64_t call_bytes(const contracts::AttnShape& s);

}  // namespace sp::exec::int8c
