#include "contracts/contracts.hpp"

#include <algorithm>

namespace sp::contracts {

const char* to_string(Cap c) {
  switch (c) {
    case Cap::Unknown: return "undeclared";
    case Cap::No: return "no";
    case Cap::Yes: return "yes";
  }
  return "?";
}

const char* to_string(TensorRole r) {
  switch (r) {
    case TensorRole::Q: return "Q";
    case TensorRole::K: return "K";
    case TensorRole::V: return "V";
    case TensorRole::AttnOut: return "attention output";
    case TensorRole::MlpHidden: return "MLP hidden";
    case TensorRole::BlockInput: return "block input";
    case TensorRole::BlockOutput: return "block output";
  }
  return "?";
}

// CUDA's caching allocator hands out blocks in multiples of 512 bytes. A request of 10 MiB
// or more gets its own segment rounded to 2 MiB, and the block keeps the whole segment
// unless more than 1 MiB would be left over (the allocator's split rule for large blocks).
int64_t DeviceCaps::round_alloc(int64_t bytes) const {
  if (bytes <= 0) return 0;
  const int64_t r = (bytes + alloc_round - 1) / alloc_round * alloc_round;
  if (kind != DeviceKind::CUDA) return r;
  constexpr int64_t MiB = int64_t{1} << 20;
  if (r < 10 * MiB) return r;
  const int64_t segment = (r + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
  return segment - r > MiB ? r : segment;
}

namespace {

int64_t elems(const AttnShape& s) { return s.q_rows * s.heads * s.head_dim; }

// ATen's scaled_dot_product_attention. Output is one Q-sized slab plus the row
// log-sum-exp (fp32) the fused kernels keep. On the CPU the flash kernel adds per-thread
// tiles: a q-split x kv-split score tile, row max/sum, an output accumulator (fp32), and
// for reduced dtypes a reduced copy of the score tile. The split sizes mirror the kernel's
// own choice (256/64/32 query rows by length, 512 keys).
int64_t sdpa_call_bytes(const AttnShape& s) {
  const int64_t esz = static_cast<int64_t>(ir::dtype_size(s.dtype));
  int64_t bytes = elems(s) * esz + s.heads * s.q_rows * 4;
  if (s.device == DeviceKind::CPU) {
    const int64_t qs = std::min<int64_t>(s.q_rows, s.q_rows >= 768 ? 256 : (s.q_rows >= 192 ? 64 : 32));
    const int64_t ks = s.kv_rows >= 512 ? 512 : s.kv_rows;
    int64_t per_thread = (qs * ks + 2 * qs + qs * s.head_dim) * 4;
    // Reduced dtypes: a reduced copy of the score tile, and on CPUs with packed bf16/fp16
    // GEMMs (AMX, AVX512-BF16) packing tiles; 64 KiB a thread covers those.
    if (s.dtype != ir::DType::F32 && s.dtype != ir::DType::F64) per_thread += qs * ks * esz + (64 << 10);
    bytes += per_thread * s.threads;
  }
  return bytes;
}

// Explicit softmax(Q K^T) V: the score matrix in the activation dtype; for reduced dtypes
// also its fp32 copy (softmax runs in place) and the probabilities cast back; the output.
int64_t math_call_bytes(const AttnShape& s) {
  const int64_t esz = static_cast<int64_t>(ir::dtype_size(s.dtype));
  const int64_t scores = s.heads * s.q_rows * s.kv_rows;
  const bool upcast = s.dtype != ir::DType::F32 && s.dtype != ir::DType::F64;
  return scores * (upcast ? esz + 4 + esz : esz) + elems(s) * esz;
}

}  // namespace

Registry Registry::builtin() {
  Registry r;
  const std::set<ir::DType> floats = {ir::DType::F32, ir::DType::BF16, ir::DType::F16, ir::DType::F64};

  ConsumerCaps sdpa;
  sdpa.name = "sdpa";
  sdpa.description = "ATen scaled_dot_product_attention (flash / cuDNN / memory-efficient / math)";
  sdpa.accepts_bounded_q = sdpa.requires_global_k = sdpa.requires_global_v = sdpa.slab_output = Cap::Yes;
  sdpa.dtypes = floats;
  sdpa.call_bytes = sdpa_call_bytes;
  r.add(sdpa);

  ConsumerCaps math = sdpa;
  math.name = "math";
  math.description = "explicit softmax(QK^T)V in fp32 (reference)";
  math.call_bytes = math_call_bytes;
  r.add(math);

  ConsumerCaps whole;
  whole.name = "whole";
  whole.description = "an attention kernel that declares no capabilities (needs complete Q/K/V)";
  whole.dtypes = floats;
  whole.call_bytes = sdpa_call_bytes;
  r.add(whole);

  FormatCaps dense;
  dense.name = "dense";
  dense.description = "weights stored in the activation dtype";
  dense.dense = true;
  dense.out_slicing = dense.in_slicing = dense.held_execution = Cap::Yes;
  r.add(dense);

  FormatCaps i8;
  i8.name = "int8-rowwise";
  i8.description = "int8 with one fp32 scale per output channel; dequantized on acquire";
  i8.storage = ir::DType::I8;
  i8.dense = false;
  i8.out_slicing = i8.in_slicing = i8.held_execution = Cap::Yes;
  i8.in_align = 256;
  r.add(i8);

  PatchCaps qt;
  qt.name = "q-temperature";
  qt.kind = "scale-q";
  qt.description = "multiplies Q by a constant (attention temperature)";
  qt.reads = qt.modifies = {TensorRole::Q};
  qt.row_local = qt.feature_local = Cap::Yes;
  qt.param = 1.25;
  r.add(qt);

  PatchCaps renorm;
  renorm.name = "attn-out-renorm";
  renorm.kind = "renorm-attn-out";
  renorm.description = "divides the attention output by its RMS over all tokens (needs the complete tensor)";
  renorm.reads = renorm.modifies = {TensorRole::AttnOut};
  renorm.row_local = renorm.feature_local = Cap::No;
  r.add(renorm);

  PatchCaps clamp;
  clamp.name = "mlp-hidden-clamp";
  clamp.kind = "clamp-hidden";
  clamp.description = "clamps the activated MLP hidden values to [-param, param]";
  clamp.reads = clamp.modifies = {TensorRole::MlpHidden};
  clamp.row_local = clamp.feature_local = Cap::Yes;
  clamp.param = 0.5;
  r.add(clamp);

  PatchCaps rownorm;
  rownorm.name = "mlp-hidden-rownorm";
  rownorm.kind = "rownorm-hidden";
  rownorm.description = "RMS-normalizes each token's activated MLP hidden row (needs whole rows)";
  rownorm.reads = rownorm.modifies = {TensorRole::MlpHidden};
  rownorm.row_local = Cap::Yes;
  rownorm.feature_local = Cap::No;
  r.add(rownorm);
  return r;
}

void Registry::add(ConsumerCaps c) {
  if (!c.call_bytes)
    throw ContractError("consumer '" + c.name + "': call_bytes must be declared");
  consumers_[c.name] = std::move(c);
}
void Registry::add(FormatCaps f) { formats_[f.name] = std::move(f); }
void Registry::add(PatchCaps p) { patches_[p.name] = std::move(p); }

namespace {
template <typename M>
const typename M::mapped_type& lookup(const M& m, const std::string& name, const char* what) {
  auto it = m.find(name);
  if (it != m.end()) return it->second;
  std::string known;
  for (const auto& [k, v] : m) known += (known.empty() ? "" : ", ") + k;
  throw ContractError(std::string("unknown ") + what + " '" + name + "' (known: " + known + ")");
}
template <typename M>
std::vector<std::string> keys(const M& m) {
  std::vector<std::string> out;
  for (const auto& [k, v] : m) out.push_back(k);
  return out;
}
}  // namespace

const ConsumerCaps& Registry::consumer(const std::string& n) const { return lookup(consumers_, n, "attention consumer"); }
const FormatCaps& Registry::format(const std::string& n) const { return lookup(formats_, n, "weight format"); }
const PatchCaps& Registry::patch(const std::string& n) const { return lookup(patches_, n, "patch"); }
std::vector<std::string> Registry::consumer_names() const { return keys(consumers_); }
std::vector<std::string> Registry::format_names() const { return keys(formats_); }
std::vector<std::string> Registry::patch_names() const { return keys(patches_); }

}  // namespace sp::contracts
