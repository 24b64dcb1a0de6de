// dense: weights stored in the model's activation dtype, handed out as views. Acquiring
// for another compute dtype (the fp32 final projection) converts into the placed buffer.
#include "exec/consumers/consumer.hpp"
#include "exec/formats/weights.hpp"

namespace sp::exec::formats {

namespace {

struct Dense : FormatImpl {
  void store(TensorWeights& into, const ir::Linear& l, const at::Tensor& w, at::ScalarType model) const override {
    into.add(l.weight, w.to(model));
  }
  at::Tensor acquire(const WeightSource& src, const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype,
                     const at::Tensor& out) const override {
    const at::Tensor view = stored_slice(src, l, rows, cols);
    if (view.scalar_type() == dtype) return view;
    if (!out.defined())
      throw std::invalid_argument("weight '" + l.weight + "' is " + std::string(c10::toString(view.scalar_type())) +
                                  " but compute dtype is " + c10::toString(dtype) + " (format " + l.format + ")");
    out.copy_(view);
    return out;
  }
};

}  // namespace

void register_dense(contracts::Registry& reg) {
  using contracts::Cap;
  contracts::FormatCaps f;
  f.name = "dense";
  f.description = "weights stored in the activation dtype";
  f.dense = true;
  f.out_slicing = f.in_slicing = f.held_execution = Cap::Yes;
  f.impl = std::make_shared<Dense>();
  reg.add(f);
}

}  // namespace sp::exec::formats
