#include "cli/sparse_run.hpp"

#include <sstream>

#include "exec/run/executor.hpp"
#include "exec/consumers/sparse.hpp"
#include "plan/kv_budget.hpp"

namespace sp::cli {

void require_consumer_device(const contracts::Registry& reg, const std::string& consumer, const at::Device& device,
                             ir::DType dtype) {
  if (!reg.has_consumer(consumer)) return;  // planning names the unknown consumer
  if (const std::string why = exec::consumer_unusable(reg, consumer, device, dtype); !why.empty())
    throw contracts::ContractError(why + (device.is_cuda() ? "" : " (choose --consumer sdpa or a CUDA --device)"));
}

SparseRun prepare_sparse(const std::string& consumer, const ir::Model& m, const KvArgs& kv) {
  SparseRun r;
  if (consumer != "sparse") return r;
  r.active = true;
  r.kv = kv;
  r.budget = plan::kv_budget_at(kv.schedule, kv.step, kv.steps);
  r.tally = std::make_shared<exec::SparseTally>();
  r.video = plan::video_rows(m).value_or(ir::RowRange{});
  return r;
}

nlohmann::json SparseRun::json() const {
  nlohmann::json phases = nlohmann::json::array();
  for (const auto& p : tally->phases())
    phases.push_back({{"kv_rows", p.kv_rows}, {"density", p.density()}, {"routed", p.density() < 1.0}});
  return {{"kv_budget", budget}, {"step", kv.step}, {"steps", kv.steps},
          {"video_rows", {video.begin, video.end}}, {"phases", phases}};
}

std::string SparseRun::text() const {
  std::ostringstream os;
  os << "sparse attention: kv budget " << budget << " at step " << kv.step << " of " << kv.steps
     << "; tile density per attention phase (naive run first, then planned):";
  for (const auto& p : tally->phases()) os << " " << p.density();
  os << "\n";
  return os.str();
}

}  // namespace sp::cli
