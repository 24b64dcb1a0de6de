#include "host/module_weights.hpp"

#include <algorithm>
#include <stdexcept>
#include <string_view>

#include "exec/consumers/consumer.hpp"
#include "exec/formats/quantized.hpp"
#include "models/checkpoint.hpp"
#include "models/families.hpp"
#include "models/tensor_io.hpp"

namespace sp::host {

namespace {

using recognize::Source;

// Module tensors are looked up under their own names behind this prefix, apart from the
// canonical names (a part acquired through its format is a Linear of its own).
constexpr std::string_view kPartPrefix = "module:";
std::string part_key(const std::string& name) { return std::string(kPartPrefix) + name; }
// The module tensor's own name, of a part key.
std::string part_name(const std::string& key) { return key.substr(kPartPrefix.size()); }

bool is_8bit_float(const at::Tensor& t) { return t.is_floating_point() && t.element_size() == 1; }

// The prologue's reads (ModuleWeights::prologue_view).
class PrologueView : public exec::WeightSource {
 public:
  explicit PrologueView(const ModuleWeights& w, const exec::WeightSource* stored = nullptr) : w_(w), stored_(stored) {}
  at::Tensor tensor(const std::string& name) const override { return w_.prologue_tensor(name, stored_); }
  at::Tensor native_linear(const std::string& name, const at::Tensor& x, const at::Tensor& bias) const override {
    return w_.prologue_linear(name, x, bias, stored_);
  }
  bool contains(const std::string& name) const override { return w_.contains(name); }
  at::Tensor acquire(const ir::Linear& l, exec::Slice rows, exec::Slice cols, at::ScalarType dtype,
                     const at::Tensor& out) const override {
    return stored_ ? stored_->acquire(l, rows, cols, dtype, out) : w_.acquire(l, rows, cols, dtype, out);
  }

 private:
  const ModuleWeights& w_;
  const exec::WeightSource* stored_;
};

// A quantized weight and its scales as the module holds them, without hooks: what its format
// reads to dequantize it.
class StoredView : public exec::WeightSource {
 public:
  StoredView(at::Tensor stored, const std::string& name, const std::map<std::string, at::Tensor>& side)
      : stored_(std::move(stored)), name_(name), side_(side) {}
  at::Tensor tensor(const std::string& name) const override { return name == name_ ? stored_ : side_.at(name); }
  bool contains(const std::string& name) const override { return name == name_ || side_.count(name) != 0; }
  at::Tensor acquire(const ir::Linear& l, exec::Slice, exec::Slice, at::ScalarType, const at::Tensor&) const override {
    throw std::logic_error("weight '" + l.weight + "': acquired from its stored view");
  }

 private:
  at::Tensor stored_;
  const std::string& name_;
  const std::map<std::string, at::Tensor>& side_;
};

}  // namespace

std::optional<ir::DType> float_dtype(at::ScalarType t) {
  for (const ir::DType d : {ir::DType::F32, ir::DType::BF16, ir::DType::F16})
    if (exec::to_aten(d) == t) return d;
  return std::nullopt;
}

recognize::Recognized recognize_module(const NamedTensors& tensors, const std::optional<recognize::Sidecar>& sidecar) {
  std::vector<io::TensorInfo> infos;
  infos.reserve(tensors.size());
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : tensors) {
    infos.push_back({.name = name, .dtype = models::to_io(t.scalar_type(), name), .shape = t.sizes().vec()});
    by_name[name] = &t;
  }
  // Quantized weights as the host stores them (ComfyUI: the tensors of a comfy_quant checkpoint).
  recognize::QuantScan q = recognize::scan_quant(infos, [&](const std::string& name) {
    const at::Tensor bytes = by_name.at(name)->to(at::kCPU).contiguous();
    return std::string(static_cast<const char*>(bytes.data_ptr()), size_t(bytes.nbytes()));
  });
  recognize::Recognized r = recognize::recognize(q.structural, sidecar);
  r.quant = std::move(q.weights);
  return r;
}

ModuleWeights::ModuleWeights(const NamedTensors& tensors, const recognize::Recognized& r, const contracts::Registry* reg,
                             ir::DType compute)
    : reg_(reg), config_(r.config), compute_(exec::to_aten(compute)), prologue_(std::make_unique<PrologueView>(*this)) {
  std::map<std::string, at::Tensor> by_name;
  for (const auto& [name, t] : tensors) by_name.emplace(name, t);
  auto side_tensor = [&](const std::string& name, const at::Tensor& like) {
    if (name.empty()) return at::ones({}, like.options().dtype(at::kFloat));  // scale 1
    return by_name.at(name);
  };
  for (const auto& [name, src] : r.tensors) {
    Canonical c;
    c.src = src;
    int64_t row = 0;
    const recognize::QuantSpec* spec = nullptr;  // of a quantized part
    for (const auto& part : src.tensors) {
      auto it = by_name.find(part);
      if (it == by_name.end())
        throw std::invalid_argument("module tensor '" + part + "' (part of canonical '" + name + "') is missing");
      c.parts.push_back(it->second);
      c.offsets.push_back(row);
      row += it->second.dim() > 0 ? it->second.size(0) : 1;
      parts_.emplace(part_key(part), it->second);
      if (auto q = r.quant.find(part); q != r.quant.end()) spec = &q->second;
    }
    if (spec) {
      if (src.op != Source::Op::Copy || src.tensors.size() != 1)
        throw std::invalid_argument("weight '" + name + "' is joined from " + std::to_string(src.tensors.size()) +
                                    " module tensors, quantized (" + spec->origin +
                                    "); quantized weights are read in place, one tensor each");
      specs_[name] = *spec;
      quantized_part_[src.tensors.front()] = name;
      side_[exec::quant::scale_name(name)] = side_tensor(spec->weight_scale, c.parts.front());
      if (!spec->input_scale.empty()) side_[exec::quant::input_scale_name(name)] = by_name.at(spec->input_scale);
    } else if (std::any_of(c.parts.begin(), c.parts.end(), is_8bit_float)) {
      cast_.insert(name);  // held cast to its dtype
    }
    if (src.op == Source::Op::Copy && !cast_.count(name)) {
      at::Tensor v = models::assemble(name, src, c.parts);
      if (v.is_alias_of(c.parts.front())) c.view = v;  // else held (a kernel that cannot be viewed flat)
    }
    canon_.emplace(name, std::move(c));
  }
}

ModuleWeights::~ModuleWeights() = default;

at::ScalarType ModuleWeights::dtype_of(const std::string& canonical) const {
  return models::weight_dtype(config_, canonical, compute_);
}

at::Tensor ModuleWeights::assembled(const std::string& name, const Canonical& c) const {
  const at::Tensor t = models::assemble(name, c.src, c.parts).contiguous();
  return cast_.count(name) ? t.to(dtype_of(name)) : t;
}

at::Tensor ModuleWeights::with_stored(const std::string& name, const exec::WeightSource* stored,
                                      const StoredUse& use) const {
  const Canonical& c = canonical(name);
  ir::Linear l;
  l.weight = name;
  l.out_features = c.parts.front().size(0);
  l.in_features = c.parts.front().dim() > 1 ? c.parts.front().size(1) : 1;
  l.format = specs_.at(name).format;
  const StoredView own(c.view.defined() ? c.view : c.parts.front(), name, side_);
  return use(stored ? *stored : static_cast<const exec::WeightSource&>(own), l);
}

at::Tensor ModuleWeights::dequantized(const std::string& name, const exec::WeightSource* stored) const {
  return with_stored(name, stored, [&](const exec::WeightSource& src, const ir::Linear& l) {
    return exec::impl_of<exec::FormatImpl>(reg_->format(l.format)).acquire(src, l, {}, {}, dtype_of(name), {});
  });
}

at::Tensor ModuleWeights::prologue_linear(const std::string& name, const at::Tensor& x, const at::Tensor& bias,
                                          const exec::WeightSource* stored) const {
  if (hooked(name) || !specs_.count(name)) return {};  // a hooked weight: the host casts and patches it
  return with_stored(name, stored, [&](const exec::WeightSource& src, const ir::Linear& l) {
    return exec::native_linear(*reg_, src, l, x, bias);
  });
}

at::Tensor ModuleWeights::prologue_tensor(const std::string& name, const exec::WeightSource* stored) const {
  if (hooked(name)) return hooked_tensor(name, stored ? *stored : static_cast<const exec::WeightSource&>(*this));
  if (specs_.count(name)) return dequantized(name, stored);
  return stored ? stored->tensor(name) : tensor(name);
}

std::unique_ptr<exec::WeightSource> ModuleWeights::prologue_over(const exec::WeightSource& stored) const {
  return std::make_unique<PrologueView>(*this, &stored);
}

void ModuleWeights::mark_quantized(ir::Model& m) const {
  if (specs_.empty()) return;
  ir::for_each_linear(m, [&](ir::Linear& l) {
    if (auto it = specs_.find(l.weight); it != specs_.end()) l.format = it->second.format;
  });
}

void register_hook_format(contracts::Registry& reg, ir::DType model, const ModuleWeights* w) {
  struct Hooked : exec::FormatImpl {
    explicit Hooked(const ModuleWeights* w) : w(w) {}
    void store(exec::TensorWeights&, const ir::Linear& l, const at::Tensor&, at::ScalarType) const override {
      throw std::invalid_argument("weight '" + l.weight + "': format '" + kHookFormat + "' holds no stored weights");
    }
    // The whole weight through the hook, then the slice into the placed buffer: nothing
    // hooked outlives the acquire but what the program placed.
    at::Tensor acquire(const exec::WeightSource& src, const ir::Linear& l, exec::Slice rows, exec::Slice cols,
                       at::ScalarType dtype, const at::Tensor& out) const override {
      const at::Tensor s = exec::slice(exec::slice(w->hooked_tensor(l.weight, src), 0, rows), 1, cols);
      if (!out.defined()) return s.to(dtype, /*non_blocking=*/false, /*copy=*/true);  // one copy, never a view
      out.copy_(s);
      return out;
    }
    const ModuleWeights* w;
  };
  contracts::FormatCaps f;
  f.name = kHookFormat;
  f.description = "a module's weight passed through the host's weight hook at acquire";
  f.storage = model;
  f.dense = false;  // the acquired slice goes into a placed buffer
  f.whole_copies = 2;  // what the hook returns, and its assembly into the canonical weight
  f.out_slicing = f.in_slicing = f.held_execution = contracts::Cap::Yes;
  f.impl = std::make_shared<Hooked>(w);
  reg.add(f);
}

void ModuleWeights::set_hook(WeightHook hook, const std::vector<std::string>& names) {
  std::set<std::string> parts;
  for (const auto& n : names) {
    if (!parts_.count(part_key(n))) throw std::invalid_argument("weight hook: the module has no tensor '" + n + "'");
    parts.insert(n);
  }
  if (names.empty())
    for (const auto& [key, t] : parts_) parts.insert(part_name(key));
  hooked_parts_ = std::move(parts);
  hook_ = std::move(hook);
  hooked_canon_.clear();
  for (const auto& [name, c] : canon_)
    for (const auto& p : c.src.tensors)
      if (hooked_parts_.count(p)) hooked_canon_.insert(name);
}

at::Tensor ModuleWeights::hooked_part(const std::string& module_name, const at::Tensor& t) const {
  if (!hook_ || !hooked_parts_.count(module_name)) return t;
  // The host hands its patches the weight in the compute dtype: dequantized, or cast from 8 bits.
  const auto q = quantized_part_.find(module_name);
  return hook_part(module_name, q != quantized_part_.end() ? dequantized(q->second)
                                : is_8bit_float(t)          ? t.to(compute_)
                                                            : t);
}

at::Tensor ModuleWeights::hook_part(const std::string& module_name, const at::Tensor& in) const {
  if (!hook_ || !hooked_parts_.count(module_name)) return in;
  at::Tensor r = hook_(module_name, in);
  if (!r.defined() || r.sizes() != in.sizes() || r.device() != in.device() || !r.is_floating_point() ||
      r.element_size() == 1)
    throw std::invalid_argument(
        "weight hook: for '" + module_name + "' it returned " +
        (r.defined() ? std::string(c10::toString(r.scalar_type())) + " " + c10::str(r.sizes()) + " on " + r.device().str()
                     : std::string("no tensor")) +
        "; expected a 16- or 32-bit floating-point tensor of " + c10::str(in.sizes()) + " on " + in.device().str());
  return r;
}

at::Tensor ModuleWeights::hooked_tensor(const std::string& name, const exec::WeightSource& src) const {
  // The module's tensors as the hook takes them, each hooked where it is, and assembled: read
  // from the module, or cut back out of the stored canonical weight where the run reads it
  // (the streamed slots).
  const Canonical& c = canonical(name);
  std::vector<at::Tensor> parts;
  at::Tensor whole;
  if (&src != this) {
    whole = specs_.count(name) ? dequantized(name, &src) : src.tensor(name);
    if (is_8bit_float(whole)) whole = whole.to(compute_);
  }
  for (size_t i = 0; i < c.parts.size(); ++i)
    parts.push_back(&src == this ? hooked_part(c.src.tensors[i], c.parts[i])
                                 : hook_part(c.src.tensors[i], models::stored_part(name, c.src.op, whole, c.offsets[i],
                                                                                   c.parts[i].sizes())));
  return models::assemble(name, c.src, parts).contiguous();
}

void ModuleWeights::mark_stored(ir::Model& m) const {
  // The dtype the module holds wins over the family's default (ComfyUI's mixed-precision loader
  // holds a quantized file's unquantized fp32 island in the file's dtype).
  ir::for_each_linear(m, [&](ir::Linear& l) {
    auto it = canon_.find(l.weight);
    if (it == canon_.end() || it->second.parts.empty()) return;
    // Not a 16/32-bit float: the format's own storage.
    if (const auto d = float_dtype(it->second.parts.front().scalar_type())) l.stored = *d != m.dtype ? d : std::nullopt;
  });
}

void ModuleWeights::mark_hooked(ir::Model& m) const {
  if (hooked_canon_.empty()) return;
  ir::for_each_linear(m, [&](ir::Linear& l) {
    if (hooked(l.weight)) l.format = kHookFormat;
  });
}

const ModuleWeights::Canonical& ModuleWeights::canonical(const std::string& name) const {
  auto it = canon_.find(name);
  if (it == canon_.end()) throw std::out_of_range("weight '" + name + "' is not in the module's weights");
  return it->second;
}

at::Tensor ModuleWeights::tensor(const std::string& name) const {
  if (auto it = side_.find(name); it != side_.end()) return it->second;
  if (auto it = parts_.find(name); it != parts_.end())
    return hooked_part(part_name(name), it->second);
  const Canonical& c = canonical(name);
  if (hooked(name)) return hooked_tensor(name, *this);
  return c.view.defined() ? c.view : held(name, c);
}

bool ModuleWeights::contains(const std::string& name) const {
  return canon_.count(name) != 0 || parts_.count(name) != 0 || side_.count(name) != 0;
}

const at::Tensor& ModuleWeights::held(const std::string& name, const Canonical& c) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, fresh] = held_.try_emplace(name);
  if (fresh) it->second = assembled(name, c);
  return it->second;
}

void ModuleWeights::refresh() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [name, t] : held_) t = assembled(name, canonical(name));
}

std::vector<std::pair<std::string, at::Tensor>> ModuleWeights::canonical_tensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, c] : canon_) out.emplace_back(name, c.view.defined() ? c.view : assembled(name, c));
  for (const auto& [name, t] : side_) out.emplace_back(name, t);
  return out;
}

std::vector<ModuleWeights::Copy> ModuleWeights::copies() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Copy> out;
  for (const auto& [name, t] : held_) out.push_back({name, int64_t(t.nbytes())});
  return out;
}

std::map<std::string, std::vector<const void*>> ModuleWeights::storage() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, std::vector<const void*>> out;
  for (const auto& [name, c] : canon_) {
    if (held_.count(name)) continue;
    if (c.view.defined()) {
      out[name] = {c.view.data_ptr()};
    } else if (c.src.op == Source::Op::Concat0) {
      for (const auto& p : c.parts) out[name].push_back(p.data_ptr());
    }
  }
  return out;
}

at::Tensor ModuleWeights::acquire(const ir::Linear& l, exec::Slice rows, exec::Slice cols, at::ScalarType dtype,
                                  const at::Tensor& out) const {
  const auto& format = exec::impl_of<exec::FormatImpl>(reg_->format(l.format));
  if (l.format == kHookFormat) return format.acquire(*this, l, rows, cols, dtype, out);
  auto it = canon_.find(l.weight);
  if (it == canon_.end() || it->second.src.op != Source::Op::Concat0) return format.acquire(*this, l, rows, cols, dtype, out);
  const Canonical& c = it->second;
  if (rows.step < 1) throw std::invalid_argument("weight '" + l.weight + "': row step " + std::to_string(rows.step));
  const int64_t n = rows.length < 0 ? (l.out_features - rows.begin + rows.step - 1) / rows.step : rows.length;
  const int64_t first = rows.begin, last = rows.begin + (n - 1) * rows.step;
  for (size_t p = 0; p < c.parts.size() && n > 0; ++p) {
    const int64_t lo = c.offsets[p], hi = lo + c.parts[p].size(0);
    if (first < lo || last >= hi) continue;
    ir::Linear part = l;  // the part as a Linear of its own, acquired through the same format
    part.weight = part_key(c.src.tensors[p]);
    part.bias.clear();
    part.out_regions.clear();
    part.out_features = hi - lo;
    return format.acquire(*this, part, {first - lo, n, rows.step}, cols, dtype, out);
  }
  return acquire_spanning(l, c, {first, n, rows.step}, cols, dtype, out);
}

at::Tensor ModuleWeights::acquire_spanning(const ir::Linear& l, const Canonical& c, exec::Slice rows, exec::Slice cols,
                                           at::ScalarType dtype, const at::Tensor& out) const {
  if (!reg_->format(l.format).dense)
    throw std::invalid_argument("weight '" + l.weight + "': a module's weights are dense, the IR names format '" +
                                l.format + "'");
  // Rows k of the slice (begin + k*step) that fall into each part, in order.
  std::vector<at::Tensor> pieces;
  for (size_t p = 0; p < c.parts.size(); ++p) {
    const int64_t lo = c.offsets[p], hi = lo + c.parts[p].size(0);
    const int64_t k0 = rows.begin >= lo ? 0 : (lo - rows.begin + rows.step - 1) / rows.step;
    if (hi - 1 < rows.begin) continue;
    const int64_t k1 = std::min(rows.length - 1, (hi - 1 - rows.begin) / rows.step);
    if (k0 > k1) continue;
    const exec::Slice local{rows.begin + k0 * rows.step - lo, k1 - k0 + 1, rows.step};
    pieces.push_back(exec::slice(exec::slice(c.parts[p], 0, local), 1, cols));
  }
  const at::Tensor w = at::cat(pieces, 0);
  if (!out.defined()) return w.to(dtype);
  out.copy_(w);
  return out;
}

}  // namespace sp::host
