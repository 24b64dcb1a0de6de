// Executors: the naive reference schedule and the bounded (planned) schedule.
//
// Design note. run_naive computes every op of the IR on full tensors, exactly as the
// original model does, and shares no chunking code with run_planned — comparing the two
// tests the schedule. run_planned follows a plan::Plan: per phase it allocates the
// buffers plan/schedule.hpp specifies (nothing else of size larger than a row vector,
// besides what consumers and weight formats declare), preallocates global K/V, streams
// Q slabs against them, and writes each slab's projection straight into the residual
// once every reader of the old values has run. Both return the model output [T, out]
// rows of the final layer's segments, in fp32 (or fp64 for an fp64 model), and never
// modify their inputs.
//
// Example:
//     sp::exec::Inputs in = ...;                      // tokens per segment + tables
//     at::Tensor ref = sp::exec::run_naive(model, weights, in, reg);
//     at::Tensor out = sp::exec::run_planned(model, plan, weights, in, reg, device);
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>

#include "contracts/contracts.hpp"
#include "exec/weights.hpp"
#include "ir/model.hpp"
#include "plan/plan.hpp"

namespace sp::exec {

struct Inputs {
  // Per segment: its tokens [length, input features of the segment], activation dtype.
  std::map<std::string, at::Tensor> tokens;
  // Modulation tables [1|S|T, count, dim]; RoPE "<table>.cos"/".sin" [T, rot/2] fp32;
  // contexts [length, dim] in the activation dtype.
  std::map<std::string, at::Tensor> tables;
  const at::Tensor& table(const std::string& name) const;
  const at::Tensor& segment_tokens(const std::string& segment) const;
  at::Device device() const;
};

// Throws std::invalid_argument naming the input and the shapes on any mismatch.
void validate_inputs(const ir::Model& m, const Inputs& in);

// Called once per finished sublayer (progress reporting); may be empty.
using Progress = std::function<void(int64_t done, int64_t total)>;

at::Tensor run_naive(const ir::Model& m, const WeightSource& w, const Inputs& in, const contracts::Registry& reg,
                     const Progress& progress = {});
at::Tensor run_planned(const ir::Model& m, const plan::Plan& p, const WeightSource& w, const Inputs& in,
                       const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                       const Progress& progress = {});

}  // namespace sp::exec
