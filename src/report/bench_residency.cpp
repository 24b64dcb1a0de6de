// bench --device-memory: a case's planned schedule with its weights streamed from host memory
// under device-memory budgets, against the same plan with every weight resident.
#include <iostream>
#include <sstream>

#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "exec/residency/streamed.hpp"
#include "plan/budget.hpp"
#include "report/bench.hpp"
#include "report/bench_common.hpp"
#include "exec/run/retry.hpp"

namespace sp::report {

nlohmann::json run_residency_case(const BenchCase& c, const contracts::Registry& reg, const contracts::DeviceCaps& caps,
                                  const at::Device& device, const BenchOptions& opt,
                                  const std::vector<int64_t>& device_memories, int resident_blocks) {
  Progress progress("bench", opt.progress);
  const CaseModel cm = build_case(c, reg, device, opt, &progress);
  const models::Instance& inst = cm.inst;
  plan::ResidencyRequest rq = exec::residency_request(inst.model, *inst.weights, inst.inputs, reg, caps);
  rq.resident_blocks = resident_blocks;
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t memory : device_memories) {
    rq.device_memory = memory;
    const std::string label = c.name + " under " + plan::human_bytes(memory);
    const plan::ResidentPlan rp = [&] {
      const auto phase = progress.phase(label + ": planning");
      return plan::plan_with_residency(inst.model, reg, caps, opt.plan, rq);
    }();
    if (opt.progress) std::cerr << plan::explain(rp.residency) << std::endl;
    auto run = [&](const exec::WeightSource& w, const std::string& what) {
      return exec::run_planned(inst.model, rp.plan, w, inst.inputs, reg, caps, progress.sublayers(inst.model, label + ": " + what));
    };
    // Every weight resident, the same plan: warm-up, then the timed runs.
    run(*inst.weights, "all resident, warm-up");
    Repeated resident = repeat(device, opt.reps, [&] { return run(*inst.weights, "all resident"); });
    // The reference output waits in host memory: a small tensor left on the device can hold a
    // whole cached segment of the runs before, which the cap would count.
    const at::Tensor reference = resident.out.cpu();
    resident.out = at::Tensor();
    nlohmann::json row{{"case", c.name},
                       {"device", caps.name},
                       {"dtype", ir::to_string(opt.dtype)},
                       {"tokens", inst.model.tokens()},
                       {"layers", int64_t(inst.model.blocks.size())},
                       {"device_memory_bytes", memory},
                       {"resident_blocks", rp.residency.resident_blocks()},
                       {"all_resident_ms", resident.ms},
                       {"predicted_ms", rp.residency.predicted_ms},
                       {"predicted_all_resident_ms", rp.residency.resident_ms},
                       {"residency", to_json(rp.residency)}};
    {
      if (opt.progress) std::cerr << label << ": all resident; " << exec::allocator_state(device) << std::endl;
      exec::StreamedWeights streamed(inst.model, inst.weights, rp.residency, reg, device);
      exec::synchronize(device);
      if (opt.progress) std::cerr << label << ": weights moved; " << exec::allocator_state(device) << std::endl;
      exec::PeakMeter meter(device);  // after the moves: counts everything the runs hold at their peak
      {
        const std::shared_ptr<void> cap = exec::cap_device_memory(device, memory);
        if (opt.progress) std::cerr << label << ": capped; " << exec::allocator_state(device) << std::endl;
        try {
          run(streamed, "streamed, warm-up");
        } catch (const std::exception& e) {
          if (!exec::is_out_of_memory(e)) throw;
          throw exec::OutOfMemory("out of memory under --device-memory " + plan::human_bytes(memory) + " (" +
                                exec::allocator_state(device) + "; planned " +
                                plan::human_bytes(rp.residency.device_bytes()) + ")");
        }
        const Repeated r = repeat(device, opt.reps, [&] { return run(streamed, "streamed"); });
        row["ms"] = r.ms;
        const at::Tensor out = r.out.cpu();
        row["rel_l2_vs_all_resident"] = rel_l2(out, reference);
        row["exact"] = at::equal(out, reference);
        row["loads"] = streamed.loads();
        row["host_bytes"] = streamed.host_bytes();
      }
      row["max_allocated_bytes"] = meter.peak();
      row["max_reserved_bytes"] = meter.peak_reserved();
      streamed.restore();
    }
    row["ms_over_all_resident"] = row["ms"].get<double>() / resident.ms;
    row["predicted_over_measured"] = rp.residency.predicted_ms / row["ms"].get<double>();
    rows.push_back(row);
  }
  return rows;
}

std::string estimate_residency(const BenchCase& c, const contracts::Registry& reg, const contracts::DeviceCaps& caps,
                               const BenchOptions& opt, const std::vector<int64_t>& device_memories,
                               int resident_blocks) {
  const CaseModel cm = build_case(c, reg, at::Device(at::kMeta), opt);
  plan::ResidencyRequest rq = exec::residency_request(cm.inst.model, *cm.inst.weights, cm.inst.inputs, reg, caps);
  rq.resident_blocks = resident_blocks;
  std::ostringstream os;
  for (int64_t memory : device_memories) {
    rq.device_memory = memory;
    os << c.name << " under " << plan::human_bytes(memory) << ":\n";
    try {
      os << plan::explain(plan::plan_with_residency(cm.inst.model, reg, caps, opt.plan, rq).residency) << "\n";
    } catch (const plan::DeviceMemoryError& e) {
      os << e.what() << "\n";
    }
  }
  return os.str();
}

std::string residency_table(const nlohmann::json& rows) {
  std::ostringstream os;
  os << printf_text("%-18s %9s %9s %9s %6s %10s %10s %8s %10s %8s %10s %6s\n", "case", "dev GiB", "alloc GiB",
                    "held GiB", "N", "ms", "resident", "ratio", "predicted", "pred/m", "rel_l2", "exact");
  const double G = double(int64_t{1} << 30);
  for (const auto& r : rows)
    os << printf_text("%-18s %9.2f %9.2f %9.2f %6d %10.1f %10.1f %8.3f %10.1f %8.3f %10.2e %6s\n",
                      r["case"].get<std::string>().c_str(), r["device_memory_bytes"].get<double>() / G,
                      r["max_allocated_bytes"].get<double>() / G, r["max_reserved_bytes"].get<double>() / G,
                      r["resident_blocks"].get<int>(), r["ms"].get<double>(), r["all_resident_ms"].get<double>(),
                      r["ms_over_all_resident"].get<double>(), r["predicted_ms"].get<double>(),
                      r["predicted_over_measured"].get<double>(), r["rel_l2_vs_all_resident"].get<double>(),
                      r["exact"].get<bool>() ? "yes" : "no");
  return os.str();
}

}  // namespace sp::report
