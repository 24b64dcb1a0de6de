// Attention consumers written in Python (streamplan.register_consumer), as contracts
// registered beside the built-in ones.
//
// Design note. The function receives the Q slab [1, G, rows, head_dim], the global K and V
// [1, G, kv_rows, head_dim] (views of the planned run's buffers, valid during the call), the
// slab's first query row among its sublayer's, the sublayer's query rows and its block index
// (contracts::AttnCall), and returns the output slab of the Q slab's shape, dtype and device.
// Capabilities it leaves out of its dict stay undeclared, so legality fails closed for the
// transformations that need them and says so in the plan. Without call_bytes, a call is taken
// to allocate its output slab.
#pragma once

#include <torch/extension.h>

#include <memory>
#include <string>

#include "contracts/contracts.hpp"

namespace sp::python {

// `caps`: accepts_bounded_q, requires_global_k, requires_global_v, slab_output (True, False
// or absent), dtypes (names), q_align, kv_align, call_allocations (ints), call_bytes (a
// function of the call's shape dict returning bytes).
contracts::ConsumerCaps python_consumer(const std::string& name, const pybind11::function& fn, const pybind11::dict& caps);

}  // namespace sp::python
