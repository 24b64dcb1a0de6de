// Standalone check of the INT8 attention kernels (no ATen): small awkward shapes against a
// CPU fp32 reference (dense and block-sparse, bf16 and fp16), each on the portable kernel and,
// where the device runs it, the sm_90a one; then timings of both at video models' shapes.
//   nvcc -O3 -std=c++17 -arch=sm_90a -Isrc src/exec/kernels/int8_attention.cu \
//        src/exec/kernels/int8_attention_sm90.cu tests/standalone/int8_attention_main.cu \
//        -o int8_attention_check
//   ./int8_attention_check [--no-check] [--sm90-only] [--sparse-only] [tokens heads ...]
//   (default shapes 75600 40 75072 56; tokens 0: no timings; --sm90-only: no portable timings;
//   --no-check, first: timings only; --sparse-only: only the 30% lists timed)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "exec/kernels/int8_attention.cuh"
#include "exec/kernels/int8_attention_sm90.cuh"

using namespace sp::kernels;

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);     \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

struct Carrier {  // quantized Q or K on the device
  int8_t* q = nullptr;
  float* scale = nullptr;
  float* mean = nullptr;
  float* head_mean = nullptr;
};

static Carrier alloc_carrier(int heads, int rows, int D) {
  Carrier c;
  const int64_t tiles = attn_tiles(rows);
  CK(cudaMalloc(&c.q, heads * tiles * 64 * D));
  CK(cudaMalloc(&c.scale, heads * tiles * 4));
  CK(cudaMalloc(&c.mean, heads * tiles * D * 4));
  CK(cudaMalloc(&c.head_mean, heads * D * 4));
  return c;
}
static void quantize_into(const Carrier& c, const void* x, Elem type, int heads, int rows, int D, bool smooth,
                          float extra) {
  AttnQuantParams p;
  p.x = x; p.head_stride = int64_t(rows) * D; p.row_stride = D; p.type = type;
  p.heads = heads; p.rows = rows; p.head_dim = D; p.extra_scale = extra;
  p.tile_mean = c.mean;
  if (smooth) {
    CK(attn_quantize(p, 0));  // means only
    CK(attn_head_mean(c.mean, heads, rows, D, c.head_mean, 0));
    p.tile_mean = nullptr;
    p.subtract = c.head_mean;
  }
  p.out = c.q; p.scale = c.scale;
  CK(attn_quantize(p, 0));
}
static Carrier quantize(const void* x, Elem type, int heads, int rows, int D, bool smooth, float extra) {
  Carrier c = alloc_carrier(heads, rows, D);
  quantize_into(c, x, type, heads, rows, D, smooth, extra);
  return c;
}
static void release(Carrier& c) { cudaFree(c.q); cudaFree(c.scale); cudaFree(c.mean); cudaFree(c.head_mean); }

// keep[h][qt][kt]; empty: dense. Returns rel L2 of the kernel vs fp32 reference.
static const char* path_name(AttnPath path) { return path == AttnPath::Sm90 ? "sm90" : "portable"; }

static double check(int heads, int qrows, int kvrows, int D, double budget, bool f16, AttnPath path, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int qt = attn_tiles(qrows), kt = attn_tiles(kvrows);
  std::vector<float> q(size_t(heads) * qrows * D), k(size_t(heads) * kvrows * D), v(size_t(heads) * kvrows * D);
  std::vector<float> bias(D);
  for (auto& b : bias) b = 2.0f * nd(rng);
  // 16-bit inputs (bf16 or fp16 bits), the reference from the same rounded values.
  auto round16 = [&](float x, uint16_t& bits) {
    if (f16) { const __half h = __float2half(x); bits = *reinterpret_cast<const uint16_t*>(&h); return __half2float(h); }
    const __nv_bfloat16 b = __float2bfloat16(x); bits = *reinterpret_cast<const uint16_t*>(&b); return __bfloat162float(b);
  };
  std::vector<uint16_t> qb(q.size()), kb(k.size()), vb(v.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = round16(nd(rng), qb[i]);
  for (size_t i = 0; i < k.size(); ++i) k[i] = round16(nd(rng) + bias[i % D], kb[i]);
  for (size_t i = 0; i < v.size(); ++i) v[i] = round16(nd(rng), vb[i]);
  const Elem type = f16 ? Elem::F16 : Elem::BF16;
  // routing: random subset of ceil(budget*kt) tiles per (h, qtile)
  std::vector<char> keep(size_t(heads) * qt * kt, 1);
  std::vector<int32_t> off(1, 0), idx;
  const bool sparse = budget < 1.0;
  for (int h = 0; h < heads; ++h)
    for (int a = 0; a < qt; ++a) {
      std::vector<int> perm(kt);
      for (int i = 0; i < kt; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      const int n = std::max(1, int(std::ceil(budget * kt)));
      char* row = &keep[(size_t(h) * qt + a) * kt];
      if (sparse) {
        for (int i = 0; i < kt; ++i) row[i] = 0;
        for (int i = 0; i < n; ++i) row[perm[i]] = 1;
      }
      for (int i = 0; i < kt; ++i)
        if (row[i]) idx.push_back(i);
      off.push_back(int32_t(idx.size()));
    }
  const float scale = 1.0f / std::sqrt(float(D));
  uint16_t *dq, *dk, *dv, *dout;
  CK(cudaMalloc(&dq, qb.size() * 2)); CK(cudaMalloc(&dk, kb.size() * 2)); CK(cudaMalloc(&dv, vb.size() * 2));
  CK(cudaMalloc(&dout, qb.size() * 2));
  CK(cudaMemcpy(dq, qb.data(), qb.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice));
  Carrier cq = quantize(dq, type, heads, qrows, D, false, scale * 1.4426950408889634f);
  Carrier ck = quantize(dk, type, heads, kvrows, D, true, 1.0f);
  int32_t *doff = nullptr, *didx = nullptr;
  if (sparse) {
    CK(cudaMalloc(&doff, off.size() * 4)); CK(cudaMalloc(&didx, idx.size() * 4));
    CK(cudaMemcpy(doff, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(didx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
  }
  Int8AttnParams p;
  p.q = cq.q; p.q_scale = cq.scale; p.k = ck.q; p.k_scale = ck.scale; p.v = dv;
  p.v_head_stride = int64_t(kvrows) * D; p.v_row_stride = D; p.o = dout;
  p.o_head_stride = int64_t(qrows) * D; p.o_row_stride = D; p.type = type;
  p.heads = heads; p.q_rows = qrows; p.kv_rows = kvrows; p.head_dim = D; p.offsets = doff; p.indices = didx;
  p.path = path;
  CK(cudaMemset(dout, 0xff, qb.size() * 2));  // NaN: rows the kernel leaves unwritten fail
  CK(int8_attention(p, 0));
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> ob(qb.size());
  CK(cudaMemcpy(ob.data(), dout, ob.size() * 2, cudaMemcpyDeviceToHost));
  auto value = [&](uint16_t bits) {
    return f16 ? __half2float(*reinterpret_cast<const __half*>(&bits)) : __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(&bits));
  };
  // Also check the tile means of K against the host.
  double num = 0, den = 0;
  std::vector<float> s(kvrows);
  for (int h = 0; h < heads; ++h)
    for (int r = 0; r < qrows; ++r) {
      float mx = -INFINITY;
      for (int j = 0; j < kvrows; ++j) {
        if (!keep[(size_t(h) * qt + r / 64) * kt + j / 64]) { s[j] = -INFINITY; continue; }
        float acc = 0;
        for (int d = 0; d < D; ++d) acc += q[(size_t(h) * qrows + r) * D + d] * k[(size_t(h) * kvrows + j) * D + d];
        s[j] = acc * scale;
        mx = std::max(mx, s[j]);
      }
      double l = 0;
      for (int j = 0; j < kvrows; ++j) { s[j] = s[j] == -INFINITY ? 0.f : std::exp(s[j] - mx); l += s[j]; }
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int j = 0; j < kvrows; ++j) o += s[j] * v[(size_t(h) * kvrows + j) * D + d];
        o /= l;
        const double got = value(ob[(size_t(h) * qrows + r) * D + d]);
        num += (got - o) * (got - o);
        den += o * o;
      }
    }
  release(cq); release(ck);
  cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(doff); cudaFree(didx);
  return num == num ? std::sqrt(num / den) : INFINITY;
}

__global__ void fill(__nv_bfloat16* x, size_t n, unsigned seed, float bias_amp, int D) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    unsigned h2 = h * 747796405u + 2891336453u;
    const float u1 = (h & 0xffffff) / 16777216.0f + 1e-7f, u2 = (h2 & 0xffffff) / 16777216.0f;
    const float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    x[i] = __float2bfloat16(z + bias_amp * sinf(float(i % D)));
  }
}

// rel L2 of the first 64 rows of head 0 against attention in fp64 on the host.
static double head0_rel_l2(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                           const __nv_bfloat16* o, int tokens, int D) {
  std::vector<__nv_bfloat16> hq(size_t(64) * D), hk(size_t(tokens) * D), hv(size_t(tokens) * D), ho(size_t(64) * D);
  CK(cudaMemcpy(hq.data(), q, hq.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hk.data(), k, hk.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hv.data(), v, hv.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ho.data(), o, ho.size() * 2, cudaMemcpyDeviceToHost));
  const double scale = 1.0 / std::sqrt(double(D));
  double num = 0, den = 0;
  std::vector<double> s(tokens);
  for (int r = 0; r < 64; ++r) {
    double mx = -1e30;
    for (int j = 0; j < tokens; ++j) {
      double a = 0;
      for (int d = 0; d < D; ++d) a += double(__bfloat162float(hq[r * D + d])) * __bfloat162float(hk[size_t(j) * D + d]);
      s[j] = a * scale; mx = std::max(mx, s[j]);
    }
    double l = 0;
    for (int j = 0; j < tokens; ++j) { s[j] = std::exp(s[j] - mx); l += s[j]; }
    for (int d = 0; d < D; ++d) {
      double acc = 0;
      for (int j = 0; j < tokens; ++j) acc += s[j] * __bfloat162float(hv[size_t(j) * D + d]);
      acc /= l;
      const double got = __bfloat162float(ho[r * D + d]);
      num += (got - acc) * (got - acc); den += acc * acc;
    }
  }
  return std::sqrt(num / den);
}

// Both kernels at one shape: dense, the list of every key tile (budget 1.0) and 30% of them.
static void bench(int tokens, int heads, int D, bool sm90, bool portable, bool sparse_only) {
  const size_t n = size_t(tokens) * heads * D;
  __nv_bfloat16 *q, *k, *v, *o;
  CK(cudaMalloc(&q, n * 2)); CK(cudaMalloc(&k, n * 2)); CK(cudaMalloc(&v, n * 2)); CK(cudaMalloc(&o, n * 2));
  fill<<<1024, 256>>>(q, n, 1u, 0.f, D); fill<<<1024, 256>>>(k, n, 2u, 2.f, D); fill<<<1024, 256>>>(v, n, 3u, 0.f, D);
  const float scale = 1.0f / std::sqrt(float(D));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0); cudaEventCreate(&e1);
  Carrier cq = alloc_carrier(heads, tokens, D), ck = alloc_carrier(heads, tokens, D);
  float qms = 0, kms = 0;
  for (int rep = 0; rep < 2; ++rep) {  // the first a warm-up
    cudaEventRecord(e0);
    quantize_into(cq, q, Elem::BF16, heads, tokens, D, false, scale * 1.4426950408889634f);
    cudaEventRecord(e1);
    quantize_into(ck, k, Elem::BF16, heads, tokens, D, true, 1.0f);
    cudaEvent_t e2;
    cudaEventCreate(&e2);
    cudaEventRecord(e2); CK(cudaEventSynchronize(e2));
    cudaEventElapsedTime(&qms, e0, e1); cudaEventElapsedTime(&kms, e1, e2);
    cudaEventDestroy(e2);
  }
  std::printf("bench tokens=%d heads=%d D=%d: quantize Q %.2f ms (tile means too), K %.2f ms (means, head mean, "
              "int8)\n", tokens, heads, D, qms, kms);
  const int qt = attn_tiles(tokens), kt = qt;
  const double dense_flops = 4.0 * tokens * double(tokens) * heads * D;
  struct Run { double budget; bool list; };
  for (const Run run : {Run{1.0, false}, Run{1.0, true}, Run{0.3, true}}) {
    if (sparse_only && run.budget == 1.0) continue;
    int32_t *doff = nullptr, *didx = nullptr;
    const int keep = std::max(1, int(std::ceil(run.budget * kt)));
    if (run.list) {
      std::vector<int32_t> off(size_t(heads) * qt + 1), idx(size_t(heads) * qt * keep);
      std::mt19937 rng(7);
      std::vector<int> perm(kt);
      for (size_t a = 0; a < size_t(heads) * qt; ++a) {
        off[a] = int32_t(a * keep);
        for (int i = 0; i < kt; ++i) perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), rng);
        std::sort(perm.begin(), perm.begin() + keep);
        for (int i = 0; i < keep; ++i) idx[a * keep + i] = perm[i];
      }
      off.back() = int32_t(idx.size());
      CK(cudaMalloc(&doff, off.size() * 4)); CK(cudaMalloc(&didx, idx.size() * 4));
      CK(cudaMemcpy(doff, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(didx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
    }
    for (const AttnPath path : {AttnPath::Portable, AttnPath::Sm90}) {
      if (path == AttnPath::Sm90 ? !sm90 : !portable) continue;
      Int8AttnParams p;
      p.q = cq.q; p.q_scale = cq.scale; p.k = ck.q; p.k_scale = ck.scale; p.v = v;
      p.v_head_stride = int64_t(tokens) * D; p.v_row_stride = D; p.o = o;
      p.o_head_stride = int64_t(tokens) * D; p.o_row_stride = D; p.type = Elem::BF16;
      p.heads = heads; p.q_rows = tokens; p.kv_rows = tokens; p.head_dim = D; p.offsets = doff; p.indices = didx;
      p.path = path;
      CK(int8_attention(p, 0));
      CK(cudaDeviceSynchronize());
      const int reps = 3;
      cudaEventRecord(e0);
      for (int i = 0; i < reps; ++i) int8_attention(p, 0);
      cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
      float ms = 0; cudaEventElapsedTime(&ms, e0, e1); ms /= reps;
      const double visited = run.list ? double(keep) / kt : 1.0;
      std::printf("bench tokens=%d heads=%d D=%d %-8s %-6s budget=%.2f: %.2f ms, %.1f TFLOP/s of visited tiles, "
                  "%.1f dense-equivalent TFLOP/s", tokens, heads, D, path_name(path), run.list ? "list" : "dense",
                  run.budget, ms, dense_flops * visited / ms / 1e9, dense_flops / ms / 1e9);
      if (run.budget == 1.0) std::printf(", rel_l2 %.4g (64 rows of head 0 vs fp64)", head0_rel_l2(q, k, v, o, tokens, D));
      std::printf("\n");
    }
    cudaFree(doff); cudaFree(didx);
  }
  release(cq); release(ck);
  cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o);
}

int main(int argc, char** argv) {
  int fails = 0;
  const bool sm90 = int8_attention_sm90_ready();
  std::printf("sm_90a kernel %s; head_dim 128 runs %s\n", sm90 ? "ready" : "not available",
              sm90 ? "the sm90 kernel" : "the portable kernel");
  struct Case { int heads, qrows, kvrows, D; double budget; bool f16; };
  const Case cases[] = {{3, 130, 130, 64, 1.0, false}, {3, 200, 200, 128, 1.0, false}, {3, 77, 200, 128, 1.0, false},
                        {3, 130, 200, 64, 0.3, false}, {3, 200, 200, 128, 0.3, false}, {3, 77, 130, 128, 0.3, false},
                        {1, 64, 64, 128, 1.0, false}, {2, 1, 1, 64, 1.0, false}, {3, 257, 1000, 128, 0.3, false},
                        {3, 130, 130, 128, 1.0, false}, {2, 1, 1, 128, 1.0, false}, {2, 300, 700, 128, 1.0, false},
                        {3, 577, 77, 128, 1.0, false}, {3, 200, 333, 128, 1.0, true}, {3, 130, 257, 128, 0.3, true},
                        {3, 130, 130, 64, 1.0, true},  {2, 200, 3999, 128, 0.5, true}};
  unsigned seed = 1;
  const bool checks = !(argc > 1 && std::string(argv[1]) == "--no-check");
  for (const Case& c : cases) {
    if (!checks) break;
    for (const AttnPath path : {AttnPath::Portable, AttnPath::Sm90}) {
      if (path == AttnPath::Sm90 && (!sm90 || c.D != 128)) continue;
      const double r = check(c.heads, c.qrows, c.kvrows, c.D, c.budget, c.f16, path, seed);
      const bool ok = r <= 2e-2;
      fails += !ok;
      std::printf("%s %-8s heads=%d q_rows=%d kv_rows=%d D=%d budget=%.1f %s rel_l2=%.4g\n", ok ? "PASS" : "FAIL",
                  path_name(path), c.heads, c.qrows, c.kvrows, c.D, c.budget, c.f16 ? "fp16" : "bf16", r);
    }
    ++seed;
  }
  std::vector<int> shapes;
  bool portable = true, sparse_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--sm90-only") portable = false;
    else if (std::string(argv[i]) == "--sparse-only") sparse_only = true;
    else if (std::string(argv[i]) != "--no-check") shapes.push_back(std::atoi(argv[i]));
  }
  if (shapes.empty()) shapes = {75600, 40, 75072, 56};
  for (size_t i = 0; i + 1 < shapes.size(); i += 2)
    if (shapes[i] > 0) bench(shapes[i], shapes[i + 1], 128, sm90, portable || !sm90, sparse_only);
  std::printf("%s\n", fails ? "SOME FAILED" : "ALL PASSED");
  return fails ? 1 : 0;
}
