// streamplan run --nproc (see ranks.hpp).
#include "cli/ranks.hpp"

#include <ATen/ATen.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef STREAMPLAN_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef STREAMPLAN_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <vector>

#include "cli/checkpoint_model.hpp"
#include "cli/sparse_run.hpp"
#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "exec/registry.hpp"
#include "host/attached.hpp"
#include "models/checkpoint.hpp"
#include "models/lora_file.hpp"
#include "models/tensor_io.hpp"
#include "plan/budget.hpp"
#include "plan/residency.hpp"
#include "plan/units.hpp"
#include "report/report.hpp"

namespace sp::cli {

namespace {

int env_int(const char* name, int fallback, bool required) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (required) throw std::invalid_argument(std::string(name) + ": unset, while RANK is set (torchrun's environment)");
    return fallback;
  }
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end || n < 0 || n > 1 << 20)
    throw std::invalid_argument(std::string(name) + ": expected a count >= 0, got '" + v + "'");
  return int(n);
}

// A TCP port free on this host now (the kernel's choice).
int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (s >= 0) close(s);
    throw std::runtime_error("--nproc: no free TCP port on 127.0.0.1 for the ranks' store");
  }
  close(s);
  return ntohs(a.sin_port);
}

// This process's own arguments (argv), as the kernel holds them.
std::vector<std::string> own_arguments() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string a; std::getline(f, a, '\0');) args.push_back(a);
  if (args.empty()) throw std::runtime_error("--nproc: cannot read this process's arguments (/proc/self/cmdline)");
  return args;
}

// The group of the ranks of `e`: gloo on the CPU, NCCL on CUDA.
exec::dist::Group make_group(const RankEnv& e, const at::Device& d) {
  c10d::TCPStoreOptions so;
  so.port = uint16_t(e.port);
  so.isServer = e.rank == 0;
  so.numWorkers = e.size;
  so.timeout = std::chrono::seconds(600);
  auto store = c10::make_intrusive<c10d::TCPStore>(e.addr, so);
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, e.rank, e.size);
  if (d.is_cuda()) {
#ifdef STREAMPLAN_NCCL
    c10::cuda::set_device(d.index());
    auto b = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, e.rank, e.size);
    pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::NCCL, b);
    pg->setDefaultBackend(c10d::ProcessGroup::NCCL);
    return pg;
#else
    throw std::invalid_argument("--nproc on " + d.str() + ": this build has no NCCL process group (nccl.h was not "
                                "found when it was built: pip install nvidia-nccl-cu13 beside torch)");
#endif
  }
#ifdef STREAMPLAN_GLOO
  auto o = c10d::ProcessGroupGloo::Options::create();
  o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  auto b = c10::make_intrusive<c10d::ProcessGroupGloo>(store, e.rank, e.size, o);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::GLOO, b);
  pg->setDefaultBackend(c10d::ProcessGroup::GLOO);
  return pg;
#else
  throw std::invalid_argument("--nproc on the CPU: this build has no gloo process group (the gloo headers were not "
                              "found when it was built: apt-get install libgloo-dev)");
#endif
}

// The device of rank `e` for --device: one GPU per rank (LOCAL_RANK) on CUDA.
at::Device rank_device(const std::string& option, const RankEnv& e) {
  const at::Device d = exec::pick_device(option);
  if (!d.is_cuda()) return d;
  if (option.find(':') != std::string::npos && e.size > 1)
    throw std::invalid_argument("--device " + option + ": with --nproc each rank takes the GPU of its local rank; "
                                "give --device cuda");
  try {
    return exec::pick_device("cuda:" + std::to_string(e.local_rank));
  } catch (const std::invalid_argument& err) {
    throw std::invalid_argument("--nproc " + std::to_string(e.size) + " on CUDA: each rank takes one GPU, and local rank " +
                                std::to_string(e.local_rank) + " has none (" + err.what() + ")");
  }
}

}  // namespace

std::optional<RankEnv> rank_env() {
  if (!std::getenv("RANK")) return std::nullopt;
  RankEnv e;
  e.rank = env_int("RANK", 0, true);
  e.size = env_int("WORLD_SIZE", 1, true);
  e.local_rank = env_int("LOCAL_RANK", e.rank, false);
  e.port = env_int("MASTER_PORT", 0, true);
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) e.addr = a;
  if (e.size < 1 || e.rank >= e.size)
    throw std::invalid_argument("RANK " + std::to_string(e.rank) + ": must be below WORLD_SIZE " + std::to_string(e.size));
  return e;
}

int spawn_ranks(int nproc) {
  const std::vector<std::string> args = own_arguments();
  const std::string port = std::to_string(free_port());
  std::vector<pid_t> pids;
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t p : pids) kill(p, SIGTERM);
      throw std::runtime_error("--nproc: cannot start rank " + std::to_string(r));
    }
    if (pid == 0) {
      for (const auto& [k, v] : {std::pair{"RANK", std::to_string(r)}, {"LOCAL_RANK", std::to_string(r)},
                                 {"WORLD_SIZE", std::to_string(nproc)}, {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
                                 {"MASTER_ADDR", std::string("127.0.0.1")}, {"MASTER_PORT", port}})
        setenv(k, v.c_str(), 1);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  int first_failure = 0;
  for (size_t left = pids.size(); left > 0; --left) {
    int status = 0;
    const pid_t done = wait(&status);
    if (done < 0) break;
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc != 0 && first_failure == 0) {
      first_failure = rc;
      for (pid_t p : pids)
        if (p != done) kill(p, SIGTERM);  // the others would wait for it in their next exchange
    }
  }
  return first_failure;
}

int run_rank(const RunArgs& a, const RankEnv& env) {
  const at::Device d = rank_device(a.device, env);
  auto reg = exec::builtin_registry();
  const std::string consumer = resolve_consumer(a.consumer);
  const ir::DType dtype = run_dtype(a.dtype, d);
  require_consumer_device(reg, consumer, d, dtype);
  const char* converted = std::getenv(kRanksCheckpointEnv);
  const std::string checkpoint = converted ? converted : a.checkpoint;
  const auto file = io::SafetensorsFile::open(checkpoint);
  const auto sidecar = a.sidecar.empty() ? models::sidecar_of(file) : recognize::load_sidecar(a.sidecar);
  const auto rec = recognize::recognize(file, sidecar);
  models::TensorMap raw;
  if (!a.inputs.empty()) {
    raw = models::read_tensors(a.inputs);
  } else {
    if (a.geom.tokens <= 0 && a.geom.frames <= 0 && a.geom.height <= 0)
      throw std::invalid_argument("give --inputs, --tokens, or the geometry (--frames/--height/--width)");
    raw = models::random_raw_inputs(rec.config, a.geom, a.seed);  // seeded: the same on every rank
  }
  // Replicated weights resident on the rank's device are read there; streamed or sharded ones
  // come from host memory.
  auto read_weights = [&](bool from_host) {
    host::NamedTensors tensors;
    for (auto& [name, t] : models::read_tensors(checkpoint))
      tensors.emplace_back(name, from_host ? std::move(t) : t.to(d));
    return tensors;
  };
  if (a.weights == "sharded" && env.size < 2)
    throw std::invalid_argument("--weights sharded: shares the weights over the ranks of --nproc 2 or more, got " +
                                std::to_string(env.size));
  // Where the ranks' weights are read, and where one process's (--check: sharded weights whole).
  const bool rank_from_host = !a.device_memory.empty() || a.weights == "sharded", one_from_host = !a.device_memory.empty();
  host::NamedTensors tensors = read_weights(rank_from_host);

  host::AttachOptions o;
  o.consumer = consumer;
  if (consumer == "sparse") o.kv_budget = plan::kv_budget_at(a.kv.schedule, a.kv.step, a.kv.steps);
  o.budget = a.budget;
  o.dtype = ir::to_string(dtype);
  o.device = d.str();
  if (!a.device_memory.empty()) o.device_memory = plan::parse_budget(a.device_memory);
  o.sequence_mode = a.sequence == "ring" ? plan::SeqMode::Ring : plan::SeqMode::Ulysses;
  o.link_bytes_per_s = a.link_rate * 1e9;
  o.weight_split = a.weights == "sharded"      ? plan::WeightSplit::Sharded
                   : a.weights == "replicated" ? plan::WeightSplit::Replicated
                                               : plan::WeightSplit::Auto;
  for (const auto& spec : a.loras) o.loras.push_back(models::read_lora(spec));
  o.process_group = make_group(env, d);
  const auto group = o.process_group;
  host::Attached att(tensors, sidecar, o, reg);
  const bool check_here = a.check && env.rank == 0;
  if (!check_here || rank_from_host != one_from_host) tensors.clear();  // the planner holds what it reads

  models::TensorMap out;  // "out", or the family's named outputs
  exec::install_cpu_meter();
  exec::synchronize(d);
  int64_t peak = 0;
  double ms = 0;
  {
    exec::PeakMeter meter(d);
    const auto t0 = std::chrono::steady_clock::now();
    out = att.forward_named(raw);
    exec::synchronize(d);
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    peak = meter.peak();
  }
  // Every rank's time and peak, for rank 0 to print.
  at::Tensor mine = at::tensor({ms, double(peak)}, at::kDouble).to(d.is_cuda() ? d : at::Device(at::kCPU));
  std::vector<std::vector<at::Tensor>> all(1);
  for (int r = 0; r < env.size; ++r) all[0].push_back(at::empty_like(mine));
  std::vector<at::Tensor> in{mine};
  group->allgather(all, in)->wait();
  double one_l2 = -1;
  if (check_here) {  // the same forward in this process alone
    const host::NamedTensors again = tensors.empty() ? read_weights(one_from_host) : std::move(tensors);
    host::AttachOptions single = o;
    single.process_group = {};
    single.weight_split = plan::WeightSplit::Auto;
    host::Attached one(again, sidecar, single, reg);
    one_l2 = 0;  // over every output
    for (const auto& [name, t] : one.forward_named(raw)) one_l2 = std::max(one_l2, report::rel_l2(out.at(name), t));
  }
  group->barrier()->wait();  // rank 0's check done: the group goes
  group->shutdown();
  if (env.rank != 0) return 0;
  std::vector<std::pair<double, int64_t>> per_rank;  // per rank: its time (ms) and peak (bytes)
  for (const at::Tensor& t : all[0]) {
    const at::Tensor v = t.cpu();
    per_rank.emplace_back(v[0].item<double>(), int64_t(v[1].item<double>()));
  }

  if (!a.output.empty()) {
    models::TensorMap written;
    for (const auto& [name, t] : out) written[name == "out" ? "output" : "output_" + name] = t.cpu();
    models::write_tensors(a.output, written);
  }
  const host::GeometryPlan* g = att.last();
  if (a.json) {
    nlohmann::json j = att.document(*g);
    j["ranks"] = nlohmann::json::array();
    for (int r = 0; r < env.size; ++r) {
      const auto& [rank_ms, rank_peak] = per_rank[size_t(r)];
      j["ranks"].push_back({{"rank", r}, {"ms", rank_ms}, {"peak_bytes", rank_peak}});
    }
    j["device"] = d.str();
    if (!a.loras.empty()) j["lora"] = att.lora().json();
    if (one_l2 >= 0) j["rel_l2_vs_one_process"] = one_l2;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << rec.config.variant << " (" << rec.layout << " layout) from " << a.checkpoint << " over " << env.size
            << " ranks (" << (d.is_cuda() ? "NCCL" : "gloo") << "), " << g->key << "\n";
  if (!a.explain.empty()) std::cout << plan::explain(g->plan) << "\n";
  if (!a.loras.empty()) std::cout << att.lora().summary();
  if (g->residency) std::cout << plan::explain(*g->residency) << "\n";
  for (int r = 0; r < env.size; ++r) {
    const auto& [rank_ms, rank_peak] = per_rank[size_t(r)];
    std::cout << report::printf_text("rank %d: %.1f ms, peak %s\n", r, rank_ms, plan::human_bytes(rank_peak).c_str());
  }
  if (one_l2 >= 0) std::cout << report::printf_text("rel L2 against one process: %.3e\n", one_l2);
  return 0;
}

}  // namespace sp::cli
