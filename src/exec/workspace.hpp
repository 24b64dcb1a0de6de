// Workspace: the buffers of one phase of the bounded schedule, allocated from the
// phase's spec (plan/schedule.hpp) and nothing else.
//
// Example:
//     Workspace ws(device, phase_spec);
//     at::Tensor n32 = ws.get(plan::Buf::N32, {rows, dim});   // prefix view of the buffer
//     Workspace next = ws.handoff(next_spec);                 // keeps K/V, frees the rest first
#pragma once

#include <ATen/ATen.h>

#include <array>

#include "plan/schedule.hpp"

namespace sp::exec {

class Workspace {
 public:
  Workspace(const at::Device& device, const plan::PhaseSpec& spec) : device_(device) { allocate(spec); }
  Workspace(Workspace&&) = default;
  Workspace& operator=(Workspace&&) = default;

  // A contiguous view of the first numel(shape) elements of buffer `id`.
  at::Tensor get(plan::Buf id, at::IntArrayRef shape) const;
  at::Tensor full(plan::Buf id) const;
  bool has(plan::Buf id) const { return slots_[static_cast<size_t>(id)].storage.defined(); }
  // Frees every buffer that `next` does not list with the same shape, then allocates the
  // rest of `next`; buffers listed in both are carried over with their contents.
  Workspace handoff(const plan::PhaseSpec& next);

 private:
  Workspace(const at::Device& device) : device_(device) {}
  void allocate(const plan::PhaseSpec& spec);
  // Each buffer is a typed view of a byte storage; sharers view their owner's storage.
  struct Slot {
    at::Tensor storage;  // uint8
    at::ScalarType dtype = at::kByte;
    std::vector<int64_t> shape;
    bool owner = false;
  };
  at::Device device_;
  std::array<Slot, static_cast<size_t>(plan::Buf::Count)> slots_;
};

}  // namespace sp::exec
