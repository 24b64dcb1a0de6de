// What the `int8` and `sparse` attention consumers share: the device requirement and its
// self-test, the K carrier made once per K/V phase, and the bytes a call holds.
//
// Design note. Both consumers are explicit choices that change the result, so they never fall
// back: require() throws a ContractError naming the consumer and the reason (not built with
// CUDA, a CPU tensor, an SM below 8.0, a dtype or head_dim the kernels do not take, or a
// failed self-test). The self-test runs once per device and process: small awkward shapes
// (130 query rows against 200 key rows, 3 heads, head_dim 64 and 128), dense against fp32
// attention and block-sparse against the masked reference, rel L2 <= 2e-2. Both declare the
// K carrier (kernels/int8_attn.hpp) in their capabilities: a planned run's K/V phase fills it
// slab by slab in the program's arena (carry_k), in place of 16-bit K, and the attend steps
// read it (carried). Calls that hand over 16-bit K (the naive schedule, hosts) get a carrier
// made at once and cached for the most recent K: the streamed Q slabs of one phase reuse it. The arena's buffers share one version counter, so the key is K's pointer, shape,
// strides and a sample of 64 of its rows compared on the device; a different K at the same
// place (the next layer) misses. The carrier is freed after the slab that ends the phase
// (after_slab) or when the next K replaces it; call_bytes counts it in every call of the
// phase (the steps between the phase's attend calls run beside it uncounted).
//
// Example:
//     sp::exec::int8c::require("int8", q3);
//     const auto kc = sp::exec::int8c::carrier_for(k3);
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "contracts/contracts.hpp"
#include "exec/kernels/int8_attn.hpp"

namespace sp::exec::int8c {

// Throws contracts::ContractError unless the int8 kernels run on q's device.
void require(const std::string& consumer, const at::Tensor& q);
// require()'s reason for `device` and `dtype`, or "" where the kernels run there.
std::string unusable(const std::string& consumer, const at::Device& device, at::ScalarType dtype);

struct Carrier {
  int8attn::KCarrier k;
  uint64_t phase = 0;  // increases with every new K
};
// k [G, kv_rows, D]: the cached carrier of this K, or a new one.
Carrier carrier_for(const at::Tensor& k);
// Frees the cached carrier (the next call makes a new one; benchmarks time that too).
void drop_carrier();
// After a Q slab of rows [q_begin, q_begin + q_rows): frees the carrier once the slab reaches
// row kv_rows, the end of a self-attention over rows [0, kv_rows), so the carrier lives for
// its phase only. Elsewhere (cross-attention, attention over later rows) it may free it early,
// which only costs a new carrier.
void after_slab(int64_t q_begin, int64_t q_rows, int64_t kv_rows);

// The K carrier a K/V phase fills slab by slab (ConsumerCaps::k_carrier_bytes): `bytes`
// [G, n] int8 from the program's arena. carry_k quantizes the slab k [1, G, rows, D] at row0
// (the first slab also starts a new phase); carried views the filled carrier with the phase
// of its last first slab.
void carry_k(const std::string& consumer, const at::Tensor& k, const at::Tensor& bytes, int64_t row0, int64_t kv_rows);
Carrier carried(const at::Tensor& bytes, int64_t kv_rows, int64_t head_dim);
// Declares the carrier in a consumer's capabilities.
void declare_carrier(contracts::ConsumerCaps& c);

// Output and Q tiles, and where K is not carried the cached K carrier and its samples: what an
// int8 call holds.
int64_t call_bytes(const contracts::AttnShape& s);

// The [G, rows, D] views of the consumer interface's [1, G, rows, D] tensors.
at::Tensor heads_rows(const at::Tensor& t, const char* what, const std::string& consumer);

}  // namespace sp::exec::int8c
