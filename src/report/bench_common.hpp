// What the benchmark commands share (report/bench.cpp, report/bench_residency.cpp): a case's
// model with random weights, repeated metered calls.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "models/builder.hpp"
#include "recognize/recognize.hpp"
#include "report/bench.hpp"
#include "report/report.hpp"

namespace sp::report {

// A case's model with random weights generated on the device and random inputs.
struct CaseModel {
  recognize::FamilyConfig cfg;
  models::Instance inst;
};
CaseModel build_case(const BenchCase& c, const contracts::Registry& reg, const at::Device& device,
                     const BenchOptions& opt, Progress* progress = nullptr);

// `reps` metered calls of f: the median time, the largest peak, the last output.
struct Repeated {
  double ms = 0;
  int64_t peak = 0;
  at::Tensor out;
};
Repeated repeat(const at::Device& device, int reps, const std::function<at::Tensor()>& f);

}  // namespace sp::report
