// streamplan bench-attention: cuDNN SDPA, int8 dense and routed sparse attention at the
// attention shapes of video models, with the error of each against fp32 attention
// (docs/bench.md). The cached K carrier is dropped before every repetition.
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

namespace sp::cli {

namespace {

struct AttnCase {
  std::string name;
  int64_t tokens, heads, head_dim, text_rows;  // text rows first, then video rows
};

const std::vector<AttnCase>& attn_cases() {
  static const std::vector<AttnCase> cases = {{"wan14b", 75600, 40, 128, 0}, {"h3-10s", 75072, 56, 128, 512},
                                              {"small", 4160, 8, 128, 77}};
  return cases;
}

struct Args {
  std::vector<std::string> cases = {"wan14b", "h3-10s"};
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

// fp32 attention of the first `rows` query rows, head by head: [heads, rows, head_dim].
at::Tensor fp32_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t rows, double scale) {
  std::vector<at::Tensor> heads;
  for (int64_t h = 0; h < q.size(1); ++h) {
    const at::Tensor s = at::matmul(q[0][h].narrow(0, 0, rows).to(at::kFloat), k[0][h].to(at::kFloat).t()).mul_(scale);
    heads.push_back(at::matmul(at::softmax(s, 1), v[0][h].to(at::kFloat)));
  }
  return at::stack(heads);
}

double rel_l2(const at::Tensor& o, const at::Tensor& ref) {
  const at::Tensor got = o[0].narrow(1, 0, ref.size(1)).to(at::kFloat);
  return (got - ref).norm().item<double>() / ref.norm().item<double>();
}

int bench_attention(const Args& a) {
  const at::Device d = exec::pick_device(a.device);
  if (!d.is_cuda()) throw std::invalid_argument("bench-attention: needs a CUDA device, --device gave " + d.str());
  const auto reg = exec::builtin_registry();
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& name : a.cases) {
    const auto it = std::find_if(attn_cases().begin(), attn_cases().end(), [&](const AttnCase& c) { return c.name == name; });
    if (it == attn_cases().end()) throw std::invalid_argument("--cases: unknown case '" + name + "' (wan14b, h3-10s, small)");
    const AttnCase& c = *it;
    const auto opt = at::TensorOptions().dtype(at::kBFloat16).device(d);
    at::manual_seed(0);
    const at::Tensor q = at::randn({1, c.heads, c.tokens, c.head_dim}, opt);
    const at::Tensor k = at::randn({1, c.heads, c.tokens, c.head_dim}, opt) + at::randn({1, 1, 1, c.head_dim}, opt);
    const at::Tensor v = at::randn({1, c.heads, c.tokens, c.head_dim}, opt);
    const double scale = 1.0 / std::sqrt(double(c.head_dim));
    const int64_t ref_rows = std::min(a.ref_rows, c.tokens);
    const at::Tensor ref = fp32_reference(q, k, v, ref_rows, scale);
    const double flops = 4.0 * double(c.tokens) * double(c.tokens) * double(c.heads) * double(c.head_dim);
    // cuDNN SDPA; ATen's default SDPA where cuDNN does not take the shape.
    std::string sdpa_kind = "cudnn";
    auto sdpa = [&]() -> at::Tensor {
      if (sdpa_kind == "cudnn") {
        try {
          return std::get<0>(at::_scaled_dot_product_cudnn_attention(q, k, v, std::nullopt, false, 0.0, false, false, scale));
        } catch (const c10::Error&) {
          sdpa_kind = "sdpa";
        }
      }
      return at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, scale);
    };
    at::Tensor o;
    const double sdpa_ms = time_ms(d, a.reps, [&] { o = sdpa(); });
    const double sdpa_err = rel_l2(o, ref);
    auto row = [&](const std::string& consumer, double budget, double ms, double err, double density) {
      rows.push_back({{"case", c.name}, {"consumer", consumer}, {"kv_budget", budget}, {"tokens", c.tokens},
                      {"heads", c.heads}, {"head_dim", c.head_dim}, {"ms", ms}, {"sdpa_ms", sdpa_ms}, {"rel_l2", err},
                      {"sdpa_rel_l2", sdpa_err}, {"density", density}, {"tflops_dense_equivalent", flops / ms / 1e9}});
      if (!a.quiet)
        std::cerr << c.name << " " << consumer << " budget " << budget << ": " << ms << " ms (" << sdpa_kind << " "
                  << sdpa_ms << " ms), rel L2 " << err << " (" << sdpa_kind << " " << sdpa_err << "), density " << density
                  << "\n";
    };
    row(sdpa_kind, 1.0, sdpa_ms, sdpa_err, 1.0);
    const auto& int8 = exec::impl_of<exec::ConsumerImpl>(reg.consumer("int8"));
    const double int8_ms = time_ms(d, a.reps, [&] {
      exec::int8c::drop_carrier();
      o = int8.attend(q, k, v, scale);
    });
    row("int8", 1.0, int8_ms, rel_l2(o, ref), 1.0);
    for (double budget : a.budgets) {
      const auto& sparse = exec::impl_of<exec::ConsumerImpl>(reg.consumer("sparse"));
      contracts::AttnCall call;
      call.kv_budget = budget;
      call.video = {c.text_rows, c.tokens};
      exec::SparseTally tally;
      const double ms = time_ms(d, a.reps, [&] {
        exec::int8c::drop_carrier();
        o = sparse.attend_rows(q, k, v, scale, call);
      });
      const auto& phases = tally.phases();
      row("sparse", budget, ms, rel_l2(o, ref), phases.empty() ? 1.0 : phases.back().density());
    }
    exec::int8c::drop_carrier();
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
  cmd->add_option("--kv-budgets", a->budgets, "sparse budgets to time")->delimiter(',')->capture_default_str();
  cmd->add_option("--reps", a->reps, "timed repetitions (the best is reported)")->check(between(1, 100))->capture_default_str();
  cmd->add_option("--ref-rows", a->ref_rows, "query rows of the fp32 reference per head")->check(at_least(1))->capture_default_str();
  cmd->add_option("--device", a->device, "cuda or cuda:N")->capture_default_str();
  cmd->add_option("--out", a->out, "also write the JSON rows to this file")->check(output_file());
  cmd->add_flag("--quiet", a->quiet, "no lines on stderr");
  return [cmd, a]() { return cmd->parsed() ? bench_attention(*a) : -1; };
}

}  // namespace sp::cli
