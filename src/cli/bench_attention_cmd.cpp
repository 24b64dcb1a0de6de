// streamplan bench-attention: the sdpa consumer (cuDNN), int8 dense, routed sparse and a fixed
// local window at the attention shapes of video models, on synthetic input distributions
// (report/attention_inputs.hpp), with the error of each against fp32 attention
// (docs/attention.md). The cached K carrier is dropped before every repetition.
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "cli/output_check.hpp"
#include "exec/consumers/consumer.hpp"
#include "exec/consumers/int8_common.hpp"
#include "exec/consumers/sparse.hpp"
#include "exec/device/device.hpp"
#include "exec/registry.hpp"
#include "report/attention_inputs.hpp"
#include "report/report.hpp"

namespace sp::cli {

namespace {

struct AttnCase {
  std::string name;
  report::AttnShape shape;
};

// Rows: text, then the video grid (t, h, w), then the rest (audio: dense, like text).
const std::vector<AttnCase>& attn_cases() {
  static const std::vector<AttnCase> cases = {{"wan14b", {75600, 40, 128, 0, {21, 45, 80}}},
                                              {"h3-10s", {75072, 56, 128, 512, {18, 48, 86}}},
                                              {"small", {4160, 8, 128, 77, {3, 30, 45}}}};
  return cases;
}

struct Args {
  std::vector<std::string> cases = {"wan14b", "h3-10s"}, distributions = {"gaussian"};
  std::vector<double> budgets = {0.3, 1.0};
  std::string device = "cuda", out;
  int reps = 3;
  int64_t ref_rows = 1024;
  bool quiet = false;
};

template <class F>
double time_ms(const at::Device& d, int reps, F&& f) {
  f();  // warm-up (and the consumers' self-test)
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    exec::synchronize(d);
    const auto t0 = std::chrono::steady_clock::now();
    f();
    exec::synchronize(d);
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// fp32 attention of the query rows `idx`, head by head: [heads, rows, head_dim], and each
// row's largest softmax weight [heads, rows].
std::pair<at::Tensor, at::Tensor> fp32_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const at::Tensor& idx, double scale) {
  std::vector<at::Tensor> heads, top;
  for (int64_t h = 0; h < q.size(1); ++h) {
    const at::Tensor p = at::softmax(at::matmul(q[0][h].index_select(0, idx).to(at::kFloat), k[0][h].to(at::kFloat).t()).mul_(scale), 1);
    heads.push_back(at::matmul(p, v[0][h].to(at::kFloat)));
    top.push_back(std::get<0>(p.max(1)));
  }
  return {at::stack(heads), at::stack(top)};
}

// The CSR list of the key tiles a [G, query tiles, key tiles] mask keeps.
exec::int8attn::TileList tile_list(const at::Tensor& keep) {
  const at::Tensor counts = keep.sum(2).flatten().to(at::kInt);
  return {at::cat({at::zeros({1}, counts.options()), counts.cumsum(0).to(at::kInt)}),
          keep.nonzero().select(1, 2).to(at::kInt).contiguous()};
}

int bench_attention(const Args& a) {
  namespace ia = exec::int8attn;
  std::vector<std::string> dists = a.distributions;
  const auto& known = report::attention_distributions();
  if (std::find(dists.begin(), dists.end(), "all") != dists.end()) dists = known;
  for (const std::string& dist : dists)
    if (std::find(known.begin(), known.end(), dist) == known.end())
      throw std::invalid_argument("--distribution: unknown '" + dist + "' (gaussian, outlier-k, peaky, qk-norm, video-local, all)");
  const at::Device d = exec::pick_device(a.device);
  if (!d.is_cuda()) throw std::invalid_argument("bench-attention: needs a CUDA device, --device gave " + d.str());
  const auto reg = exec::builtin_registry();
  const auto& int8 = exec::impl_of<exec::ConsumerImpl>(reg.consumer("int8"));
  const auto& sparse = exec::impl_of<exec::ConsumerImpl>(reg.consumer("sparse"));
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& name : a.cases) {
    const auto it = std::find_if(attn_cases().begin(), attn_cases().end(), [&](const AttnCase& c) { return c.name == name; });
    if (it == attn_cases().end()) throw std::invalid_argument("--cases: unknown case '" + name + "' (wan14b, h3-10s, small)");
    const report::AttnShape& c = it->shape;
    const auto [v0, v1] = report::grid_rows(c);
    const exec::VideoRows video{v0, v1};
    for (const std::string& dist : dists) {
      const report::AttnInputs x = report::attention_inputs(dist, c, at::TensorOptions().dtype(at::kBFloat16).device(d));
      const at::Tensor &q = x.q, &k = x.k, &v = x.v;
      const double scale = 1.0 / std::sqrt(double(c.head_dim));
      const at::Tensor idx = at::linspace(0, double(c.tokens - 1), std::min(a.ref_rows, c.tokens),
                                          at::TensorOptions().dtype(at::kDouble).device(d)).to(at::kLong);
      const auto [ref, top] = fp32_reference(q, k, v, idx, scale);
      auto rel_l2 = [&](const at::Tensor& o) { return report::rel_l2(o[0].index_select(1, idx), ref); };
      const double top_median = top.flatten().median().item<double>();
      const double peaked = top.ge(0.5).to(at::kFloat).mean().item<double>();
      const double flops = 4.0 * double(c.tokens) * double(c.tokens) * double(c.heads) * double(c.head_dim);
      at::Tensor o;
      const double sdpa_ms = time_ms(d, a.reps, [&] { o = exec::sdpa_attention(q, k, v, scale); });
      const double sdpa_err = rel_l2(o);
      const std::string sdpa_kind = exec::sdpa_kernel(d, at::kBFloat16, c.head_dim);
      // The share of 16-row groups the sm_90a kernels' bounded softmax redid (bf16 V), or null.
      auto redone = [&](const ia::TileList& tiles) -> nlohmann::json {
        if (ia::auto_kernel(c.head_dim) != ia::Kernel::Sm90) return nullptr;
        const ia::KCarrier kc = ia::quantize_k(k[0]);
        const ia::QTiles qt = ia::quantize_q(q[0], scale, kc);
        ia::attend(qt, kc, v[0], tiles);
        return qt.check.ne(0).to(at::kFloat).mean().item<double>();
      };
      auto row = [&](const std::string& consumer, double budget, double ms, double err, double density,
                     const nlohmann::json& redo) {
        rows.push_back({{"case", name}, {"distribution", dist}, {"consumer", consumer}, {"kv_budget", budget},
                        {"tokens", c.tokens}, {"heads", c.heads}, {"head_dim", c.head_dim}, {"ms", ms},
                        {"sdpa_ms", sdpa_ms}, {"speedup_vs_sdpa", sdpa_ms / ms}, {"rel_l2", err}, {"sdpa_rel_l2", sdpa_err},
                        {"density", density}, {"tflops_dense_equivalent", flops / ms / 1e9}, {"redone_rows", redo},
                        {"sdpa_kernel", sdpa_kind}, {"median_top_weight", top_median}, {"rows_top_weight_ge_half", peaked}});
        if (!a.quiet)
          std::cerr << name << " " << dist << " " << consumer << " budget " << budget << ": " << ms << " ms ("
                    << sdpa_ms / ms << "x sdpa), rel L2 " << err << " (sdpa " << sdpa_err << "), density " << density
                    << ", redone " << redo.dump() << "\n";
      };
      row("sdpa", 1.0, sdpa_ms, sdpa_err, 1.0, nullptr);
      const double int8_ms = time_ms(d, a.reps, [&] {
        exec::int8c::drop_carrier();
        o = int8.attend(q, k, v, scale);
      });
      row("int8", 1.0, int8_ms, rel_l2(o), 1.0, redone({}));
      for (double budget : a.budgets) {
        contracts::AttnCall call;
        call.kv_budget = budget;
        call.video = video;
        exec::SparseTally tally;
        const double ms = time_ms(d, a.reps, [&] {
          exec::int8c::drop_carrier();
          o = sparse.attend_rows(q, k, v, scale, call);
        });
        const auto& phases = tally.phases();
        const double density = phases.empty() ? 1.0 : phases.back().density();
        row("sparse", budget, ms, rel_l2(o), density, redone(tile_list(exec::route_tiles(q[0], k[0], video, budget))));
        if (budget >= 1.0) continue;
        // The fixed local window at the same budget, on the same int8 kernels.
        const at::Tensor keep = report::window_tiles(c, budget, d);
        const ia::TileList tiles = tile_list(keep);
        const double wms = time_ms(d, a.reps, [&] {
          const ia::KCarrier kc = ia::quantize_k(k[0]);
          o = ia::attend(ia::quantize_q(q[0], scale, kc), kc, v[0], tiles).unsqueeze(0);
        });
        row("window", budget, wms, rel_l2(o), keep.to(at::kFloat).mean().item<double>(), redone(tiles));
      }
      exec::int8c::drop_carrier();
    }
  }
  const std::string text = rows.dump(2);
  if (!a.out.empty()) std::ofstream(a.out) << text << "\n";
  std::cout << text << "\n";
  return 0;
}

}  // namespace

Runner add_bench_attention(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("bench-attention", "cuDNN SDPA vs int8 and routed sparse attention at video model shapes");
  cmd->add_option("--cases", a->cases, "wan14b (75600 x 40 x 128), h3-10s (75072 x 56 x 128, 512 text rows), small")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--distribution", a->distributions,
                  "inputs: gaussian, outlier-k, peaky, qk-norm, video-local, or all (docs/attention.md)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--kv-budgets", a->budgets, "sparse budgets to time (each below 1 also as a fixed local window)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--reps", a->reps, "timed repetitions (the best is reported)")->check(between(1, 100))->capture_default_str();
  cmd->add_option("--ref-rows", a->ref_rows, "query rows of the fp32 reference per head")->check(at_least(1))->capture_default_str();
  cmd->add_option("--device", a->device, "cuda or cuda:N")->capture_default_str();
  cmd->add_option("--out", a->out, "also write the JSON rows to this file")->check(output_file());
  cmd->add_flag("--quiet", a->quiet, "no lines on stderr");
  return [cmd, a]() { return cmd->parsed() ? bench_attention(*a) : -1; };
}

}  // namespace sp::cli
