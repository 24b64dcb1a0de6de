#include "models/checkpoint.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <deque>
#include <functional>
#include <future>
#include <span>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "models/families.hpp"
#include "models/quant_load.hpp"
#include "models/tensor_io.hpp"

namespace sp::models {

using recognize::Source;

std::optional<recognize::Sidecar> sidecar_of(const io::SafetensorsFile& f) {
  auto it = f.metadata().find(kSidecarKey);
  if (it == f.metadata().end()) return std::nullopt;
  return recognize::parse_sidecar(it->second, f.source() + " (metadata '" + kSidecarKey + "')");
}

namespace {

at::Tensor swap_halves(const at::Tensor& t, const std::string& name) {
  if (t.size(0) % 2 != 0)
    throw std::invalid_argument("tensor '" + name + "': cannot swap halves of " + std::to_string(t.size(0)) + " rows");
  auto h = t.chunk(2, 0);
  return at::cat({h[1], h[0]}, 0);
}

// Convolution kernels with stride == kernel act as linears over flattened patches.
at::Tensor as_linear(const std::string& canonical, at::Tensor t) {
  return (canonical.size() > 7 && canonical.ends_with(".weight") && t.dim() > 2) ? t.reshape({t.size(0), -1}) : t;
}

// Scales a standard normal draw into the kind of values the tensor holds: norm weights and
// scales near 1, small biases and modulation tables, matrices with std 1/sqrt(fan in).
void shape_values(const recognize::TensorSpec& spec, at::Tensor& t) {
  const std::string& n = spec.name;
  const bool bias = n.size() > 5 && n.ends_with(".bias");
  if (n.ends_with("inv_freq") && spec.shape.size() == 1) {
    // Stored RoPE inverse frequencies: 10000^(-i/n) over the n rotated pairs of an axis.
    const int64_t len = spec.shape[0];
    const at::Tensor i = at::arange(len, at::TensorOptions().dtype(at::kDouble));
    t.copy_(at::pow(10000.0, -i / static_cast<double>(len)));
  } else if (spec.shape.size() == 1 && !bias) {
    t.mul_(0.1).add_(1.0);
  } else if (bias) {
    t.mul_(0.02);
  } else if (n.find("modulation") != std::string::npos) {
    t.mul_(0.1);
  } else {
    int64_t fan_in = 1;
    for (size_t i = 1; i < spec.shape.size(); ++i) fan_in *= spec.shape[i];
    t.mul_(1.0 / std::sqrt(double(std::max<int64_t>(fan_in, 1))));
  }
}

uint64_t tensor_seed(uint64_t seed, const std::string& name) { return seed ^ std::hash<std::string>{}(name); }

// One canonical tensor in fp32 on the CPU; depends only on its name, shape and the seed.
at::Tensor random_tensor(const recognize::TensorSpec& spec, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(tensor_seed(seed, spec.name));
  at::Tensor t = at::randn(spec.shape, gen, at::TensorOptions().dtype(at::kFloat));
  shape_values(spec, t);
  return t;
}

}  // namespace

at::Tensor assemble_stored(const std::string& canonical, const recognize::Source& src,
                           const std::vector<at::Tensor>& parts) {
  if (parts.empty() || parts.size() != src.tensors.size())
    throw std::invalid_argument("tensor '" + canonical + "': " + std::to_string(parts.size()) + " parts given, its source names " +
                                std::to_string(src.tensors.size()));
  at::Tensor t = src.op == Source::Op::Concat0 ? at::cat(parts, 0) : parts.front();
  if (src.op == Source::Op::SwapHalves0) t = swap_halves(t, src.tensors.front());
  return t;
}

at::Tensor assemble(const std::string& canonical, const recognize::Source& src, const std::vector<at::Tensor>& parts) {
  return as_linear(canonical, assemble_stored(canonical, src, parts));
}

at::Tensor stored_part(const std::string& canonical, recognize::Source::Op op, const at::Tensor& t, int64_t row_offset,
                       at::IntArrayRef shape) {
  at::Tensor p = op == Source::Op::Concat0 ? t.narrow(0, row_offset, shape.at(0)) : t;
  if (op == Source::Op::SwapHalves0) p = swap_halves(p, canonical);
  return p.reshape(shape);
}

std::shared_ptr<exec::TensorWeights> load_canonical(const io::SafetensorsFile& f, const recognize::Recognized& r,
                                                    at::ScalarType dtype, const at::Device& device,
                                                    const contracts::Registry& reg) {
  auto w = std::make_shared<exec::TensorWeights>(&reg);
  for (const auto& [canonical, src] : r.tensors) {
    if (load_quantized(f, r, canonical, src, device, *w)) continue;
    std::vector<at::Tensor> parts;
    for (const auto& n : src.tensors) parts.push_back(read_tensor(f, n));
    const at::Tensor t = assemble(canonical, src, parts);
    w->add(canonical, t.is_floating_point() ? t.to(device, weight_dtype(r.config, canonical, dtype)) : t.to(device));
  }
  return w;
}

std::map<std::string, at::Tensor> random_canonical(const recognize::FamilyConfig& config, uint64_t seed) {
  std::map<std::string, at::Tensor> out;
  for (const auto& spec : recognize::checkpoint_tensors(config, "original")) out[spec.name] = random_tensor(spec, seed);
  return out;
}

std::shared_ptr<exec::TensorWeights> random_weights_on(const recognize::FamilyConfig& config, const at::Device& device,
                                                       at::ScalarType dtype, uint64_t seed,
                                                       const contracts::Registry& reg) {
  auto w = std::make_shared<exec::TensorWeights>(&reg);
  for (const auto& spec : recognize::checkpoint_tensors(config, "original")) {
    at::manual_seed(tensor_seed(seed, spec.name));
    at::Tensor t = at::randn(spec.shape, at::TensorOptions().dtype(weight_dtype(config, spec.name, dtype)).device(device));
    shape_values(spec, t);
    w->add(spec.name, as_linear(spec.name, t));
  }
  return w;
}

void write_random_checkpoint(const recognize::FamilyConfig& config, const std::string& layout,
                             const std::string& path, uint64_t seed, at::ScalarType dtype,
                             const std::function<void(const WriteProgress&)>& progress) {
  const auto specs = recognize::checkpoint_tensors(config, layout);

  // The header follows from names, shapes and the dtype alone, so the file size is known
  // (and checked against the free disk space by open()) before any weight exists.
  io::SafetensorsStreamWriter w;
  w.set_metadata(kSidecarKey, recognize::to_json(recognize::sidecar_for(config)));
  w.set_metadata("streamplan.variant", config.variant);
  const io::DType stored = to_io(dtype, specs.empty() ? path : specs.front().name);
  std::unordered_map<std::string, int> parts_left;  // Concat0 parts not yet written, per canonical
  try {
    for (const auto& spec : specs) {
      w.declare(spec.name, stored, spec.shape);
      if (spec.op == Source::Op::Concat0) ++parts_left[spec.canonical];
    }
  } catch (const io::SafetensorsError& e) {
    if (w.header_bytes() - 8 <= io::kMaxHeaderBytes) throw;
    throw io::SafetensorsError(path + ": " + config.variant + " with " + std::to_string(config.layers) +
                               " layers has " + std::to_string(specs.size()) +
                               " tensors, too many for one safetensors file (" + e.what() +
                               "); nothing was written");
  }
  w.open(path);

  // Canonical tensors are those of the original layout.
  std::unordered_map<std::string, recognize::TensorSpec> canonical;
  for (auto& o : recognize::checkpoint_tensors(config, "original")) canonical.emplace(o.name, std::move(o));

  // Written one tensor at a time, in order; the next canonical tensors are drawn on other
  // threads meanwhile (each from its own generator, so the bits do not depend on the threads),
  // at most one per hardware thread ahead. A canonical tensor split into several stored parts is
  // kept only until its last part is written.
  std::vector<const recognize::TensorSpec*> order;  // canonical tensors by their first stored part
  std::unordered_set<std::string> seen;
  for (const auto& spec : specs)
    if (seen.insert(spec.canonical).second) order.push_back(&canonical.at(spec.canonical));
  std::deque<std::future<at::Tensor>> drawn;
  size_t next = 0;
  const size_t ahead = std::max(1u, std::thread::hardware_concurrency());
  auto draw = [&] {
    for (; drawn.size() < ahead && next < order.size(); ++next)
      drawn.push_back(std::async(std::launch::async, random_tensor, std::cref(*order[next]), seed));
    at::Tensor t = drawn.front().get();
    drawn.pop_front();
    return t;
  };
  std::unordered_map<std::string, at::Tensor> pending;
  for (const auto& spec : specs) {
    const auto it = pending.find(spec.canonical);
    const at::Tensor t = it != pending.end() ? it->second : draw();
    if (it == pending.end() && spec.op == Source::Op::Concat0) pending.emplace(spec.canonical, t);
    if (spec.op == Source::Op::Concat0 && --parts_left.at(spec.canonical) == 0) pending.erase(spec.canonical);
    const at::Tensor c = stored_part(spec.canonical, spec.op, t, spec.row_offset, spec.shape).to(dtype).contiguous();
    w.write(std::span<const std::byte>(static_cast<const std::byte*>(c.data_ptr()), c.nbytes()));
    if (progress) progress({w.written(), w.count(), w.bytes_written(), w.file_bytes()});
  }
  w.commit();
}

}  // namespace sp::models
