#include "exec/residency/streamed.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "exec/consumers/consumer.hpp"
#include "exec/device/device.hpp"

#ifdef STREAMPLAN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace sp::exec {

namespace {

constexpr int64_t kAlign = 512;  // offsets in a block's buffer, as the caching allocator rounds

int64_t packed_bytes(const at::Tensor& t) { return ir::round_up(int64_t(t.nbytes()), kAlign); }

// The tensors stored beside l's weight, by its format.
std::vector<std::string> companions(const contracts::Registry& reg, const ir::Linear& l) {
  return impl_of<FormatImpl>(reg.format(l.format)).companions(l);
}

// The tensor of `dtype` and `shape` at byte `offset` of a byte buffer.
at::Tensor placed(const at::Tensor& bytes, int64_t offset, at::ScalarType dtype, const std::vector<int64_t>& shape) {
  const int64_t n = c10::multiply_integers(shape) * int64_t(c10::elementSize(dtype));
  return bytes.narrow(0, offset, n).view(dtype).view(shape);
}

#ifdef STREAMPLAN_WITH_CUDA
at::cuda::CUDAStream& as_stream(const std::shared_ptr<void>& p) { return *static_cast<at::cuda::CUDAStream*>(p.get()); }
#endif

// The tensors of `w` that go to the device although no block holds them: those the run reads
// outside the blocks (the embeddings' and the final layer's), or with the prologue on the
// device every tensor no block holds.
std::set<std::string> device_tensors_outside_blocks(const ir::Model& m, const TensorWeights& w,
                                                    const contracts::Registry& reg, Prologue prologue) {
  std::set<std::string> out;
  if (prologue == Prologue::Device) {
    std::set<std::string> in_blocks;
    for (const auto& names : block_tensors(m, w, reg)) in_blocks.insert(names.begin(), names.end());
    for (const auto& [name, t] : w.all())
      if (!in_blocks.count(name)) out.insert(name);
    return out;
  }
  auto add = [&](const std::string& n) {
    if (w.contains(n)) out.insert(n);
  };
  for (const auto& n : ir::tensor_names_outside_blocks(m)) add(n);
  auto add_companions = [&](const ir::Linear& l) {
    for (const auto& c : companions(reg, l)) add(c);
  };
  for (const auto& e : m.embeds) add_companions(e.linear);
  if (m.final_layer) {
    add_companions(m.final_layer->proj);
    for (const auto& [segment, l] : m.final_layer->heads) add_companions(l);
  }
  return out;
}

// Whether t is on `held`, a GPU where its host placed it: read there, neither kept nor streamed.
bool held_there(const at::Tensor& t, const at::Device& held) { return !held.is_cpu() && t.device() == held; }

// t's storage as the device allocates it, unless `counted` has it already.
int64_t storage_bytes(const at::Tensor& t, const contracts::DeviceCaps& dev, std::set<const void*>& counted) {
  if (!t.defined()) return 0;
  const void* data = t.storage().data();
  if (data && !counted.insert(data).second) return 0;
  return dev.round_alloc(int64_t(t.storage().nbytes()));
}

}  // namespace

// A device buffer a streamed block is loaded into; events on CUDA.
struct StreamedWeights::Slot {
  at::Tensor mem;
  int64_t block = -1;  // the block loaded (or loading); -1: empty
  bool begun = false, ended = false;
#ifdef STREAMPLAN_WITH_CUDA
  at::cuda::CUDAEvent loaded, freed;
  bool freed_recorded = false;
#endif
};

std::vector<std::vector<std::string>> block_tensors(const ir::Model& m, const TensorWeights& w,
                                                    const contracts::Registry& reg) {
  std::vector<std::vector<std::string>> names(m.blocks.size());
  std::map<std::string, int> uses;
  for (size_t b = 0; b < m.blocks.size(); ++b) {
    std::vector<std::string> n = ir::tensor_names(m.blocks[b]);
    ir::for_each_linear(m.blocks[b], [&](const ir::Linear& l) {
      for (auto& c : companions(reg, l)) n.push_back(c);
    });
    std::set<std::string> seen;
    for (auto& name : n)
      if (w.contains(name) && seen.insert(name).second) {
        names[b].push_back(name);
        ++uses[name];
      }
  }
  for (auto& n : names) n.erase(std::remove_if(n.begin(), n.end(), [&](const auto& x) { return uses[x] > 1; }), n.end());
  return names;
}

plan::ResidencyRequest residency_request(const ir::Model& m, const TensorWeights& w, const Inputs& in,
                                         const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                                         Prologue prologue, const at::Device& held) {
  plan::ResidencyRequest rq;
  for (const auto& names : block_tensors(m, w, reg)) {
    int64_t bytes = 0;
    for (const auto& n : names) {
      const at::Tensor t = w.tensor(n);
      if (!held_there(t, held)) bytes += packed_bytes(t);
    }
    rq.block_bytes.push_back(bytes);
  }
  // Held for the whole run, a storage shared by several tensors counted once; with the
  // prologue on the device, the tensors only it reads apart (kept or copied per call).
  std::set<const void*> counted;
  const std::set<std::string> run_reads = device_tensors_outside_blocks(m, w, reg, Prologue::Host);
  for (const auto& name : device_tensors_outside_blocks(m, w, reg, prologue)) {
    const at::Tensor t = w.tensor(name);
    if (held_there(t, held)) continue;
    const int64_t bytes = storage_bytes(t, dev, counted);
    if (run_reads.count(name)) {
      rq.fixed_bytes += bytes;
    } else {  // read dequantized (at most 4 bytes an element) beside its stored form
      rq.prologue_bytes += bytes;
      rq.prologue_peak_bytes =
          std::max(rq.prologue_peak_bytes, dev.round_alloc(int64_t(t.nbytes())) + dev.round_alloc(4 * t.numel()));
    }
  }
  rq.fixed_bytes += input_bytes(in, dev);
  return rq;
}

int64_t input_bytes(const Inputs& in, const contracts::DeviceCaps& dev) {
  std::set<const void*> counted;
  int64_t bytes = 0;
  for (const auto* group : {&in.tokens, &in.tables})
    for (const auto& [name, t] : *group) bytes += storage_bytes(t, dev, counted);
  return bytes;
}

StreamedWeights::StreamedWeights(const ir::Model& m, std::shared_ptr<TensorWeights> w, const plan::Residency& r,
                                 const contracts::Registry& reg, const at::Device& device, Prologue prologue,
                                 bool in_place)
    : PlacedWeights(std::move(w), reg), device_(device) {
  if (r.streamed.size() != m.blocks.size())
    throw std::invalid_argument("residency of " + std::to_string(r.streamed.size()) + " blocks for a model of " +
                                std::to_string(m.blocks.size()));
  const at::Device held = in_place ? device_ : at::Device(at::kCPU);
  const auto names = block_tensors(m, *w_, reg);
  packs_.resize(m.blocks.size());
  sources_.resize(m.blocks.size());
  int64_t slot_bytes = 0;
  for (size_t b = 0; b < m.blocks.size(); ++b) {
    if (!r.streamed[b]) continue;
    std::vector<std::pair<std::string, at::Tensor>> host;  // the block's tensors to load
    int64_t bytes = 0;
    for (const auto& n : names[b]) {
      if (held_there(w_->tensor(n), held)) continue;
      at::Tensor t = w_->take(n).contiguous();
      bytes += packed_bytes(t);
      host.emplace_back(n, std::move(t));
    }
    if (host.empty()) continue;
    if (!in_place) packs_[b] = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(device_.is_cuda()));
    int64_t offset = 0;
    for (auto& [n, t] : host) {
      const at::Tensor flat = t.view(-1).view(at::kByte);
      if (in_place) sources_[b].emplace_back(flat, offset);
      else packs_[b].narrow(0, offset, int64_t(t.nbytes())).copy_(flat);
      places_[n] = {b, offset, t.scalar_type(), t.sizes().vec()};
      offset += packed_bytes(t);
    }
    order_.push_back(b);
    slot_bytes = std::max(slot_bytes, bytes);
  }
  // What the run reads goes to the device, what it never reads to host memory.
  std::set<std::string> read = device_tensors_outside_blocks(m, *w_, reg, r.prologue_copied ? Prologue::Host : prologue);
  for (const auto& n : names) read.insert(n.begin(), n.end());
  std::vector<std::pair<std::string, at::Tensor>> resident;
  int64_t resident_bytes = 0;
  std::vector<std::string> rest;
  for (const auto& [name, t] : w_->all()) rest.push_back(name);
  for (const auto& name : rest) {
    if (held_there(w_->tensor(name), held)) continue;
    at::Tensor t = w_->take(name);
    if (!read.count(name)) w_->add(name, t.to(at::kCPU));
    else if (!device_.is_cuda()) w_->add(name, t.to(device_));
    else {
      resident.emplace_back(name, t.to(at::kCPU));
      resident_bytes += packed_bytes(t);
    }
  }
  // On a GPU the resident weights go into one buffer, allocated once the device has let go of
  // every old weight: no partly used segment of the caching allocator outlives the move (a
  // cap of the device memory counts what the allocator holds, not what is allocated).
  if (!resident.empty()) {
    release_cached(device_);
    resident_ = at::empty({resident_bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
    int64_t offset = 0;
    for (auto& [name, t] : resident) {
      w_->add(name, placed(resident_, offset, t.scalar_type(), t.sizes().vec()).copy_(t));
      offset += packed_bytes(t);
    }
  }
  if (order_.empty()) return;
  const int slots = std::clamp(r.slots, 1, int(order_.size()));
  for (int i = 0; i < slots; ++i) {
    auto s = std::make_unique<Slot>();
    s->mem = at::empty({slot_bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
    slots_.push_back(std::move(s));
  }
#ifdef STREAMPLAN_WITH_CUDA
  if (device_.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device_);
    copy_stream_ = std::make_shared<at::cuda::CUDAStream>(at::cuda::getStreamFromPool(false, device_.index()));
    // The slots are only ever freed after the copies into them (the destructor waits), but
    // the allocator is told so as well.
    for (auto& s : slots_) s->mem.record_stream(as_stream(copy_stream_));
  }
#endif
}

StreamedWeights::~StreamedWeights() {
  try {
    reset();
  } catch (...) {
  }
}

void StreamedWeights::restore() {
  reset();
  slots_.clear();
  for (const auto& [name, p] : places_)
    w_->add(name, view(host_view(p.block), p).to(device_, /*non_blocking=*/false, /*copy=*/true));
  places_.clear();
  packs_.assign(packs_.size(), at::Tensor());
  sources_.assign(sources_.size(), {});
  order_.clear();
}

int64_t StreamedWeights::host_bytes() const {
  int64_t b = 0;
  for (const auto& p : packs_)
    if (p.defined()) b += int64_t(p.nbytes());
  return b;
}

int64_t StreamedWeights::device_bytes() const {
  int64_t b = resident_.defined() ? int64_t(resident_.nbytes()) : 0;
  for (const auto& s : slots_) b += int64_t(s->mem.nbytes());
  return b;
}

StreamedWeights::Slot* StreamedWeights::slot_of(size_t block) const {
  for (auto& s : slots_)
    if (s->block == int64_t(block)) return s.get();
  return nullptr;
}

bool StreamedWeights::streams(size_t block) const {
  return block < packs_.size() && (packs_[block].defined() || !sources_[block].empty());
}

at::Tensor StreamedWeights::host_view(size_t block) const {
  if (packs_[block].defined()) return packs_[block];
  // In place: a host buffer of the block's layout (restore() only).
  int64_t bytes = 0;
  for (const auto& [t, offset] : sources_[block]) bytes = std::max(bytes, offset + int64_t(t.nbytes()));
  at::Tensor out = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  for (const auto& [t, offset] : sources_[block]) out.narrow(0, offset, int64_t(t.nbytes())).copy_(t);
  return out;
}

void StreamedWeights::load_next() const {
  Slot& s = *slots_[size_t(load_count_ % int64_t(slots_.size()))];
  const size_t b = order_[next_];
  // The block's copies: its buffer whole, or in place each tensor from where it is.
  auto copy = [&](bool non_blocking) {
    if (packs_[b].defined()) {
      s.mem.narrow(0, 0, int64_t(packs_[b].nbytes())).copy_(packs_[b], non_blocking);
      return;
    }
    for (const auto& [t, offset] : sources_[b]) s.mem.narrow(0, offset, int64_t(t.nbytes())).copy_(t, non_blocking);
  };
#ifdef STREAMPLAN_WITH_CUDA
  if (device_.is_cuda()) {
    at::cuda::CUDAStream& cs = as_stream(copy_stream_);
    if (s.freed_recorded) s.freed.block(cs);
    const at::cuda::CUDAStreamGuard guard(cs);
    copy(/*non_blocking=*/true);
    s.loaded.record(cs);
  } else
#endif
  {
    copy(/*non_blocking=*/false);
  }
  s.block = int64_t(b);
  s.begun = s.ended = false;
  next_ = (next_ + 1) % order_.size();
  ++load_count_;
}

void StreamedWeights::prefetch() const {
  for (;;) {
    const Slot& s = *slots_[size_t(load_count_ % int64_t(slots_.size()))];
    if (s.block >= 0 && !(s.begun && s.ended)) return;  // holds a block still to run, or running
    load_next();
  }
}

void StreamedWeights::reset() const {
#ifdef STREAMPLAN_WITH_CUDA
  if (copy_stream_) as_stream(copy_stream_).synchronize();
#endif
  for (auto& s : slots_) {
    s->block = -1;
    s->begun = s->ended = false;
  }
}

void StreamedWeights::begin_block(size_t block) const {
  if (!streams(block)) return;
  Slot* s = slot_of(block);
  if (!s || s->begun) {
    // Out of the rotation's order (a run that stopped half-way, or blocks run out of order):
    // start it again at this block.
    synchronize(device_);
    reset();
    next_ = size_t(std::find(order_.begin(), order_.end(), block) - order_.begin());
    load_next();
    s = slot_of(block);
  }
#ifdef STREAMPLAN_WITH_CUDA
  if (device_.is_cuda()) s->loaded.block(at::cuda::getCurrentCUDAStream(device_.index()));
#endif
  s->begun = true;
  prefetch();
}

void StreamedWeights::end_block(size_t block) const {
  if (!streams(block)) return;
  Slot* s = slot_of(block);
  if (!s || !s->begun) return;
#ifdef STREAMPLAN_WITH_CUDA
  if (device_.is_cuda()) {
    s->freed.record(at::cuda::getCurrentCUDAStream(device_.index()));
    s->freed_recorded = true;
  }
#endif
  s->ended = true;
  prefetch();
}

at::Tensor StreamedWeights::tensor(const std::string& name) const {
  auto it = places_.find(name);
  if (it == places_.end()) return w_->tensor(name);
  const Place& p = it->second;
  const Slot* s = slot_of(p.block);
  if (!s || !s->begun || s->ended)
    throw std::logic_error("weight '" + name + "' of streamed block " + std::to_string(p.block) +
                           " read outside the block's work");
  return view(s->mem, p);
}

at::Tensor PlacedWeights::view(const at::Tensor& bytes, const Place& p) {
  return placed(bytes, p.offset, p.dtype, p.shape);
}

at::Tensor PlacedWeights::acquire(const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype,
                                  const at::Tensor& out) const {
  return impl_of<FormatImpl>(reg_->format(l.format)).acquire(*this, l, rows, cols, dtype, out);
}

}  // namespace sp::exec
