#include "exec/device/probe.hpp"

#include <c10/util/StringUtil.h>
#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <sys/stat.h>
#include <torch/headeronly/version.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "exec/consumers/consumer.hpp"
#include "exec/device/device.hpp"
#include "exec/kernels/fused.hpp"
#include "plan/budget.hpp"
#include "plan/cost.hpp"

namespace sp::exec {

namespace {

constexpr int kCacheVersion = 13;

using Clock = std::chrono::steady_clock;

std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-';
    if (ok) out += c;
    else if (!out.empty() && out.back() != '_') out += '_';
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out.empty() ? "device" : out;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) break;
      const auto b = line.find_first_not_of(" \t", colon + 1);
      return b == std::string::npos ? "" : line.substr(b);
    }
  return "";
}

// Seconds one call of f takes on the device: the median of 5 timings of `inner` calls each
// (one untimed warm-up call first). Repeating short calls keeps a busy scheduler's delays out
// of each timing, and the median keeps an odd slow or fast timing out of the figure.
template <typename F>
double median_seconds(const at::Device& d, int inner, F&& f) {
  f();
  synchronize(d);
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    for (int j = 0; j < inner; ++j) f();
    synchronize(d);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / inner);
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return std::max(t[t.size() / 2], 1e-12);
}

// CPU seconds the whole machine spent busy (/proc/stat; -1 where unreadable) and those of
// this process (getrusage), to tell how much other processes ran during a probe.
double machine_busy_seconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  long long v[8] = {0};
  if (!(f >> cpu) || cpu != "cpu") return -1;
  for (auto& x : v) f >> x;
  if (!f) return -1;
  const long long busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];  // user nice system irq softirq steal
  return double(busy) / double(::sysconf(_SC_CLK_TCK));
}

double own_cpu_seconds() {
  struct rusage u;
  if (::getrusage(RUSAGE_SELF, &u) != 0) return 0;
  auto s = [](const timeval& t) { return double(t.tv_sec) + 1e-6 * double(t.tv_usec); };
  return s(u.ru_utime) + s(u.ru_stime);
}

// Matmul throughput (FLOP/s) of [rows, n] @ [n, n] in `dt`; each timing covers about
// `flops_per_timing` FLOPs so that small products are repeated.
double gemm_rate(const at::Device& d, at::ScalarType dt, int64_t rows, int64_t n, double flops_per_timing) {
  const auto o = at::TensorOptions().dtype(dt).device(d);
  at::Tensor a = at::randn({rows, n}, o.dtype(at::kFloat)).to(dt), w = at::randn({n, n}, o.dtype(at::kFloat)).to(dt);
  at::Tensor out = at::empty({rows, n}, o);
  const double flops = 2.0 * double(rows) * double(n) * double(n);
  const int inner = static_cast<int>(std::clamp(flops_per_timing / flops, 1.0, 64.0));
  return flops / median_seconds(d, inner, [&] { at::mm_out(out, a, w); });
}

// Throughput = peak · rows / (rows + k). The peak is the best throughput measured (at the
// largest rows); k is the median over the other sizes of rows · (peak / throughput − 1),
// the value each one implies. Robust to one noisy size, and 0 for a flat device.
std::pair<double, double> fit_efficiency(const std::vector<std::pair<int64_t, double>>& pts) {
  double peak = 0;
  for (const auto& [rows, rate] : pts) peak = std::max(peak, rate);
  std::vector<double> ks;
  for (const auto& [rows, rate] : pts)
    if (rate < peak) ks.push_back(double(rows) * (peak / rate - 1.0));
  if (ks.empty()) return {peak, 0.0};
  std::sort(ks.begin(), ks.end());
  const double k = ks.size() % 2 ? ks[ks.size() / 2] : 0.5 * (ks[ks.size() / 2 - 1] + ks[ks.size() / 2]);
  return {peak, std::min(k, 4096.0)};
}

nlohmann::json cache_json(const ProbeResult& r) {
  nlohmann::json j{{"version", kCacheVersion}, {"key", r.key}, {"probe_ms", r.probe_ms}};
  for (const auto& f : contracts::kRateFields) j[f.name] = r.rates.*f.member;
  return j;
}

// A cached result, or nothing when the file is missing, unreadable, of another version or
// device, or lacks a rate a measured probe always has.
bool read_cache(const std::string& path, const std::string& key, ProbeResult& r) {
  std::ifstream f(path);
  if (!f) return false;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    if (j.at("version").get<int>() != kCacheVersion || j.at("key").get<std::string>() != key) return false;
    r.key = key;
    for (const auto& field : contracts::kRateFields) {
      const double v = j.at(field.name).get<double>();
      if (field.zero == contracts::RateZero::Invalid ? !(v > 0) : !(v >= 0)) return false;
      r.rates.*field.member = v;
    }
    r.probe_ms = j.value("probe_ms", 0.0);
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  return true;
}

// mkdir -p; POSIX calls rather than std::filesystem, whose symbols libtorch also exports.
bool make_dirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i < dir.size() && dir[i] != '/') continue;
    const std::string part = dir.substr(0, i);
    struct stat st;
    if (::stat(part.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return false;
    } else if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      return false;
    }
  }
  return true;
}

void write_cache(const std::string& path, const ProbeResult& r) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos || !make_dirs(path.substr(0, slash))) return;
  // Written beside the target and renamed over it: readers never see half a file.
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp);
    if (!f) return;
    f << cache_json(r).dump(2) << "\n";
    if (!f) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

}  // namespace

std::string probe_key(const contracts::DeviceCaps& caps) {
  const std::string torch = std::string("-torch") + TORCH_VERSION;
  if (caps.kind == contracts::DeviceKind::CPU)
    return sanitize("cpu-" + cpu_model() + "-" + std::to_string(caps.threads) + "t" + torch);
  return sanitize(caps.name + torch);
}

std::string probe_cache_path(const contracts::DeviceCaps& caps) {
  std::string dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x == '/') dir = std::string(x) + "/streamplan";
  else if (const char* h = std::getenv("HOME"); h && *h) dir = std::string(h) + "/.cache/streamplan";
  else return "";
  return dir + "/probe-" + probe_key(caps) + ".json";
}

// Measures now; touches no cache.
static ProbeResult measure_rates(const at::Device& d, const contracts::DeviceCaps& caps) {
  const auto t0 = Clock::now();
  const double busy0 = machine_busy_seconds(), own0 = own_cpu_seconds();
  ProbeResult r;
  r.key = probe_key(caps);
  const bool gpu = d.is_cuda();
  const bool bf16 = caps.dtypes.count(ir::DType::BF16) != 0;
  const at::ScalarType half = bf16 ? at::kBFloat16 : at::kHalf;

  // Bandwidth: a copy reads and writes every byte.
  const int64_t bytes = gpu ? (int64_t{512} << 20) : (int64_t{64} << 20);
  {
    const auto o = at::TensorOptions().dtype(at::kByte).device(d);
    at::Tensor src = at::zeros({bytes}, o), dst = at::empty({bytes}, o);
    r.rates.bytes_per_s = 2.0 * double(bytes) / median_seconds(d, 1, [&] { dst.copy_(src); });
    // Host to device (weights streamed from host memory): from pinned memory, asynchronously,
    // as the residency's loads copy. On the CPU the same copy within host memory.
    at::Tensor host = at::zeros({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(gpu));
    r.rates.host_bytes_per_s = double(bytes) / median_seconds(d, 1, [&] { dst.copy_(host, /*non_blocking=*/true); });
  }
  // Matmuls. A GPU needs wide weights to reach its peak, and its efficiency curve is taken
  // in the 16-bit dtype large models run in. A CPU is near its peak early and slow, so its
  // curve is taken in fp32 on narrower weights, and its (often emulated, slow) 16-bit
  // matmul at one size, scaled to the peak by the same curve.
  const int64_t n = gpu ? 4096 : 512;
  const std::vector<int64_t> rows = gpu ? std::vector<int64_t>{256, 512, 1024, 2048, 8192}
                                        : std::vector<int64_t>{16, 64, 256, 1024};
  const double per_timing = gpu ? 2e11 : 1e8;
  const at::ScalarType curve = gpu ? half : at::kFloat;
  if (gpu) {  // half a second of large matmuls first: the clocks a long run keeps, not a burst's
    const auto o = at::TensorOptions().dtype(half).device(d);
    at::Tensor a = at::randn({8192, n}, o), w = at::randn({n, n}, o), out = at::empty({8192, n}, o);
    for (int i = 0; i < 1500; ++i) at::mm_out(out, a, w);
    synchronize(d);
  }
  std::vector<std::pair<int64_t, double>> pts;
  for (int64_t r0 : rows) {
    const double rate = gemm_rate(d, curve, r0, n, per_timing);
    // On a GPU a product that takes little longer than reading and writing its operands says
    // nothing of its compute efficiency (the cost model bounds it by the bandwidth term): left
    // out. A CPU's matmuls work from its caches.
    const double flops = 2.0 * double(r0) * double(n) * double(n);
    const double moved = double(2 * r0 * n + n * n) * double(at::elementSize(curve));
    if (!gpu || moved / r.rates.bytes_per_s < 0.5 * flops / rate || r0 == rows.back()) pts.push_back({r0, rate});
  }
  const auto [peak, k] = fit_efficiency(pts);
  r.rates.gemm_half_rows = k;
  r.rates.gemm_probe_cols = double(n);
  auto scaled = [k = k](double rate, int64_t at_rows) { return rate * (double(at_rows) + k) / double(at_rows); };
  if (gpu) {
    r.rates.flops_per_s = peak;
    r.rates.flops_per_s_f32 = scaled(gemm_rate(d, at::kFloat, rows.back(), n, per_timing), rows.back());
  } else {
    r.rates.flops_per_s_f32 = peak;
    r.rates.flops_per_s = scaled(gemm_rate(d, half, 256, 256, 0), 256);
  }

  // Attention: the `sdpa` consumer's kernel (16-bit on a GPU, fp32 on a CPU) on a slab of
  // queries against a long K/V, as a fraction of the matmul peak in the same dtype at full
  // waves (plan::attention_efficiency); with a K/V length a multiple of 128 and one not (the
  // last tile masked), timed sustained on a GPU. A GPU also times the queries in 4 calls: the
  // tiles a call costs besides its waves are the difference (docs/budgets.md, "Calibration").
  const at::ScalarType adt = gpu ? half : at::kFloat;
  const auto fo = at::TensorOptions().dtype(at::kFloat).device(d);
  auto sdpa = [](const at::Tensor& qt, const at::Tensor& kt, const at::Tensor& vt) {
    sdpa_attention(qt, kt, vt, 1.0 / std::sqrt(double(qt.size(-1))));
  };
  plan::Rates waves_of;
  waves_of.compute_units = gpu ? caps.compute_units : 0;
  r.rates.attention_unit_tiles = r.rates.attention_lone_wave = 1;
  if (gpu && caps.compute_units > 0) {
    // Tiles a multiprocessor runs at once: calls of m tiles per multiprocessor (as many heads
    // as multiprocessors, m tiles of queries each) against a long K/V. Past what runs at once
    // an added tile adds its whole share of the time; below, it shares a multiprocessor that
    // had room. The count is the first m whose next tile adds at least 0.9 of its share (at
    // most 4), and a wave of one tile per multiprocessor takes t(1) / t(m) of a full one.
    const int64_t units = caps.compute_units, kvl = 16384, hd = 128;
    at::Tensor kt = at::randn({1, units, kvl, hd}, fo).to(adt), vt = at::randn({1, units, kvl, hd}, fo).to(adt);
    auto tiles_seconds = [&](int64_t m) {
      at::Tensor qt = at::randn({1, units, m * plan::kAttentionTileRows, hd}, fo).to(adt);
      for (int i = 0; i < 20; ++i) sdpa(qt, kt, vt);
      return median_seconds(d, 4, [&] { sdpa(qt, kt, vt); });
    };
    const double t1 = tiles_seconds(1);
    double tm = t1;
    int m = 1;
    for (; m < 4; ++m) {
      const double next = tiles_seconds(m + 1);
      if (next / tm >= 0.9 * double(m + 1) / double(m)) break;
      tm = next;
    }
    r.rates.attention_unit_tiles = m;
    r.rates.attention_lone_wave = std::min(1.0, t1 / tm);
    waves_of.attention_unit_tiles = r.rates.attention_unit_tiles;
    waves_of.attention_lone_wave = r.rates.attention_lone_wave;
  }
  const plan::TileWaves waves = plan::tile_waves(waves_of);
  const int64_t heads = gpu ? 40 : 2, q = gpu ? 8192 : 256, hd = gpu ? 128 : 64;
  auto attention_seconds = [&](int64_t kv, int calls) {
    std::vector<at::Tensor> qs;
    for (int i = 0; i < calls; ++i) qs.push_back(at::randn({1, heads, q / calls, hd}, fo).to(adt));
    at::Tensor kt = at::randn({1, heads, kv, hd}, fo).to(adt), vt = at::randn({1, heads, kv, hd}, fo).to(adt);
    const double flops = 4.0 * double(q) * double(kv) * double(heads) * double(hd);
    const int inner = gpu ? 6 : static_cast<int>(std::clamp(per_timing / flops, 1.0, 64.0));
    auto attend = [&] {
      for (const at::Tensor& qt : qs) sdpa(qt, kt, vt);
    };
    if (gpu)
      for (int i = 0; i < 50; ++i) attend();
    return median_seconds(d, inner, attend);
  };
  // t(calls) = F / (peak · ratio) · (1 / eff(q / calls) + calls · c · slots / tiles(q)), with
  // c the tiles a call loses: two timings give c and the ratio.
  const double peak16 = gpu ? r.rates.flops_per_s : r.rates.flops_per_s_f32;
  const double e1 = plan::attention_efficiency(q, heads, waves);
  const double a =
      waves.units > 0 ? double(waves.slots()) / double((q + plan::kAttentionTileRows - 1) / plan::kAttentionTileRows * heads) : 0;
  auto ratio_of = [&](int64_t kv, double t1, double c) {
    const double flops = 4.0 * double(q) * double(kv) * double(heads) * double(hd);
    return flops / (t1 * peak16) * (1.0 / e1 + c * a);
  };
  const int64_t kv = gpu ? 65536 : 1024;
  const double t1 = attention_seconds(kv, 1);
  if (waves.units > 0) {
    const double t4 = attention_seconds(kv, 4), ratio = t4 / t1;
    const double e4 = plan::attention_efficiency(q / 4, heads, waves);
    if (ratio < 4.0) r.rates.attention_call_tiles = std::max(0.0, (ratio / e1 - 1.0 / e4) / (a * (4.0 - ratio)));
  }
  r.rates.attention_ratio = ratio_of(kv, t1, r.rates.attention_call_tiles);
  r.rates.attention_ratio_ragged = ratio_of(kv + 37, attention_seconds(kv + 37, 1), r.rates.attention_call_tiles);
  // The fused row kernels' bandwidth: norm + modulation of a slab of wide 16-bit rows.
  if (gpu && fused::fused_rows_built()) {
    const auto o = at::TensorOptions().dtype(half).device(d);
    at::Tensor x = at::randn({8192, 5120}, o), out = at::empty({8192, 5120}, o), w = at::ones({5120}, o);
    const double moved = 2.0 * double(x.nbytes());
    r.rates.row_bytes_per_s = moved / median_seconds(d, 8, [&] { fused::norm_modulate(x, out, {true, 1e-6, w, {}}, {}, {}); });
    // Q/K norm per head + split-half RoPE on 96 of 128 dims, written head-major.
    const int64_t heads = 40, hd = 128, rot = 96;
    at::Tensor qk = at::randn({8192, heads * hd}, o), dst = at::empty({heads, 8192, hd}, o), qw = at::ones({hd}, o);
    at::Tensor cs = at::ones({8192, rot / 2}, o.dtype(at::kFloat)), sn = at::zeros({8192, rot / 2}, o.dtype(at::kFloat));
    r.rates.qk_bytes_per_s = 2.0 * double(qk.nbytes()) / median_seconds(d, 8, [&] {
      fused::qk_norm_rope(qk, dst.transpose(0, 1), ir::QkNormKind::PerHead, 1e-6, qw, {ir::RopeStyle::SplitHalf, rot, cs, sn});
    });
  }
  // Fixed cost of an operation: a run of one-element in-place additions. On a GPU also the
  // device's own share, with the host ahead of it (queued behind ~10 ms of matmuls, the
  // additions timed between marks in the device's queue): a program whose dispatch keeps
  // ahead of its kernels costs its device time (plan/cost.hpp).
  {
    at::Tensor t = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(d));
    r.rates.launch_s = median_seconds(d, 200, [&] { t.add_(1.0); });
    r.rates.launch_gap_s = r.rates.launch_s;
    if (gpu) {
      const auto o = at::TensorOptions().dtype(half).device(d);
      at::Tensor a = at::randn({8192, 4096}, o), w = at::randn({4096, 4096}, o), out = at::empty({8192, 4096}, o);
      constexpr int kOps = 500;
      for (int rep = 0; rep < 3; ++rep) {
        for (int i = 0; i < 25; ++i) at::mm_out(out, a, w);
        const Mark start(d);
        for (int i = 0; i < kOps; ++i) t.add_(1.0);
        const Mark stop(d);
        synchronize(d);
        r.rates.launch_gap_s = std::min(r.rates.launch_gap_s, std::max(start.ms_until(stop) / 1e3 / kOps, 1e-9));
      }
    }
  }
  r.probe_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const double busy1 = machine_busy_seconds();
  if (busy0 >= 0 && busy1 >= 0 && r.probe_ms > 0)
    r.other_cores = std::max(0.0, (busy1 - busy0) - (own_cpu_seconds() - own0)) / (r.probe_ms / 1e3);
  return r;
}

std::vector<std::string> sanity_problems(const ProbeResult& r, bool gpu) {
  std::vector<std::string> out;
  auto within = [&](const char* name, double v, double lo, double hi, const char* unit, double scale) {
    if (!(v >= lo && v <= hi)) {
      char b[160];
      std::snprintf(b, sizeof b, "%s %.3g %s (expected %.3g to %.3g)", name, v / scale, unit, lo / scale, hi / scale);
      out.push_back(b);
    }
  };
  // Physical limits, wide: no device of either kind falls outside them.
  const double flops_hi = gpu ? 1e16 : 1e14;
  within("flops_per_s", r.rates.flops_per_s, gpu ? 1e12 : 2e8, flops_hi, "GFLOP/s", 1e9);
  within("flops_per_s_f32", r.rates.flops_per_s_f32, gpu ? 1e11 : 2e8, flops_hi, "GFLOP/s", 1e9);
  within("bytes_per_s", r.rates.bytes_per_s, gpu ? 1e11 : 5e8, 5e13, "GB/s", 1e9);
  within("launch_s", r.rates.launch_s, 2e-7, 2e-3, "us", 1e-6);
  within("host_bytes_per_s", r.rates.host_bytes_per_s, 1e8, 5e12, "GB/s", 1e9);
  // Related rates. SDPA: 20% to 150% of the matmul peak (noisy probes gave 7%), ragged not
  // faster nor 20 times slower. fp32 matmuls: not faster than twice the 16-bit ones nor 64 times
  // slower on a GPU; a CPU may emulate 16-bit ones (29 times slower here), not beyond 200 times.
  // A GPU's launch gap is not above the host's cost of the operation.
  within("attention_ratio", r.rates.attention_ratio, 0.2, 1.5, "of the matmul peak", 1.0);
  // At most 4 tiles at once per multiprocessor (what the probe tries), and a wave of one tile
  // each not longer than a full one.
  within("attention_unit_tiles", r.rates.attention_unit_tiles, 1.0, 4.0, "tiles", 1.0);
  within("attention_lone_wave", r.rates.attention_lone_wave, 0.05, 1.0, "of a full wave", 1.0);
  if (r.rates.attention_ratio > 0)
    within("attention_ratio_ragged / attention_ratio", r.rates.attention_ratio_ragged / r.rates.attention_ratio, 0.05, 1.1, "", 1.0);
  if (r.rates.flops_per_s > 0)
    within("flops_per_s_f32 / flops_per_s", r.rates.flops_per_s_f32 / r.rates.flops_per_s, 1.0 / 64, gpu ? 2.0 : 200.0, "", 1.0);
  if (gpu && r.rates.launch_s > 0) within("launch_gap_s / launch_s", r.rates.launch_gap_s / r.rates.launch_s, 0.0, 1.5, "", 1.0);
  return out;
}

std::optional<ProbeResult> cached_probe(const contracts::DeviceCaps& caps) {
  const std::string path = probe_cache_path(caps);
  ProbeResult r;
  if (path.empty() || !read_cache(path, probe_key(caps), r)) return std::nullopt;
  r.from_cache = r.cached = true;
  r.cache_path = path;
  return r;
}

ProbeResult probe_device(const at::Device& d, const contracts::DeviceCaps& caps, bool use_cache) {
  if (use_cache)
    if (auto cached = cached_probe(caps)) return *cached;
  const std::string path = probe_cache_path(caps);
  ProbeResult r;
  // Other processes busy on more than this many cores during the probe: its figures are this
  // moment's, not the machine's.
  constexpr double kOtherCores = 0.25;
  constexpr int kAttempts = 3;
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    r = measure_rates(d, caps);
    r.attempts = attempt;
    std::vector<std::string> bad = sanity_problems(r, d.is_cuda());
    if (!d.is_cuda() && r.other_cores > kOtherCores) {
      char b[160];
      std::snprintf(b, sizeof b, "other processes kept %.2f CPU cores busy during the probe", r.other_cores);
      bad.push_back(b);
    }
    r.untrusted = c10::Join("; ", bad);
    if (r.untrusted.empty()) break;
    if (attempt < kAttempts) std::this_thread::sleep_for(std::chrono::milliseconds(200 * attempt));
  }
  if (!path.empty()) {
    r.cache_path = path;
    if (r.untrusted.empty()) {
      write_cache(path, r);
      r.cached = true;
    }
  }
  return r;
}

contracts::DeviceCaps run_device(const at::Device& d) {
  contracts::DeviceCaps caps = describe_device(d);
  caps.rates = probe_device(d, caps).rates;
  // The sdpa consumer's kernel for the video models' head_dim, measured now rather than inside
  // a run's first attention (whose device memory may be capped).
  if (d.is_cuda())
    for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) sdpa_kernel(d, dt, 128);
  return caps;
}

plan::Options plan_options(const RunChoices& c, const at::Device& d) {
  plan::Options o;
  o.token_chunk = c.token_chunk;
  o.feature_slice = c.feature_slice;
  o.kv_budget = c.kv_budget;
  if (!c.budget.empty()) o.budget_bytes = plan::budget_from_option(c.budget, describe_device(d));
  return o;
}

bool forget_probe(const contracts::DeviceCaps& caps) {
  const std::string path = probe_cache_path(caps);
  return !path.empty() && std::remove(path.c_str()) == 0;
}

std::string forget_if_off(const contracts::DeviceCaps& caps, double estimated_ms, double measured_ms) {
  // Runs of a few ms are mostly what no rate describes (allocation, dispatch of the first
  // calls): they say nothing about the probe.
  constexpr double kShortestMs = 100;
  if (!(estimated_ms > 0 && measured_ms >= kShortestMs)) return "";
  const double ratio = estimated_ms / measured_ms;
  if (ratio <= 2.0 && ratio >= 0.5) return "";
  char b[256];
  std::snprintf(b, sizeof b, "the estimated time (%.1f ms) is %.2fx the measured (%.1f ms): ", estimated_ms, ratio,
                measured_ms);
  return std::string(b) + (forget_probe(caps) ? "the cached device rates were dropped; the next run measures them again"
                                               : "no cached device rates to drop");
}

nlohmann::json probe_json(const ProbeResult& r) {
  nlohmann::json j = cache_json(r);
  j.update({{"from_cache", r.from_cache}, {"cached", r.cached}, {"attempts", r.attempts},
            {"other_cores", r.other_cores}, {"untrusted", r.untrusted}, {"cache_path", r.cache_path}});
  return j;
}

std::string probe_text(const ProbeResult& r) {
  std::ostringstream os;
  char b[200];
  auto line = [&](const char* name, double v, const char* unit, double scale) {
    std::snprintf(b, sizeof b, "  %-24s %10.4g %s\n", name, v / scale, unit);
    os << b;
  };
  os << "device rates for " << r.key << "\n";
  for (const auto& f : contracts::kRateFields)
    if (f.zero != contracts::RateZero::Absent || r.rates.*f.member > 0) line(f.name, r.rates.*f.member, f.unit, f.scale);
  line("probe_ms", r.probe_ms, "ms to measure", 1);
  if (r.from_cache) os << "  from the cache " << r.cache_path << "\n";
  else if (r.cached) os << "  measured now (" << r.attempts << (r.attempts == 1 ? " probe" : " probes") << "), cached in " << r.cache_path << "\n";
  else os << "  measured now (" << r.attempts << " probes), not cached: " << r.untrusted << "\n";
  if (!r.from_cache) {
    std::snprintf(b, sizeof b, "  other processes meanwhile: %.2f CPU cores busy\n", r.other_cores);
    os << b;
  }
  return os.str();
}

}  // namespace sp::exec
