// Standalone check of the INT8 attention kernels (no ATen): small awkward shapes against a
// CPU fp32 reference (dense and block-sparse, bf16 and fp16, V and O with heads innermost,
// empty and unsorted lists), each on the portable kernel and, where the device runs it, the
// sm_90a warp-specialized one (against the portable one's output too), with the bounded softmax
// (and the redo of the rows it flags) where the inputs are bf16 and with the online softmax
// alone; then timings of all at video models' shapes (dense, the list of every tile, 30% lists).
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc src/exec/kernels/int8_attention.cu \
//        src/exec/kernels/int8_attention_sm90.cu src/exec/kernels/int8_attention_sm90_ws.cu \
//        tests/standalone/int8_attention_main.cu -o int8_attention_check
//   ./int8_attention_check [--no-check] [--sm90-only] [--sparse-only] [tokens heads ...]
//   (default shapes 75600 40 75072 56; tokens 0: no timings; --sm90-only: no portable timings;
//   --no-check, first: timings only; --sparse-only: only the 30% lists timed)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "exec/kernels/int8_attention.cuh"
#include "exec/kernels/int8_attention_sm90.cuh"
#include "exec/kernels/int8_attention_sm90_ws.cuh"

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
  float* norm = nullptr;  // [heads] the bound of the bounded softmax (K)
};

static Carrier alloc_carrier(int heads, int rows, int D) {
  Carrier c;
  const int64_t tiles = attn_tiles(rows);
  CK(cudaMalloc(&c.q, heads * tiles * 64 * D));
  CK(cudaMalloc(&c.scale, heads * tiles * 4));
  CK(cudaMalloc(&c.mean, heads * tiles * D * 4));
  CK(cudaMalloc(&c.head_mean, heads * D * 4));
  CK(cudaMalloc(&c.norm, heads * 4));
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
  p.out = c.q; p.scale = c.scale; p.norm = c.norm;
  CK(cudaMemset(c.norm, 0, heads * 4));
  CK(attn_quantize(p, 0));
}
static Carrier quantize(const void* x, Elem type, int heads, int rows, int D, bool smooth, float extra) {
  Carrier c = alloc_carrier(heads, rows, D);
  quantize_into(c, x, type, heads, rows, D, smooth, extra);
  return c;
}
static void release(Carrier& c) {
  cudaFree(c.q); cudaFree(c.scale); cudaFree(c.mean); cudaFree(c.head_mean); cudaFree(c.norm);
}

// The kernels a check or a timing runs: the portable one, the sm_90a warp-specialized one (its
// dense kernel with and without ping-pong) as int8_attention runs it (the bounded softmax and
// its redo where the parameters take it) and with the online softmax alone ("-exact").
enum class Kern { Portable, Ws, WsPingPong, WsExact, WsBoundedPass, WsRedoPass };
static const char* kern_name(Kern k) {
  switch (k) {
    case Kern::Portable: return "portable";
    case Kern::Ws: return "sm90-ws";
    case Kern::WsPingPong: return "ws-pp";
    case Kern::WsExact: return "ws-exact";
    case Kern::WsBoundedPass: return "ws-pass1";
    case Kern::WsRedoPass: return "ws-pass2";
  }
  return "?";
}
static bool exact_kern(Kern k) { return k == Kern::WsExact || k == Kern::WsRedoPass; }
static cudaError_t run_kernel(Kern k, Int8AttnParams p, cudaStream_t stream) {
  switch (k) {
    case Kern::Portable: p.path = AttnPath::Portable; return int8_attention(p, stream);
    case Kern::Ws: return int8_attention_sm90(p, stream);
    case Kern::WsPingPong: {
      Sm90WsOptions o;
      o.ping_pong = true;
      return run_softmax_passes(p, [&](SoftmaxPass pass) { return int8_attention_sm90_ws(p, stream, o, pass); });
    }
    case Kern::WsExact: return int8_attention_sm90_pass(p, stream, SoftmaxPass::Exact);
    case Kern::WsBoundedPass:  // the two passes of Ws apart (timings)
      return int8_attention_sm90_pass(p, stream, SoftmaxPass::Bounded);
    case Kern::WsRedoPass: return int8_attention_sm90_pass(p, stream, SoftmaxPass::Redo);
  }
  return cudaErrorInvalidValue;
}
// The query tiles the last bounded pass flagged (any of their four bytes set).
static int flagged_tiles(const uint8_t* check, int heads, int q_tiles) {
  std::vector<uint32_t> c(size_t(heads) * q_tiles);
  CK(cudaMemcpy(c.data(), check, c.size() * 4, cudaMemcpyDeviceToHost));
  int n = 0;
  for (uint32_t x : c) n += x != 0;
  return n;
}

struct Case {
  int heads, qrows, kvrows, D;
  double budget;  // < 1: a random list of ceil(budget * key tiles) per (head, query tile)
  bool f16;
  bool interleaved = false;  // V and O as [rows, heads, D] (strides D and heads * D)
  bool empty_some = false;   // every third list empty
  bool unsorted = false;     // lists in random order
  // Odd query tiles given a large component along one axis and the keys a large one of either
  // sign along another: those rows' Cauchy-Schwarz bound lies hundreds of log2 units above
  // their scores, so the bounded pass flags them and the redo recomputes them: their outputs
  // must be the online softmax's bits, the other rows within rounding of it. int8's own error
  // is large here (K tiles quantized against +-60: rel L2 about 0.14 for every kernel), so the
  // fp32 reference takes 0.2 and covers the other rows only.
  bool far_bound = false;
};

// Every kernel that runs this case against an fp32 host reference (rel L2 <= 2e-2, every output
// written); the warp-specialized kernel's 16-bit P·V output against the portable kernel's (the
// same quantized inputs: rel L2 <= 5e-3), the ping-pong kernel's bits against the plain one's.
// Returns the number of failures.
static int check(const Case& c, bool sm90, unsigned seed) {
  const int heads = c.heads, qrows = c.qrows, kvrows = c.kvrows, D = c.D;
  const bool f16 = c.f16;
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
  for (size_t i = 0; i < q.size(); ++i) {
    const bool far = c.far_bound && i % D == 0 && (i / D % qrows) / 64 % 2 == 1;
    q[i] = round16(nd(rng) + (far ? 60.0f : 0.0f), qb[i]);
  }
  for (size_t i = 0; i < k.size(); ++i) {
    const float far = c.far_bound && i % D == 1 ? (i / D % 2 ? 60.0f : -60.0f) : 0.0f;
    k[i] = round16(nd(rng) + bias[i % D] + far, kb[i]);
  }
  for (size_t i = 0; i < v.size(); ++i) v[i] = round16(nd(rng), vb[i]);
  const Elem type = f16 ? Elem::F16 : Elem::BF16;
  // V and O element (h, r, d): contiguous [heads, rows, D] or interleaved [rows, heads, D].
  const int64_t head_stride = c.interleaved ? D : 0, row_stride = c.interleaved ? int64_t(heads) * D : D;
  auto at = [&](int h, int r, int d, int rows) {
    return c.interleaved ? size_t(r) * row_stride + size_t(h) * D + d : (size_t(h) * rows + r) * D + d;
  };
  std::vector<uint16_t> vdev(vb.size());
  for (int h = 0; h < heads; ++h)
    for (int r = 0; r < kvrows; ++r)
      for (int d = 0; d < D; ++d) vdev[at(h, r, d, kvrows)] = vb[(size_t(h) * kvrows + r) * D + d];
  // routing: random subset of ceil(budget*kt) tiles per (h, qtile)
  std::vector<char> keep(size_t(heads) * qt * kt, 1);
  std::vector<int32_t> off(1, 0), idx;
  const bool sparse = c.budget < 1.0;
  for (int h = 0; h < heads; ++h)
    for (int a = 0; a < qt; ++a) {
      std::vector<int> perm(kt);
      for (int i = 0; i < kt; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      const int n = c.empty_some && (h * qt + a) % 3 == 1 ? 0 : std::max(1, int(std::ceil(c.budget * kt)));
      char* row = &keep[(size_t(h) * qt + a) * kt];
      if (sparse) {
        for (int i = 0; i < kt; ++i) row[i] = 0;
        for (int i = 0; i < n; ++i) row[perm[i]] = 1;
      }
      const size_t first = idx.size();
      for (int i = 0; i < kt; ++i)
        if (row[i]) idx.push_back(i);
      if (c.unsorted) std::shuffle(idx.begin() + first, idx.end(), rng);
      off.push_back(int32_t(idx.size()));
    }
  const float scale = 1.0f / std::sqrt(float(D));
  // The reference, [heads, qrows, D] (rows whose list is empty: zero).
  std::vector<double> ref(q.size());
  {
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
          ref[(size_t(h) * qrows + r) * D + d] = l > 0 ? o / l : 0.0;
        }
      }
  }
  uint16_t *dq, *dk, *dv, *dout;
  CK(cudaMalloc(&dq, qb.size() * 2)); CK(cudaMalloc(&dk, kb.size() * 2)); CK(cudaMalloc(&dv, vb.size() * 2));
  CK(cudaMalloc(&dout, qb.size() * 2));
  CK(cudaMemcpy(dq, qb.data(), qb.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, vdev.data(), vdev.size() * 2, cudaMemcpyHostToDevice));
  Carrier cq = quantize(dq, type, heads, qrows, D, false, scale * 1.4426950408889634f);
  Carrier ck = quantize(dk, type, heads, kvrows, D, true, 1.0f);
  int32_t *doff = nullptr, *didx = nullptr;
  if (sparse) {
    CK(cudaMalloc(&doff, off.size() * 4)); CK(cudaMalloc(&didx, std::max<size_t>(1, idx.size()) * 4));
    CK(cudaMemcpy(doff, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
    if (!idx.empty()) CK(cudaMemcpy(didx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
  }
  uint8_t* dcheck;
  CK(cudaMalloc(&dcheck, size_t(heads) * qt * 4));
  Int8AttnParams p;
  p.q = cq.q; p.q_scale = cq.scale; p.k = ck.q; p.k_scale = ck.scale; p.v = dv;
  p.k_norm = ck.norm; p.check = dcheck;
  p.v_head_stride = c.interleaved ? head_stride : int64_t(kvrows) * D; p.v_row_stride = row_stride; p.o = dout;
  p.o_head_stride = c.interleaved ? head_stride : int64_t(qrows) * D; p.o_row_stride = row_stride; p.type = type;
  p.heads = heads; p.q_rows = qrows; p.kv_rows = kvrows; p.head_dim = D; p.offsets = doff; p.indices = didx;
  auto value = [&](uint16_t bits) {
    return f16 ? __half2float(*reinterpret_cast<const __half*>(&bits)) : __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(&bits));
  };
  int fails = 0;
  std::vector<uint16_t> ob(qb.size()), portable_bits, ws_bits, ws_exact_bits;
  std::vector<Kern> kerns = {Kern::Portable};
  if (sm90 && D == 128)
    kerns.insert(kerns.end(), {Kern::WsExact, Kern::Ws, Kern::WsPingPong});
  auto far_row = [&](int r) { return c.far_bound && r / 64 % 2 == 1; };
  for (const Kern kern : kerns) {
    if (kern == Kern::WsPingPong && sparse) continue;  // the option is the dense kernel's
    CK(cudaMemset(dout, 0xff, qb.size() * 2));  // NaN: rows the kernel leaves unwritten fail
    CK(cudaMemset(dcheck, 0, size_t(heads) * qt * 4));
    const cudaError_t e = run_kernel(kern, p, 0);
    if (e == cudaErrorNotSupported) {  // e.g. the tensor maps refused: a failure, but not the end
      cudaGetLastError();
      ++fails;
      std::printf("FAIL %-8s heads=%d q_rows=%d kv_rows=%d: %s\n", kern_name(kern), heads, qrows, kvrows,
                  cudaGetErrorString(e));
      continue;
    }
    CK(e);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(ob.data(), dout, ob.size() * 2, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    size_t far_differ = 0;  // far rows' outputs against the online softmax's (bounded kernels)
    double near_num = 0, near_den = 0;  // the other rows against it
    const bool bounded = kern != Kern::Portable && !exact_kern(kern) && bounded_softmax_takes(p);
    for (int h = 0; h < heads; ++h)
      for (int r = 0; r < qrows; ++r)
        for (int d = 0; d < D; ++d) {
          if (far_row(r)) {
            if (bounded) far_differ += ob[at(h, r, d, qrows)] != ws_exact_bits[at(h, r, d, qrows)];
            continue;
          }
          const double o = ref[(size_t(h) * qrows + r) * D + d], got = value(ob[at(h, r, d, qrows)]);
          num += (got - o) * (got - o);
          den += o * o;
          if (bounded && c.far_bound) {
            const double e = value(ws_exact_bits[at(h, r, d, qrows)]);
            near_num += (got - e) * (got - e);
            near_den += e * e;
          }
        }
    const double rel = num == num ? std::sqrt(num / den) : INFINITY;
    bool ok = rel <= (c.far_bound ? 0.2 : 2e-2);
    if (bounded && c.far_bound) ok = ok && std::sqrt(near_num / near_den) <= 5e-3;
    char bits[96] = "";
    if (kern == Kern::Portable) portable_bits = ob;
    if (kern == Kern::Ws) ws_bits = ob;
    if (kern == Kern::WsExact) ws_exact_bits = ob;
    if (kern == Kern::WsPingPong) {
      size_t differ = 0;
      for (size_t i = 0; i < ob.size(); ++i) differ += ob[i] != ws_bits[i];
      ok = ok && differ == 0;
      std::snprintf(bits, sizeof bits, ", %zu elements differ from sm90-ws", differ);
    } else if ((kern == Kern::Ws || kern == Kern::WsExact) && !c.far_bound) {
      double n = 0, dd = 0;
      for (size_t i = 0; i < ob.size(); ++i) {
        const double a = value(ob[i]), b = value(portable_bits[i]);
        n += (a - b) * (a - b);
        dd += b * b;
      }
      const double against = dd > 0 ? std::sqrt(n / dd) : 0.0;
      ok = ok && against <= 5e-3;
      std::snprintf(bits, sizeof bits, ", %.3g from portable", against);
    }
    if (bounded) {
      // The far-bound case's odd tiles (in every head) must have been flagged, and only those.
      const int n = flagged_tiles(dcheck, heads, qt), want = c.far_bound ? heads * (qt / 2) : 0;
      ok = ok && n == want && far_differ == 0;
      std::snprintf(bits + std::strlen(bits), sizeof bits - std::strlen(bits), ", %d/%d tiles redone%s", n,
                    heads * qt, far_differ ? " (NOT the online softmax's bits)" : "");
    }
    fails += !ok;
    std::printf("%s %-8s heads=%d q_rows=%d kv_rows=%d D=%d budget=%.1f %s%s%s%s rel_l2=%.4g%s\n", ok ? "PASS" : "FAIL",
                kern_name(kern), heads, qrows, kvrows, D, c.budget, f16 ? "fp16" : "bf16",
                c.interleaved ? " interleaved" : "", c.empty_some ? " empty-lists" : "", c.unsorted ? " unsorted" : "",
                rel, bits);
  }
  release(cq); release(ck);
  cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(doff); cudaFree(didx); cudaFree(dcheck);
  return fails;
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

__global__ void count_differ(const uint16_t* a, const uint16_t* b, size_t n, unsigned long long* out) {
  unsigned long long c = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    c += a[i] != b[i];
  if (c) atomicAdd(out, c);
}

// All kernels at one shape: dense, the list of every key tile (budget 1.0) and 30% of them;
// the ping-pong kernel's output bit-compared with the plain one's.
static void bench(int tokens, int heads, int D, bool sm90, bool portable, bool sparse_only) {
  const size_t n = size_t(tokens) * heads * D;
  __nv_bfloat16 *q, *k, *v, *o, *o_ref;
  CK(cudaMalloc(&q, n * 2)); CK(cudaMalloc(&k, n * 2)); CK(cudaMalloc(&v, n * 2)); CK(cudaMalloc(&o, n * 2));
  CK(cudaMalloc(&o_ref, n * 2));
  unsigned long long* differ;
  CK(cudaMalloc(&differ, 8));
  fill<<<1024, 256>>>(q, n, 1u, 0.f, D); fill<<<1024, 256>>>(k, n, 2u, 2.f, D); fill<<<1024, 256>>>(v, n, 3u, 0.f, D);
  const float scale = 1.0f / std::sqrt(float(D));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0); cudaEventCreate(&e1);
  Carrier cq = alloc_carrier(heads, tokens, D), ck = alloc_carrier(heads, tokens, D);
  uint8_t* dcheck;
  CK(cudaMalloc(&dcheck, size_t(heads) * attn_tiles(tokens) * 4));
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
    std::vector<Kern> kerns;
    if (portable) kerns.push_back(Kern::Portable);
    if (sm90) kerns.insert(kerns.end(), {Kern::Ws, Kern::WsExact});
    if (sm90 && !run.list) kerns.insert(kerns.end(), {Kern::WsPingPong, Kern::WsBoundedPass, Kern::WsRedoPass});
    for (const Kern kern : kerns) {
      Int8AttnParams p;
      p.q = cq.q; p.q_scale = cq.scale; p.k = ck.q; p.k_scale = ck.scale; p.v = v;
      p.v_head_stride = int64_t(tokens) * D; p.v_row_stride = D; p.o = o;
      p.o_head_stride = int64_t(tokens) * D; p.o_row_stride = D; p.type = Elem::BF16;
      p.heads = heads; p.q_rows = tokens; p.kv_rows = tokens; p.head_dim = D; p.offsets = doff; p.indices = didx;
      p.k_norm = ck.norm; p.check = dcheck;
      CK(cudaMemset(o, 0xff, n * 2));
      CK(run_kernel(kern, p, 0));
      CK(cudaDeviceSynchronize());
      char bits[96] = "";
      if (kern == Kern::Ws) CK(cudaMemcpy(o_ref, o, n * 2, cudaMemcpyDeviceToDevice));
      if (sm90 && kern == Kern::WsPingPong) {
        CK(cudaMemset(differ, 0, 8));
        count_differ<<<1024, 256>>>(reinterpret_cast<const uint16_t*>(o), reinterpret_cast<const uint16_t*>(o_ref), n,
                                    differ);
        unsigned long long d = 0;
        CK(cudaMemcpy(&d, differ, 8, cudaMemcpyDeviceToHost));
        std::snprintf(bits, sizeof bits, ", %llu elements differ from sm90-ws", d);
      }
      if (kern != Kern::Portable && !exact_kern(kern))
        std::snprintf(bits + std::strlen(bits), sizeof bits - std::strlen(bits), ", %d tiles redone",
                      flagged_tiles(dcheck, heads, qt));
      const int reps = 3;
      float best = 1e30f, total = 0;
      for (int i = 0; i < reps; ++i) {
        cudaEventRecord(e0);
        run_kernel(kern, p, 0);
        cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
        float ms = 0; cudaEventElapsedTime(&ms, e0, e1);
        best = std::min(best, ms); total += ms;
      }
      CK(cudaGetLastError());
      const float ms = total / reps;
      const double visited = run.list ? double(keep) / kt : 1.0;
      std::printf("bench tokens=%d heads=%d D=%d %-8s %-6s budget=%.2f: %.2f ms (best %.2f), %.1f TFLOP/s of visited "
                  "tiles, %.1f dense-equivalent TFLOP/s%s", tokens, heads, D, kern_name(kern), run.list ? "list" : "dense",
                  run.budget, ms, best, dense_flops * visited / ms / 1e9, dense_flops / ms / 1e9, bits);
      if (!run.list && (kern == Kern::Ws || kern == Kern::WsExact || kern == Kern::Portable))
        std::printf(", rel_l2 %.4g (64 rows of head 0 vs fp64)", head0_rel_l2(q, k, v, o, tokens, D));
      std::printf("\n");
      std::fflush(stdout);
    }
    cudaFree(doff); cudaFree(didx);
  }
  release(cq); release(ck);
  cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o); cudaFree(o_ref); cudaFree(differ); cudaFree(dcheck);
}

int main(int argc, char** argv) {
  int fails = 0;
  const bool sm90 = int8_attention_sm90_ready();
  std::printf("sm_90a kernels %s; head_dim 128 runs %s\n", sm90 ? "ready" : "not available",
              sm90 ? "the sm90 kernels" : "the portable kernel");
  const Case cases[] = {{3, 130, 130, 64, 1.0, false}, {3, 200, 200, 128, 1.0, false}, {3, 77, 200, 128, 1.0, false},
                        {3, 130, 200, 64, 0.3, false}, {3, 200, 200, 128, 0.3, false}, {3, 77, 130, 128, 0.3, false},
                        {1, 64, 64, 128, 1.0, false}, {2, 1, 1, 64, 1.0, false}, {3, 257, 1000, 128, 0.3, false},
                        {3, 130, 130, 128, 1.0, false}, {2, 1, 1, 128, 1.0, false}, {2, 300, 700, 128, 1.0, false},
                        {3, 577, 77, 128, 1.0, false}, {3, 200, 333, 128, 1.0, true}, {3, 130, 257, 128, 0.3, true},
                        {3, 130, 130, 64, 1.0, true},  {2, 200, 3999, 128, 0.5, true},
                        {2, 300, 2500, 128, 1.0, false},  // 20 steps: the rings wrap several times
                        {3, 200, 333, 128, 1.0, false, true}, {4, 190, 517, 128, 1.0, true, true},
                        {4, 300, 517, 128, 0.3, true, true, true, true}, {3, 250, 1100, 128, 0.4, false, false, true},
                        {2, 129, 900, 128, 0.2, false, true, false, true},
                        {3, 300, 517, 128, 1.0, false, false, false, false, true},
                        {2, 200, 700, 128, 0.5, false, false, false, true, true}};
  unsigned seed = 1;
  const bool checks = !(argc > 1 && std::string(argv[1]) == "--no-check");
  for (const Case& c : cases) {
    if (!checks) break;
    fails += check(c, sm90, seed);
    std::fflush(stdout);
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
