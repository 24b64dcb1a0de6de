#include "report/attention_inputs.hpp"

#include <stdexcept>

#include "exec/consumers/block_sparse.hpp"

namespace sp::report {

namespace {

at::Tensor normal(at::IntArrayRef shape, at::Generator& gen) {
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat));
}

// A smooth random field over the grid: [grid volume, channels] fp32, unit variance per channel.
at::Tensor smooth_field(const std::array<int64_t, 3>& g, int64_t channels, at::Generator& gen) {
  const at::Tensor coarse = normal({1, channels, (g[0] + 3) / 4, (g[1] + 3) / 4, (g[2] + 3) / 4}, gen);
  at::Tensor f = at::upsample_trilinear3d(coarse, {g[0], g[1], g[2]}, /*align_corners=*/true)
                     .view({channels, g[0] * g[1] * g[2]})
                     .t();
  f = f - f.mean(0, true);
  return f / f.std(0, true, true).clamp_min(1e-6);
}

}  // namespace

const std::vector<std::string>& attention_distributions() {
  static const std::vector<std::string> d = {"gaussian", "outlier-k", "peaky", "qk-norm", "video-local"};
  return d;
}

std::pair<int64_t, int64_t> grid_rows(const AttnShape& s) {
  return {s.text_rows, s.text_rows + s.grid[0] * s.grid[1] * s.grid[2]};
}

AttnInputs attention_inputs(const std::string& distribution, const AttnShape& s, const at::TensorOptions& o,
                            uint64_t seed) {
  const auto& known = attention_distributions();
  if (std::find(known.begin(), known.end(), distribution) == known.end())
    throw std::invalid_argument("--distribution: unknown '" + distribution +
                                "' (gaussian, outlier-k, peaky, qk-norm, video-local)");
  const auto [v0, v1] = grid_rows(s);
  if (s.tokens < 1 || s.heads < 1 || s.head_dim < 1 || s.text_rows < 0 || v1 > s.tokens || s.grid[0] < 0 ||
      s.grid[1] < 0 || s.grid[2] < 0)
    throw std::invalid_argument("attention inputs: " + std::to_string(s.tokens) + " tokens cannot hold " +
                                std::to_string(s.text_rows) + " text rows and a video grid of " +
                                std::to_string(v1 - v0) + " rows");
  at::Generator gen = at::detail::createCPUGenerator(seed + 1);
  const int64_t h = s.heads, n = s.tokens, d = s.head_dim;
  at::Tensor q = normal({1, h, n, d}, gen), k = normal({1, h, n, d}, gen), v = normal({1, h, n, d}, gen);
  if (distribution == "gaussian") {
    k += normal({1, 1, 1, d}, gen);
  } else if (distribution == "outlier-k") {
    k += 3 * normal({1, 1, 1, d}, gen);
    for (int64_t c : {int64_t{3}, d / 5, d / 2, d - 7}) k.select(3, std::clamp<int64_t>(c, 0, d - 1)).mul_(20);
  } else if (distribution == "peaky") {
    const at::Tensor pick = at::randint(n, {n}, gen, at::TensorOptions().dtype(at::kLong));
    q = 1.5 * k.index_select(2, pick) + 0.5 * normal({1, h, n, d}, gen);
  } else if (distribution == "qk-norm") {
    auto rms_norm = [](const at::Tensor& x) { return x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6); };
    q = rms_norm(q) * (4 + 4 * at::rand({d}, gen, at::TensorOptions().dtype(at::kFloat)));
    k = rms_norm(k) * (4 + 4 * at::rand({d}, gen, at::TensorOptions().dtype(at::kFloat)));
  } else if (v1 > v0) {  // video-local
    const at::Tensor f = smooth_field(s.grid, h * d, gen).view({v1 - v0, h, d}).permute({1, 0, 2}).unsqueeze(0);
    q.narrow(2, v0, v1 - v0).copy_(f + 0.5 * normal(f.sizes(), gen));
    k.narrow(2, v0, v1 - v0).copy_(f + 0.5 * normal(f.sizes(), gen));
  }
  return {q.to(o), k.to(o), v.to(o)};
}

at::Tensor grid_tile_centres(const AttnShape& s, int64_t tile) {
  const auto [v0, v1] = grid_rows(s);
  const int64_t tiles = (s.tokens + tile - 1) / tile;
  at::Tensor pos = at::zeros({tiles * tile, 3}, at::kFloat);
  at::Tensor count = at::zeros({tiles * tile, 1}, at::kFloat);
  if (v1 > v0) {
    const at::Tensor r = at::arange(v1 - v0, at::kLong);
    const int64_t hw = s.grid[1] * s.grid[2];
    pos.narrow(0, v0, v1 - v0).copy_(at::stack({r.div(hw, "floor"), r.remainder(hw).div(s.grid[2], "floor"),
                                                r.remainder(s.grid[2])}, 1));
    count.narrow(0, v0, v1 - v0).fill_(1);
  }
  return pos.view({tiles, tile, 3}).sum(1) / count.view({tiles, tile, 1}).sum(1).clamp_min(1);
}

at::Tensor window_tiles(const AttnShape& s, double budget, const at::Device& device) {
  const auto [v0, v1] = grid_rows(s);
  const at::Tensor c = grid_tile_centres(s, exec::kSparseTile).to(device);
  // Dot products that rank key tiles by distance: 2 a.b - |b|^2 = |a|^2 - |a - b|^2.
  const at::Tensor qf = at::cat({2 * c, at::ones({c.size(0), 1}, c.options())}, 1).unsqueeze(0);
  const at::Tensor kf = at::cat({c, -c.pow(2).sum(1, true)}, 1).unsqueeze(0);
  return exec::route_by(qf, kf, s.tokens, {v0, v1}, budget).expand({s.heads, -1, -1});
}

}  // namespace sp::report
