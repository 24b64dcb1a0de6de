// Weights of a live host module: the tensors of a PyTorch module's state_dict(), recognized
// through the checkpoint tables and acquired without copies.
//
// Design note. A renamed canonical tensor (Copy) is a view of the module's tensor (a
// convolution kernel that acts as a linear is viewed flat). A Linear whose weight is a
// concatenation (Concat0: diffusers' split q/k/v of a fused projection) is acquired from the
// part that holds the rows the program asks for, a view again; only an acquire whose rows span
// parts assembles them, into the buffer the program placed where it placed one. Tensors read
// whole that the module does not hold as such (the biases of split projections, a modulation
// weight with swapped halves) are held as copies (copies()), assembled again by refresh() (a few
// small tensors: cheap beside a forward), so that a forward always sees the current weights.
//
// A host may hook module tensors (set_hook): each read of a hooked tensor calls the hook with its
// state_dict name and uses what it returns (ComfyUI's cast-and-patch path). A Linear served from
// hooked tensors runs in the format "host-hook" (mark_hooked): the whole hooked weight lives only
// during the acquire, as the step's transient. Nothing hooked is kept between reads.
//
// Quantized weights (ComfyUI's fp8 casts, scaled fp8 and comfy_quant tensors, recognize/quant.hpp)
// are read in place: the stored tensor is the canonical weight, its scale the format's
// "<weight>.scale" (quantized.hpp; a held fp32 1 where none is stored), and each Linear served
// from one runs in the matching format (mark_quantized). A hook, and the prologue through
// prologue_view(), get such a weight dequantized in the compute dtype, one weight at a time.
// Other 8-bit float tensors (biases and norms a host keeps in fp8) are held cast to their dtype.
//
// Example:
//     sp::host::NamedTensors t = ...;   // state_dict() of a diffusers FluxTransformer2DModel
//     sp::recognize::Recognized r = sp::host::recognize_module(t, sidecar);
//     sp::host::ModuleWeights w(t, r, &reg);
//     w.refresh();                      // before each forward
//     at::Tensor q = w.acquire(qkv, {0, dim}, {}, at::kFloat);   // a view of attn.to_q.weight
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "exec/formats/weights.hpp"
#include "recognize/recognize.hpp"

namespace sp::host {

// A module's tensors by state_dict() name, in its order.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Recognizes a module from its tensors' names, shapes and dtypes, as recognize::recognize
// does a checkpoint. Throws recognize::RecognizeError, or std::invalid_argument naming a
// tensor whose dtype no checkpoint can hold.
recognize::Recognized recognize_module(const NamedTensors& tensors, const std::optional<recognize::Sidecar>& sidecar);

// F32, BF16 or F16 for those ATen types; none for any other.
std::optional<ir::DType> float_dtype(at::ScalarType t);

// A host's weight hook: (state_dict name, the module's tensor) -> the tensor to compute with,
// of the same shape, on the same device.
using WeightHook = std::function<at::Tensor(const std::string& name, const at::Tensor& tensor)>;

class ModuleWeights;

// The format "host-hook" of the Linears served from `w`'s hooked tensors, added to `reg` with the
// model dtype: acquired whole through the hook from the weight source of the run (the module's
// tensors, or the streamed slots), then sliced; not dense, so that the program places a buffer
// for each acquired slice. `w` must outlive the registry's use.
void register_hook_format(contracts::Registry& reg, ir::DType model, const ModuleWeights* w);
inline constexpr const char* kHookFormat = "host-hook";

class ModuleWeights : public exec::WeightSource {
 public:
  // Throws std::invalid_argument naming a tensor the recognition refers to that `tensors`
  // lacks, or a quantized weight joined from several tensors. `reg` must outlive this object.
  // `compute`: the model's activation dtype (what 8-bit tensors are cast to).
  ModuleWeights(const NamedTensors& tensors, const recognize::Recognized& r, const contracts::Registry* reg,
                ir::DType compute);
  ~ModuleWeights() override;

  at::Tensor tensor(const std::string& name) const override;
  bool contains(const std::string& name) const override;
  at::Tensor acquire(const ir::Linear& l, exec::Slice rows, exec::Slice cols, at::ScalarType dtype,
                     const at::Tensor& out = {}) const override;

  // Assembles the held copies again from the module's tensors.
  void refresh();
  // Every canonical tensor: a view of the module's tensor, or assembled now (not held); and
  // the quantized weights' scales by their formats' names ("<weight>.scale", ...).
  std::vector<std::pair<std::string, at::Tensor>> canonical_tensors() const;

  // Hooks the module tensors named (state_dict names; all of them where `names` is empty).
  // Throws std::invalid_argument naming a name the module does not hold.
  void set_hook(WeightHook hook, const std::vector<std::string>& names);
  bool hooked(const std::string& canonical) const { return hooked_canon_.count(canonical) != 0; }
  // A hooked canonical weight whole, with its stored form read from `src` (this, or the streamed
  // slots that hold it elsewhere), dequantized or cast as the hook takes it, each hooked part
  // passed through the hook.
  at::Tensor hooked_tensor(const std::string& canonical, const exec::WeightSource& src) const;
  // Sets the format of every Linear served from hooked tensors to "host-hook".
  void mark_hooked(ir::Model& m) const;
  // Linear::stored from the dtype the module holds each floating weight in: set where it is not
  // the model's (a host that keeps an input projection in fp32 in a 16-bit model), cleared where
  // the family's default says fp32 but the module holds the model's dtype.
  void mark_stored(ir::Model& m) const;
  // Sets the format of every Linear whose weight the module holds quantized (before
  // mark_hooked: a hooked weight runs through the hook).
  void mark_quantized(ir::Model& m) const;
  // These weights as the family's prologue reads them: a quantized weight dequantized (whole,
  // in its dtype, not held), everything else as tensor() and acquire() serve it.
  const exec::WeightSource& prologue_view() const { return *prologue_; }
  // The same reads from `stored`, which holds these weights elsewhere in their stored form (the
  // streamed weights): a quantized one dequantized from its tensors there. `stored` must
  // outlive the view.
  std::unique_ptr<exec::WeightSource> prologue_over(const exec::WeightSource& stored) const;
  // One tensor as prologue_view() serves it (from `stored` where given).
  at::Tensor prologue_tensor(const std::string& name, const exec::WeightSource* stored = nullptr) const;
  // x·Wᵀ (+ bias) of a weight the module holds quantized, unhooked, through its format's GEMM
  // where x's device runs it natively (as the host computes it); undefined elsewhere.
  at::Tensor prologue_linear(const std::string& name, const at::Tensor& x, const at::Tensor& bias,
                             const exec::WeightSource* stored = nullptr) const;

  struct Copy {
    std::string name;  // canonical name
    int64_t bytes = 0;
  };
  // The tensors held as copies so far, by canonical name.
  std::vector<Copy> copies() const;
  // Per canonical tensor that is not held: the data pointers of the module tensors it is
  // served from (the view's, or each part's).
  std::map<std::string, std::vector<const void*>> storage() const;

 private:
  struct Canonical {
    recognize::Source src;
    std::vector<at::Tensor> parts;  // the module's tensors, in the order of src.tensors
    at::Tensor view;                // Copy that is a view of its part; else undefined
    std::vector<int64_t> offsets;   // Concat0: first canonical row of each part
  };
  const Canonical& canonical(const std::string& name) const;
  at::Tensor hooked_part(const std::string& module_name, const at::Tensor& t) const;
  // `in` (a module tensor as the hook takes it) through the hook where that tensor is hooked.
  at::Tensor hook_part(const std::string& module_name, const at::Tensor& in) const;
  const at::Tensor& held(const std::string& name, const Canonical& c) const;
  at::Tensor acquire_spanning(const ir::Linear& l, const Canonical& c, exec::Slice rows, exec::Slice cols,
                              at::ScalarType dtype, const at::Tensor& out) const;

  // use(source, Linear) of a quantized canonical, unhooked: the Linear its name, shape and format,
  // the source `stored` where given, else the module's tensors.
  using StoredUse = std::function<at::Tensor(const exec::WeightSource&, const ir::Linear&)>;
  at::Tensor with_stored(const std::string& name, const exec::WeightSource* stored, const StoredUse& use) const;
  // A quantized canonical through its format, unhooked (from `stored` where given).
  at::Tensor dequantized(const std::string& name, const exec::WeightSource* stored = nullptr) const;
  at::ScalarType dtype_of(const std::string& canonical) const;
  // Assembled from the module's tensors now, cast to its dtype where the module holds it in an
  // 8-bit float (not quantized).
  at::Tensor assembled(const std::string& name, const Canonical& c) const;

  const contracts::Registry* reg_;
  recognize::FamilyConfig config_;
  at::ScalarType compute_;
  std::map<std::string, Canonical> canon_;
  std::map<std::string, recognize::QuantSpec> specs_;  // canonical -> its quantization
  std::map<std::string, at::Tensor> side_;              // "<canonical>.scale" / ".input_scale" -> tensor
  std::map<std::string, std::string> quantized_part_;  // module tensor -> the quantized canonical it is
  std::set<std::string> cast_;                          // canonicals held cast from an 8-bit float
  std::unique_ptr<exec::WeightSource> prologue_;
  std::map<std::string, at::Tensor> parts_;  // module tensors by part key (see part_key)
  WeightHook hook_;
  std::set<std::string> hooked_parts_;  // state_dict names
  std::set<std::string> hooked_canon_;  // canonical names served from any of them
  mutable std::mutex mutex_;                 // held_
  mutable std::map<std::string, at::Tensor> held_;
};

}  // namespace sp::host
