#include "models/lora_file.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>

#include "models/tensor_io.hpp"
#include "recognize/lora_names.hpp"

namespace sp::models {

namespace {

using exec::shape_text;

struct Module {
  at::Tensor down, up, alpha;
  std::string down_key, up_key, alpha_key;
};

}  // namespace

LoraInput read_lora(const std::string& spec) {
  LoraInput in{spec, {}, 1.0};
  const auto colon = spec.rfind(':');
  // A colon inside a directory name ("a:b/F") is part of the path, as is any in an existing file's name.
  if (colon != std::string::npos && spec.find('/', colon) == std::string::npos && ::access(spec.c_str(), F_OK) != 0) {
    const std::string tail = spec.substr(colon + 1);
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(tail.c_str(), &end);
    if (tail.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
      throw std::invalid_argument("--lora: strength '" + tail + "' is not a number in '" + spec + "'");
    in.name = spec.substr(0, colon);
    in.strength = v;
  }
  in.tensors = read_tensors(in.name);
  return in;
}

std::string lora_hint(const std::string& path) {
  size_t parts = 0, total = 0;
  try {
    const auto f = io::SafetensorsFile::open(path);
    for (const auto& n : f.names()) parts += recognize::parse_lora_key(n).has_value();
    total = f.size();
  } catch (const std::exception&) {
    return {};
  }
  if (parts == 0 || 2 * parts < total) return {};
  return "; '" + path + "' looks like a LoRA (lora_A/lora_down tensors); pass it with --lora";
}

LoraSet load_loras(const std::vector<LoraInput>& inputs, const recognize::FamilyConfig& config, at::ScalarType dtype,
                   const at::Device& device) {
  LoraSet set;
  if (inputs.empty()) return set;
  const recognize::LoraNames names(config);
  for (size_t fi = 0; fi < inputs.size(); ++fi) {
    const LoraInput& in = inputs[fi];
    const std::string file = "LoRA '" + in.name + "'";
    std::map<std::string, Module> modules;
    for (const auto& [key, t] : in.tensors) {
      const auto k = recognize::parse_lora_key(key);
      if (!k) {
        set.unmatched.push_back(in.name + ": " + key);
        continue;
      }
      Module& m = modules[k->module];
      if (k->part == recognize::LoraPart::Down) m.down = t, m.down_key = key;
      else if (k->part == recognize::LoraPart::Up) m.up = t, m.up_key = key;
      else m.alpha = t, m.alpha_key = key;
    }
    size_t matched = 0;
    for (const auto& [module, m] : modules) {
      const auto target = names.find(module);
      auto keys = [&] {
        std::vector<std::string> ks;
        for (const std::string* k : {&m.down_key, &m.up_key, &m.alpha_key})
          if (!k->empty()) ks.push_back(*k);
        return ks;
      };
      if (!target) {
        for (const auto& k : keys()) set.unmatched.push_back(in.name + ": " + k);
        continue;
      }
      ++matched;
      if (!m.down.defined() || !m.up.defined())
        throw std::invalid_argument(file + ": '" + module + "' has " + (m.down.defined() ? "lora_A/down '" + m.down_key : "lora_B/up '" + m.up_key) +
                                    "' but no " + (m.down.defined() ? "lora_B/up" : "lora_A/down") + " tensor");
      const recognize::LoraTarget& tg = *target;
      if (tg.shape.size() != 2) {
        for (const auto& k : keys())
          set.unapplied.push_back(in.name + ": " + k + " (" + tg.tensor + " is not a linear weight)");
        continue;
      }
      const at::Tensor A = m.down.dim() == 4 ? m.down.flatten(1) : m.down, B = m.up.dim() == 4 ? m.up.flatten(1) : m.up;
      if (A.dim() != 2 || B.dim() != 2 || A.size(0) != B.size(1))
        throw std::invalid_argument(file + ": '" + m.down_key + "' " + shape_text(m.down) + " and '" + m.up_key + "' " +
                                    shape_text(m.up) + " are not A [rank, in] and B [out, rank] of one rank");
      const int64_t rank = A.size(0), out = tg.shape[0], inf = tg.shape[1];
      if (A.size(1) != inf || B.size(0) != out)
        throw std::invalid_argument(file + ": '" + m.down_key + "' " + shape_text(A) + " and '" + m.up_key + "' " +
                                    shape_text(B) + " do not fit weight '" + tg.tensor + "' [" + std::to_string(out) +
                                    ", " + std::to_string(inf) + "] (expected A [rank, " + std::to_string(inf) +
                                    "], B [" + std::to_string(out) + ", rank])");
      double scale = in.strength;
      if (m.alpha.defined()) {
        if (m.alpha.numel() != 1)
          throw std::invalid_argument(file + ": alpha '" + m.alpha_key + "' has shape " + shape_text(m.alpha) +
                                      ", expected one number");
        scale = in.strength * m.alpha.item<double>() / double(rank);
      }
      at::Tensor b = B;
      if (tg.op == recognize::Source::Op::SwapHalves0) b = at::cat({B.narrow(0, out / 2, out - out / 2), B.narrow(0, 0, out / 2)});
      const std::string stem = "lora." + std::to_string(fi) + "." + module;
      ir::LoraAdapter ad{stem + ".A", stem + ".B", rank, scale, tg.row_offset, out};
      set.tensors[ad.a] = A.to(device, dtype).contiguous();
      set.tensors[ad.b] = b.to(device, dtype).contiguous();
      set.adapters[tg.canonical].push_back(std::move(ad));
    }
    if (matched == 0)
      throw std::invalid_argument(file + ": none of its " + std::to_string(in.tensors.size()) + " keys (e.g. '" +
                                  (in.tensors.empty() ? std::string() : in.tensors.begin()->first) +
                                  "') names a weight of this " + config.family + " model; is it made for another model?");
  }
  return set;
}

void add_random_loras(ir::Model& m, exec::TensorWeights& w, int64_t rank, at::ScalarType dtype,
                      const at::Device& device, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  int n = 0;
  ir::for_each_linear(m, [&](ir::Linear& l) {
    const std::string stem = "lora.random." + std::to_string(n++);
    ir::LoraAdapter a{stem + ".A", stem + ".B", rank, 1.0, 0, l.out_features};
    // Small updates (|B A| about 1% of a unit-variance weight): the output stays in range.
    w.add(a.a, (at::randn({rank, l.in_features}, gen).to(opts) / std::sqrt(double(l.in_features))).to(dtype));
    w.add(a.b, (at::randn({l.out_features, rank}, gen).to(opts) * 0.01).to(dtype));
    l.loras.push_back(std::move(a));
  });
}

std::vector<std::string> LoraSet::attach(ir::Model& m) {
  std::set<std::string> used;
  ir::for_each_linear(m, [&](ir::Linear& l) {
    auto it = adapters.find(l.weight);
    if (it == adapters.end()) return;
    l.loras = it->second;
    used.insert(l.weight);
  });
  std::vector<std::string> missing;
  for (const auto& [weight, ads] : adapters) {
    if (used.count(weight)) continue;
    const std::string line = weight + " (" + std::to_string(ads.size()) +
                             " adapter(s); the run computes this weight outside its planned projections)";
    missing.push_back(line);
    if (std::find(unapplied.begin(), unapplied.end(), line) == unapplied.end()) unapplied.push_back(line);
  }
  return missing;
}

int64_t LoraSet::adapter_count() const {
  int64_t n = 0;
  for (const auto& [w, a] : adapters) n += int64_t(a.size());
  return n;
}

nlohmann::json LoraSet::json() const {
  return {{"adapters", adapter_count()}, {"unmatched", unmatched}, {"unapplied", unapplied}};
}

std::string LoraSet::summary() const {
  std::ostringstream s;
  s << adapter_count() << " LoRA adapter(s) on " << adapters.size() << " weight(s)";
  if (!unmatched.empty()) s << "; " << unmatched.size() << " key(s) match no weight";
  if (!unapplied.empty()) s << "; " << unapplied.size() << " not applied";
  s << "\n";
  for (const auto& k : unmatched) s << "  unmatched: " << k << "\n";
  for (const auto& k : unapplied) s << "  not applied: " << k << "\n";
  return s.str();
}

}  // namespace sp::models
