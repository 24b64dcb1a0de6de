// Weights under a device-memory budget: the streamed blocks' weights in host memory,
// copied into rotating device slots around each block's work (exec/residency/README.md).
//
// Design note. StreamedWeights wraps the model's TensorWeights: each streamed block's tensors
// in one host buffer (pinned on CUDA, 512-byte aligned offsets, in their stored form). On
// CUDA, begin_block makes the compute stream wait for the block's load and end_block records
// that its slot is free; loads run on a side stream, ordered by events, with no host
// synchronization per block. A block read out of order (a run that failed half-way) resets
// the rotation. A streamed block's tensors are views of its slot, valid while the block runs.
//
// Example:
//     auto rq = sp::exec::residency_request(model, *weights, inputs, reg, caps);
//     rq.device_memory = sp::plan::parse_budget("8GiB");
//     auto rp = sp::plan::plan_with_residency(model, reg, caps, {}, rq);
//     sp::exec::StreamedWeights w(model, weights, rp.residency, reg, device);   // streamed blocks to the host
//     at::Tensor out = sp::exec::run_planned(model, rp.plan, w, inputs, reg, caps);
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "exec/formats/weights.hpp"
#include "exec/run/executor.hpp"
#include "plan/residency.hpp"

namespace sp::exec {

// The tensors of each block (tensor_names and the formats' companions) that `w` holds; a
// tensor that two blocks name belongs to neither.
std::vector<std::vector<std::string>> block_tensors(const ir::Model& m, const TensorWeights& w,
                                                    const contracts::Registry& reg);

// Where the weights go that only the family's prologue reads (those it turns into the
// inputs, such as modulation projections): host memory when the inputs are prepared once
// (the CLI), the device when a host prepares every call there (the Python package), unless
// the residency copies them there on each call instead (Residency::prologue_copied).
enum class Prologue { Host, Device };

// The byte counts residency planning needs: per block its tensors as the device allocates
// them, and the other weights on the device plus the inputs as fixed bytes; with the
// prologue on the device, the weights only it reads as prologue bytes. Tensors already on
// `held` (a GPU where a host placed part of the weights itself) are read where they are and
// count in none of them.
plan::ResidencyRequest residency_request(const ir::Model& m, const TensorWeights& w, const Inputs& in,
                                         const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                                         Prologue prologue = Prologue::Host, const at::Device& held = at::kCPU);
// The inputs' bytes as the device allocates them (residency_request counts them as fixed).
int64_t input_bytes(const Inputs& in, const contracts::DeviceCaps& dev);

// A weight source whose blocks' tensors are views of one buffer per block, each at its place
// (byte offset, dtype, shape), the other tensors read from `w`: the streamed blocks below and
// the blocks sharded over ranks (exec/dist/sharded.hpp).
class PlacedWeights : public WeightSource {
 public:
  bool contains(const std::string& name) const override { return places_.count(name) || w_->contains(name); }
  at::Tensor acquire(const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype,
                     const at::Tensor& out = {}) const override;

 protected:
  PlacedWeights(std::shared_ptr<TensorWeights> w, const contracts::Registry& reg) : w_(std::move(w)), reg_(&reg) {}
  struct Place {
    size_t block = 0;
    int64_t offset = 0;
    at::ScalarType dtype = at::kFloat;
    std::vector<int64_t> shape;
  };
  // The tensor at `p` of its block's buffer `bytes`.
  static at::Tensor view(const at::Tensor& bytes, const Place& p);

  std::shared_ptr<TensorWeights> w_;
  const contracts::Registry* reg_;
  std::map<std::string, Place> places_;
};

class StreamedWeights : public PlacedWeights {
 public:
  // Moves the streamed blocks' tensors of `w` into host memory and every other tensor of `w`
  // onto `device` (where it is not already): weights loaded into host memory run this way.
  // `in_place`: tensors already on a GPU `device` stay where they are, and the streamed
  // blocks' tensors in host memory are copied into the slots from where they are (a host
  // that pins them), with no buffer of this object's own.
  StreamedWeights(const ir::Model& m, std::shared_ptr<TensorWeights> w, const plan::Residency& r,
                  const contracts::Registry& reg, const at::Device& device, Prologue prologue = Prologue::Host,
                  bool in_place = false);
  ~StreamedWeights() override;
  StreamedWeights(const StreamedWeights&) = delete;
  StreamedWeights& operator=(const StreamedWeights&) = delete;

  at::Tensor tensor(const std::string& name) const override;
  void begin_block(size_t block) const override;
  void end_block(size_t block) const override;

  // Copies the streamed blocks' tensors back onto the device into the TensorWeights and
  // frees the host buffers and slots: every weight resident again (benchmarks that compare
  // device-memory budgets on the same weights). Nothing streams afterwards.
  void restore();
  int64_t host_bytes() const;    // the streamed blocks' buffers in host memory
  int64_t device_bytes() const;  // the weights kept on the device and the slots
  int64_t loads() const { return load_count_; }  // block loads issued so far

 private:
  struct Slot;
  Slot* slot_of(size_t block) const;
  void load_next() const;  // the next block of the rotation into its slot
  at::Tensor host_view(size_t block) const;  // the block's bytes in host memory, in its slot's layout
  bool streams(size_t block) const;          // whether the block is loaded into a slot
  void prefetch() const;   // loads while the next slot is free
  void reset() const;      // waits for every copy; empties the slots

  at::Device device_;
  std::vector<at::Tensor> packs_;    // per block: its buffer in host memory (streamed blocks)
  // In place: per block, its host tensors (flat bytes) and their offsets in the slot.
  std::vector<std::vector<std::pair<at::Tensor, int64_t>>> sources_;
  at::Tensor resident_;              // CUDA: the weights that stay on the device, in one buffer
  std::vector<size_t> order_;        // the streamed blocks in order
  mutable std::vector<std::unique_ptr<Slot>> slots_;
  mutable size_t next_ = 0;          // index into order_ of the next load
  mutable int64_t load_count_ = 0;   // loads issued: the next goes into slot load_count_ % slots
  std::shared_ptr<void> copy_stream_;  // CUDA: the side stream of the loads
};

}  // namespace sp::exec
