// Python functions called from C++ while a planned run holds no GIL: attention consumers
// (consumers.hpp) and weight hooks (streamplan.apply(weight_hook=...)).
//
// Design note. A Python object a C++ callback keeps is held through keep(): its last
// reference may be dropped on a thread without the GIL, so dropping it takes the GIL first.
// A callback takes the GIL for the call only and checks what Python returned before C++
// uses it; a Python exception travels out of the planned run as itself.
#pragma once

#include <torch/extension.h>

#include <memory>

#include "host/module_weights.hpp"

namespace sp::python {

inline std::shared_ptr<pybind11::object> keep(pybind11::object o) {
  return std::shared_ptr<pybind11::object>(new pybind11::object(std::move(o)), [](pybind11::object* p) {
    pybind11::gil_scoped_acquire gil;
    delete p;
  });
}

// fn(name: str, tensor: Tensor) -> Tensor as a host::WeightHook. Throws std::invalid_argument
// naming the weight where fn returns something other than a tensor (ModuleWeights checks the
// shape and device).
host::WeightHook python_weight_hook(const pybind11::function& fn);

}  // namespace sp::python
