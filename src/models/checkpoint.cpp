#include "models/checkpoint.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <functional>

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
  const bool weight = canonical.size() > 7 && canonical.compare(canonical.size() - 7, 7, ".weight") == 0;
  return (weight && t.dim() > 2) ? t.reshape({t.size(0), -1}) : t;
}

}  // namespace

std::shared_ptr<exec::TensorWeights> load_canonical(const io::SafetensorsFile& f, const recognize::Recognized& r,
                                                    at::ScalarType dtype, const at::Device& device,
                                                    const contracts::Registry& reg) {
  auto w = std::make_shared<exec::TensorWeights>(&reg);
  for (const auto& [canonical, src] : r.tensors) {
    std::vector<at::Tensor> parts;
    for (const auto& n : src.tensors) parts.push_back(read_tensor(f, n));
    at::Tensor t = src.op == Source::Op::Concat0 ? at::cat(parts, 0) : parts.at(0);
    if (src.op == Source::Op::SwapHalves0) t = swap_halves(t, src.tensors.at(0));
    t = as_linear(canonical, t);
    w->add(canonical, t.is_floating_point() ? t.to(device, dtype) : t.to(device));
  }
  return w;
}

namespace {

// Scales a standard normal draw into the kind of values the tensor holds: norm weights and
// scales near 1, small biases and modulation tables, matrices with std 1/sqrt(fan in).
void shape_values(const recognize::TensorSpec& spec, at::Tensor& t) {
  const std::string& n = spec.name;
  const bool bias = n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
  if (spec.shape.size() == 1 && !bias) {
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

}  // namespace

std::map<std::string, at::Tensor> random_canonical(const recognize::FamilyConfig& config, uint64_t seed) {
  std::map<std::string, at::Tensor> out;
  for (const auto& spec : recognize::checkpoint_tensors(config, "original")) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(tensor_seed(seed, spec.name));
    at::Tensor t = at::randn(spec.shape, gen, at::TensorOptions().dtype(at::kFloat));
    shape_values(spec, t);
    out[spec.name] = t;
  }
  return out;
}

std::shared_ptr<exec::TensorWeights> random_weights_on(const recognize::FamilyConfig& config, const at::Device& device,
                                                       at::ScalarType dtype, uint64_t seed,
                                                       const contracts::Registry& reg) {
  auto w = std::make_shared<exec::TensorWeights>(&reg);
  for (const auto& spec : recognize::checkpoint_tensors(config, "original")) {
    at::manual_seed(tensor_seed(seed, spec.name));
    at::Tensor t = at::randn(spec.shape, at::TensorOptions().dtype(dtype).device(device));
    shape_values(spec, t);
    w->add(spec.name, as_linear(spec.name, t));
  }
  return w;
}

void write_random_checkpoint(const recognize::FamilyConfig& config, const std::string& layout,
                             const std::string& path, uint64_t seed, at::ScalarType dtype) {
  const auto canonical = random_canonical(config, seed);
  io::SafetensorsWriter w;
  w.set_metadata(kSidecarKey, recognize::to_json(recognize::sidecar_for(config)));
  w.set_metadata("streamplan.variant", config.variant);
  for (const auto& spec : recognize::checkpoint_tensors(config, layout)) {
    at::Tensor t = canonical.at(spec.canonical);
    if (spec.op == Source::Op::Concat0) t = t.narrow(0, spec.row_offset, spec.shape.at(0));
    if (spec.op == Source::Op::SwapHalves0) t = swap_halves(t, spec.canonical);
    add_tensor(w, spec.name, t.reshape(spec.shape).to(dtype));
  }
  w.write(path);
}

}  // namespace sp::models
