#include "python/callbacks.hpp"

namespace py = pybind11;

namespace sp::python {

host::WeightHook python_weight_hook(const py::function& fn) {
  std::shared_ptr<py::object> f = keep(fn);
  return [f](const std::string& name, const at::Tensor& t) -> at::Tensor {
    py::gil_scoped_acquire gil;
    py::object r = (*f)(name, t);
    if (!THPVariable_Check(r.ptr()))
      throw std::invalid_argument("weight hook: for '" + name + "' it returned " +
                                  py::str(py::type::of(r).attr("__name__")).cast<std::string>() + ", not a tensor");
    return THPVariable_Unpack(r.ptr());
  };
}

}  // namespace sp::python
