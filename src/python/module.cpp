// streamplan._C: the C++ side of the Python package (python/streamplan). Tensors cross as
// at::Tensor through torch's own pybind11 casters, without copies; everything else is
// plain Python data. The package's typed API wraps these; see python/streamplan/_C.pyi.
#include <torch/extension.h>
#include <torch/headeronly/version.h>

#include "exec/consumers/consumer.hpp"
#include "exec/device/memory.hpp"
#include "exec/dist/exchange.hpp"
#include "exec/formats/weights.hpp"
#include "exec/registry.hpp"
#include "host/attached.hpp"
#include "python/callbacks.hpp"
#include "python/consumers.hpp"
#include "plan/budget.hpp"
#include "plan/kv_budget.hpp"
#include "recognize/sidecar.hpp"
#include "report/report.hpp"
#include "exec/run/retry.hpp"

namespace py = pybind11;

namespace sp::python {

namespace {

py::dict config_dict(const recognize::FamilyConfig& c) {
  py::dict d;
  d["family"] = c.family;
  d["variant"] = c.variant;
  d["dim"] = c.dim;
  d["heads"] = c.heads;
  d["head_dim"] = c.head_dim;
  d["ffn"] = c.ffn;
  d["layers"] = c.layers;
  d["single_layers"] = c.single_layers;
  d["in_channels"] = c.in_channels;
  d["out_channels"] = c.out_channels;
  d["text_dim"] = c.text_dim;
  d["patch"] = py::make_tuple(c.patch[0], c.patch[1], c.patch[2]);
  d["guidance"] = c.guidance;
  d["eps"] = c.eps;
  d["rope_theta"] = c.rope_theta;
  d["rope_axes_dim"] = c.rope_axes_dim;
  return d;
}

const host::GeometryPlan& find_plan(const host::Attached& a, const std::optional<std::string>& key) {
  if (!key) {
    if (!a.last()) throw std::invalid_argument("no plan yet: plans are made per geometry, on the module's first call with it");
    return *a.last();
  }
  std::string known;
  for (const auto* g : a.plans()) {
    if (g->key == *key) return *g;
    known += (known.empty() ? "" : "; ") + g->key;
  }
  throw std::invalid_argument("geometry '" + *key + "': no plan for it (planned: " + (known.empty() ? "none" : known) + ")");
}

// `python_consumers`: (name, function, caps) of consumers registered from Python, added to
// the built-in registry of this attachment.
std::unique_ptr<host::Attached> attach(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                       const std::optional<std::string>& sidecar_json, const std::string& consumer,
                                       const std::string& budget, int64_t token_chunk, int64_t feature_slice,
                                       const std::vector<std::tuple<std::string, py::function, py::dict>>& python_consumers,
                                       const std::optional<py::function>& weight_hook, const std::vector<std::string>& hooked,
                                       const std::vector<std::tuple<std::string, std::map<std::string, at::Tensor>, double>>& loras,
                                       int64_t device_memory, int resident_blocks, const std::string& device,
                                       double kv_budget, const std::string& dtype, bool in_place,
                                       const std::optional<exec::dist::Group>& process_group,
                                       const std::string& sequence_parallel, std::optional<bool> shard_weights,
                                       double link_rate) {
  std::optional<recognize::Sidecar> sidecar;
  if (sidecar_json) sidecar = recognize::parse_sidecar(*sidecar_json, "<module config>");
  host::AttachOptions o;
  o.consumer = consumer;
  o.budget = budget;
  o.token_chunk = token_chunk;
  o.feature_slice = feature_slice;
  if (weight_hook) {
    o.weight_hook = python_weight_hook(*weight_hook);
    o.hooked = hooked;
  }
  for (const auto& [name, tensors, strength] : loras) o.loras.push_back({name, tensors, strength});
  o.device_memory = device_memory;
  o.resident_blocks = resident_blocks;
  o.device = device;
  o.in_place = in_place;
  o.dtype = dtype;
  o.kv_budget = kv_budget;
  if (process_group) o.process_group = *process_group;
  o.link_bytes_per_s = link_rate;
  if (sequence_parallel != "ulysses" && sequence_parallel != "ring")
    throw std::invalid_argument("sequence_parallel: expected 'ulysses' or 'ring', got '" + sequence_parallel + "'");
  o.sequence_mode = sequence_parallel == "ring" ? plan::SeqMode::Ring : plan::SeqMode::Ulysses;
  o.weight_split = !shard_weights ? plan::WeightSplit::Auto
                  : *shard_weights ? plan::WeightSplit::Sharded
                                   : plan::WeightSplit::Replicated;
  contracts::Registry reg = exec::builtin_registry();
  for (const auto& [name, fn, caps] : python_consumers) {
    if (reg.has_consumer(name)) throw std::invalid_argument("consumer '" + name + "' is registered already");
    reg.add(python_consumer(name, fn, caps));
  }
  return std::make_unique<host::Attached>(tensors, sidecar, o, std::move(reg));
}

}  // namespace

}  // namespace sp::python

PYBIND11_MODULE(_C, m) {
  using namespace sp;
  m.doc() = "streamplan's C++ core: recognition, planning and the planned executor for live modules";

  py::register_exception<recognize::RecognizeError>(m, "RecognizeError", PyExc_ValueError);
  py::register_exception<plan::BudgetError>(m, "BudgetError", PyExc_ValueError);
  py::register_exception<plan::DeviceMemoryError>(m, "DeviceMemoryError", PyExc_ValueError);
  py::register_exception<exec::OutOfMemory>(m, "OutOfMemoryError", PyExc_MemoryError);

  m.attr("__version__") = STREAMPLAN_VERSION;
  m.attr("torch_version") = TORCH_VERSION;  // the torch headers the extension was built against
  m.attr("build_kind") = STREAMPLAN_BUILD_KIND;
  m.attr("plan_cache_size") = sp::host::kPlanCacheSize;  // plans kept per handle (least recently used go)
  // Bytes of CPU tensors alive now that streamplan's counting CPU allocator (installed by the
  // first call) allocated.
  m.def("cpu_allocated_bytes", [] {
    sp::exec::install_cpu_meter();
    return sp::exec::cpu_live_bytes();
  });
  // What `streamplan --version` prints too: the CUDA kernels' architectures ("sm_90, sm_90a"; empty
  // in a CPU build), the nvcc that compiled them, and whether the fused 8-bit GEMM for sm_90a is in.
  m.attr("cuda_archs") = STREAMPLAN_CUDA_ARCHS;
  m.attr("nvcc_version") = STREAMPLAN_NVCC_VERSION;
#ifdef STREAMPLAN_SCALED_GEMM_SM90
  m.attr("fused_8bit_gemm") = true;
#else
  m.attr("fused_8bit_gemm") = false;
#endif

  m.def("consumers", [] { return exec::builtin_registry().consumer_names(); },
        "Names of the registered attention consumers.");
  m.def("parse_budget", &plan::parse_budget, py::arg("text"), "Bytes of a budget such as '12GiB'.");
  m.def(
      "consumer_unusable",
      [](const std::string& name, const std::string& device, const std::string& dtype) -> std::string {
        const auto reg = exec::builtin_registry();
        if (!reg.has_consumer(name)) return {};  // a consumer written in Python runs wherever its function does
        return exec::consumer_unusable(reg, name, at::Device(device), ir::parse_dtype(dtype, "dtype"));
      },
      py::arg("name"), py::arg("device"), py::arg("dtype"),
      "Why the built-in consumer cannot run on the device in the dtype (its kernels' requirements and "
      "self-test there), or '' where it can.");
  m.def("shares", &exec::dist::shares, py::arg("n"), py::arg("ranks"),
        "n items over `ranks` ranks, the first n % ranks one more each.");
  m.def("rows_to_heads", &exec::dist::rows_to_heads, py::arg("group"), py::arg("x"), py::arg("rows"), py::arg("heads"),
        py::call_guard<py::gil_scoped_release>(),
        "Ulysses all-to-all over a torch.distributed group: this rank's x [rows[r], sum(heads), D] to every "
        "rank's rows of its heads [sum(rows), heads[r], D].");
  m.def("heads_to_rows", &exec::dist::heads_to_rows, py::arg("group"), py::arg("y"), py::arg("rows"), py::arg("heads"),
        py::call_guard<py::gil_scoped_release>(),
        "The inverse of rows_to_heads: y [sum(rows), heads[r], D] to [rows[r], sum(heads), D].");
  m.def("ulysses_attention", &exec::dist::ulysses_attention, py::arg("group"), py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("rows"), py::arg("scale"), py::call_guard<py::gil_scoped_release>(),
        "Ulysses attention over a torch.distributed group: this rank's rows q [rows[r], H, D], k, v "
        "[rows[r], G, D]; each rank attends its share of the K/V groups over every row.");
  m.def(
      "ring_attention",
      [](const exec::dist::Group& pg, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
         const std::vector<int64_t>& rows, double scale, int64_t q_chunk, const std::string& consumer) {
        if (consumer.empty()) return exec::dist::ring_attention(pg, q, k, v, rows, scale, q_chunk);
        const contracts::Registry reg = exec::builtin_registry();
        const auto& caps = reg.consumer(consumer);
        if (caps.lse != contracts::Cap::Yes)
          throw std::invalid_argument("ring_attention: consumer '" + consumer + "' returns no log-sum-exp");
        return exec::dist::ring_attention(pg, q, k, v, rows, scale, q_chunk, &exec::impl_of<exec::ConsumerImpl>(caps));
      },
      py::arg("group"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("rows"), py::arg("scale"),
      py::arg("q_chunk") = 0, py::arg("consumer") = "", py::call_guard<py::gil_scoped_release>(),
      "Ring attention over a torch.distributed group: this rank's q [n_q, H, D] against every rank's k, v "
      "[rows[r], G, D], the blocks passed around the ring, attended by `consumer` (a built-in one that returns "
      "the log-sum-exp; '': explicit scores in fp32) and merged by log-sum-exp.");
  m.def("sdpa_attention", &exec::sdpa_attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale"),
        "The 'sdpa' consumer's attention of q [B, H, rows, d] against k, v [B, H, kv_rows, d].");
  m.def(
      "sdpa_kernel",
      [](const std::string& device, const std::string& dtype, int64_t head_dim) {
        return exec::sdpa_kernel(at::Device(device), exec::to_aten(ir::parse_dtype(dtype, "dtype")), head_dim);
      },
      py::arg("device"), py::arg("dtype"), py::arg("head_dim") = 128,
      "The kernel the 'sdpa' consumer runs on the device in the dtype, and why (on CUDA: cuDNN's fused "
      "attention where it passed its self-test and ran no slower than ATen's own choice).");
  m.def(
      "kv_budget_at",
      [](int step, int steps, double budget, int early_steps, double early_kv, int late_steps, double late_kv) {
        return plan::kv_budget_at({budget, early_steps, early_kv, late_steps, late_kv}, step, steps);
      },
      py::arg("step"), py::arg("steps"), py::arg("budget") = 1.0, py::arg("early_steps") = 0, py::arg("early_kv") = 1.0,
      py::arg("late_steps") = 0, py::arg("late_kv") = 1.0, "The sparse attention budget of a denoising step.");

  py::class_<host::Attached>(m, "Attached")
      .def(py::init(&python::attach), py::arg("tensors"), py::arg("sidecar_json"), py::arg("consumer"),
           py::arg("budget"), py::arg("token_chunk") = 0, py::arg("feature_slice") = 0,
           py::arg("python_consumers") = std::vector<std::tuple<std::string, py::function, py::dict>>{},
           py::arg("weight_hook") = std::nullopt, py::arg("hooked") = std::vector<std::string>{},
           py::arg("loras") = std::vector<std::tuple<std::string, std::map<std::string, at::Tensor>, double>>{},
           py::arg("device_memory") = 0, py::arg("resident_blocks") = -1, py::arg("device") = "",
           py::arg("kv_budget") = 1.0, py::arg("dtype") = "", py::arg("in_place") = false,
           py::arg("process_group") = std::nullopt, py::arg("sequence_parallel") = "ulysses",
           py::arg("shard_weights") = std::nullopt, py::arg("link_rate") = 0.0)
      .def(
          "set_kv_budget",
          [](host::Attached& a, double budget) {
            if (a.options().consumer != "sparse")
              throw std::invalid_argument("kv_budget: the module runs consumer '" + a.options().consumer + "', not 'sparse'");
            a.set_kv_budget(budget);
          },
          py::arg("budget"))
      .def_property_readonly("lora",
                             [](const host::Attached& a) {
                               const auto& l = a.lora();
                               py::dict d;
                               d["adapters"] = l.adapter_count();
                               d["weights"] = l.adapters.size();
                               d["unmatched"] = l.unmatched;
                               d["unapplied"] = l.unapplied;
                               return d;
                             })
      .def_property_readonly("config", [](const host::Attached& a) { return python::config_dict(a.recognized().config); })
      .def_property_readonly("layout", [](const host::Attached& a) { return a.recognized().layout; })
      .def_property_readonly("dtype", [](const host::Attached& a) { return std::string(ir::to_string(a.dtype())); })
      .def_property_readonly("device", [](const host::Attached& a) { return a.device().str(); })
      .def_property_readonly("consumer", [](const host::Attached& a) { return a.options().consumer; })
      .def_property_readonly("budget", [](const host::Attached& a) { return a.options().budget; })
      .def("forward", &host::Attached::forward, py::arg("raw"), py::call_guard<py::gil_scoped_release>())
      .def("forward_named", &host::Attached::forward_named, py::arg("raw"), py::call_guard<py::gil_scoped_release>())
      .def("plans",
           [](const host::Attached& a) {
             py::list out;
             for (const auto* g : a.plans()) {
               py::dict d;
               d["key"] = g->key;
               d["calls"] = g->calls;
               d["estimated_peak_bytes"] = g->plan.estimated_peak_bytes;
               d["estimated_ms"] = g->plan.estimated_ms;
               d["floor_bytes"] = g->plan.floor_bytes;
               d["retry"] = g->retry;
               py::list formats;
               for (const auto& u : a.formats(*g)) formats.append(py::make_tuple(u.format, u.linears, u.provider));
               d["formats"] = formats;
               d["residency"] = g->residency ? py::object(py::str(report::to_json(*g->residency).dump())) : py::none();
               out.append(d);
             }
             return out;
           })
      .def_property_readonly("last_prepare_ms", &host::Attached::last_prepare_ms)
      .def_property_readonly(
          "last_key", [](const host::Attached& a) { return a.last() ? std::optional(a.last()->key) : std::nullopt; })
      .def(
          "explain",
          [](const host::Attached& a, const std::optional<std::string>& key) {
            return plan::explain(python::find_plan(a, key).plan);
          },
          py::arg("key") = py::none())
      .def(
          "document",
          [](const host::Attached& a, const std::optional<std::string>& key) {
            return a.document(python::find_plan(a, key)).dump();
          },
          py::arg("key") = py::none())
      .def("storage",
           [](const host::Attached& a) {
             std::map<std::string, std::vector<uintptr_t>> out;
             for (const auto& [name, ptrs] : a.weights().storage())
               for (const void* p : ptrs) out[name].push_back(reinterpret_cast<uintptr_t>(p));
             return out;
           })
      .def("release_streamed", &host::Attached::release_streamed,
           "Gives back the streamed weights' device and pinned host memory.")
      .def("sharded_bytes", &host::Attached::sharded_bytes,
           "(this rank's shares of the blocks' weights, the two slots a block is gathered into): device "
           "bytes under sharded weights, (0, 0) otherwise")
      .def("streamed_bytes", &host::Attached::streamed_bytes,
           "(device bytes, pinned host bytes) the streamed weights hold now.")
      .def("copies", [](const host::Attached& a) {
        std::vector<std::pair<std::string, int64_t>> out;
        for (const auto& c : a.weights().copies()) out.emplace_back(c.name, c.bytes);
        return out;
      });
}
