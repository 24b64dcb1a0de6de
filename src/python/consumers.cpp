#include "python/consumers.hpp"

#include <cmath>

#include "exec/consumers/consumer.hpp"
#include "exec/formats/weights.hpp"
#include "python/callbacks.hpp"

namespace py = pybind11;

namespace sp::python {

namespace {

std::string shape_text(const at::Tensor& t) {
  return exec::shape_text(t) + " " + c10::toString(t.scalar_type()) + " on " + t.device().str();
}

struct Consumer : exec::ConsumerImpl {
  std::string name;
  std::shared_ptr<py::object> fn;

  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) const override {
    contracts::AttnCall whole;
    whole.queries = {0, q.size(2)};
    return attend_rows(q, k, v, scale, whole);
  }
  at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                         const contracts::AttnCall& call) const override {
    const double standard = 1.0 / std::sqrt(double(q.size(3)));
    if (std::abs(scale - standard) > 1e-9 * standard)
      throw std::invalid_argument("consumer '" + name + "': the model scales scores by " + std::to_string(scale) +
                                  ", a Python consumer computes softmax(q k^T / sqrt(head_dim))");
    py::gil_scoped_acquire gil;
    py::object r = (*fn)(q, k, v, call.q_begin - call.queries.begin, call.queries.size(), call.layer);
    if (!THPVariable_Check(r.ptr()))
      throw std::invalid_argument("consumer '" + name + "' returned " + std::string(py::str(py::type::of(r))) +
                                  ", not a tensor");
    at::Tensor out = r.cast<at::Tensor>();
    if (out.sizes() != q.sizes() || out.scalar_type() != q.scalar_type() || out.device() != q.device())
      throw std::invalid_argument("consumer '" + name + "' returned " + shape_text(out) + "; expected the Q slab's " +
                                  shape_text(q));
    return out;
  }
};

contracts::Cap cap_of(const py::dict& caps, const char* key) {
  if (!caps.contains(key) || caps[key].is_none()) return contracts::Cap::Unknown;
  return caps[key].cast<bool>() ? contracts::Cap::Yes : contracts::Cap::No;
}

}  // namespace

contracts::ConsumerCaps python_consumer(const std::string& name, const py::function& fn, const py::dict& caps) {
  contracts::ConsumerCaps c;
  c.name = name;
  c.description = "Python function " + std::string(py::str(fn.attr("__qualname__")));
  c.accepts_bounded_q = cap_of(caps, "accepts_bounded_q");
  c.requires_global_k = cap_of(caps, "requires_global_k");
  c.requires_global_v = cap_of(caps, "requires_global_v");
  c.slab_output = cap_of(caps, "slab_output");
  c.strided_heads = cap_of(caps, "strided_heads");
  c.positions = contracts::Cap::Yes;  // it is given its Q slab's first row
  if (caps.contains("dtypes"))
    for (const auto& d : caps["dtypes"]) c.dtypes.insert(ir::parse_dtype(d.cast<std::string>(), "caps['dtypes']"));
  if (caps.contains("q_align")) c.q_align = caps["q_align"].cast<int64_t>();
  if (caps.contains("kv_align")) c.kv_align = caps["kv_align"].cast<int64_t>();
  if (caps.contains("call_allocations")) c.call_allocations = caps["call_allocations"].cast<int>();
  if (caps.contains("call_bytes") && !caps["call_bytes"].is_none()) {
    auto bytes = keep(caps["call_bytes"]);
    c.call_bytes = [bytes](const contracts::AttnShape& s) {
      py::gil_scoped_acquire gil;
      py::dict d;
      d["q_rows"] = s.q_rows;
      d["kv_rows"] = s.kv_rows;
      d["heads"] = s.heads;
      d["kv_heads"] = s.kv_heads;
      d["head_dim"] = s.head_dim;
      d["dtype"] = ir::to_string(s.dtype);
      d["device"] = s.device == contracts::DeviceKind::CUDA ? "cuda" : "cpu";
      return (*bytes)(d).cast<int64_t>();
    };
  } else {
    c.call_bytes = [](const contracts::AttnShape& s) {
      return s.q_rows * s.heads * s.head_dim * static_cast<int64_t>(ir::dtype_size(s.dtype));
    };
  }
  auto impl = std::make_shared<Consumer>();
  impl->name = name;
  impl->fn = keep(fn);
  c.impl = impl;
  return c;
}

}  // namespace sp::python
