#include "exec/kernels/int8_attn.hpp"

#ifdef STREAMPLAN_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "exec/kernels/elem.hpp"
#include "exec/kernels/int8_attention.cuh"
#include "exec/kernels/int8_attention_sm90.cuh"
#endif

namespace sp::exec::int8attn {

namespace {
int64_t tiles(int64_t rows) { return (rows + kTile - 1) / kTile; }
}  // namespace

int64_t k_carrier_bytes(int64_t heads, int64_t rows, int64_t head_dim) {
  const int64_t t = tiles(rows);
  return heads * (t * kTile * head_dim + t * 4 + t * head_dim * 4 + 3 * head_dim * 4 + 4);
}
int64_t q_tiles_bytes(int64_t heads, int64_t rows, int64_t head_dim) {
  const int64_t t = tiles(rows);
  // int8 Q, scales, tile means, row-norm maxima, redo flags; then the loose-bound flags' fp32,
  // bool and uint8 temporaries while attend fills them.
  return heads * (t * kTile * head_dim + t * 4 + t * head_dim * 4 + t * 4 + t * 4 + t * 6);
}

#ifdef STREAMPLAN_WITH_CUDA

bool built() { return true; }

namespace {

void check_input(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined() && t.dim() == 3, "int8 attention: ", what, " must be [heads, rows, head_dim], got ",
              t.defined() ? t.sizes() : at::IntArrayRef{});
  TORCH_CHECK(t.is_cuda(), "int8 attention: ", what, " is on ", t.device(), "; the int8 kernels need a CUDA device");
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf, "int8 attention: ", what,
              " has dtype ", t.scalar_type(), "; expected bf16 or fp16");
  TORCH_CHECK(t.size(2) == 64 || t.size(2) == 128, "int8 attention: ", what, " has head_dim ", t.size(2),
              "; the kernels take 64 or 128");
  TORCH_CHECK(t.stride(2) == 1, "int8 attention: ", what, " needs a unit last stride, got strides ", t.strides());
}

void check_launch(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "int8 attention ", what, ": ", cudaGetErrorString(e));
}

// The channel factors of K (rows [G, n, D], their per-head mean `mean` [G, D] fp32) into
// c.k_factor and c.q_factor: c_j = sqrt(a_j / mean over j of a_j), a_j the largest |k - mean| of
// channel j (kept above 1e-3 of that mean, so that no factor is zero).
void channel_factors(const at::Tensor& k, const at::Tensor& mean, const KCarrier& c) {
  const at::Tensor hi = at::amax(k, {1}).to(at::kFloat), lo = at::amin(k, {1}).to(at::kFloat);
  const at::Tensor range = at::maximum(hi - mean, mean - lo);
  const at::Tensor ref = range.mean(1, true).clamp_min(1e-30);
  const at::Tensor f = at::maximum(range, ref * 1e-3).div_(ref).sqrt_();
  c.q_factor.copy_(f);
  c.k_factor.copy_(f.reciprocal());
}

kernels::AttnQuantParams quant_params(const at::Tensor& x) {
  kernels::AttnQuantParams p;
  p.x = x.data_ptr();
  p.head_stride = x.stride(0);
  p.row_stride = x.stride(1);
  p.type = *kernels::elem_of(x.scalar_type());
  p.heads = static_cast<int>(x.size(0));
  p.rows = static_cast<int>(x.size(1));
  p.head_dim = static_cast<int>(x.size(2));
  return p;
}

}  // namespace

KCarrier quantize_k(const at::Tensor& k, bool factors) {
  check_input(k, "k");
  TORCH_CHECK(k.size(1) > 0, "int8 attention: k has no rows, shape ", k.sizes());
  const c10::cuda::CUDAGuard guard(k.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t g = k.size(0), d = k.size(2), t = tiles(k.size(1));
  const auto f32 = k.options().dtype(at::kFloat);
  KCarrier c;
  c.rows = k.size(1);
  c.k8 = at::empty({g, t * kTile, d}, k.options().dtype(at::kChar));
  c.scale = at::empty({g, t}, f32);
  c.tile_mean = at::empty({g, t, d}, f32);
  c.head_mean = at::empty({g, d}, f32);
  c.k_factor = at::empty({g, d}, f32);
  c.q_factor = at::empty({g, d}, f32);
  c.norm = at::zeros({g}, f32);
  kernels::AttnQuantParams p = quant_params(k);
  p.tile_mean = c.tile_mean.data_ptr<float>();
  check_launch(kernels::attn_quantize(p, stream), "(K tile means)");
  check_launch(kernels::attn_head_mean(p.tile_mean, p.heads, p.rows, p.head_dim, c.head_mean.data_ptr<float>(), stream),
               "(K head means)");
  p.tile_mean = nullptr;
  if (factors) {
    channel_factors(k, c.head_mean, c);
  } else {
    c.k_factor.fill_(1.0);
    c.q_factor.fill_(1.0);
  }
  p.subtract = c.head_mean.data_ptr<float>();
  p.factor = c.k_factor.data_ptr<float>();
  p.out = c.k8.data_ptr<int8_t>();
  p.scale = c.scale.data_ptr<float>();
  p.norm = c.norm.data_ptr<float>();
  check_launch(kernels::attn_quantize(p, stream), "(K quantization)");
  return c;
}

KCarrier carrier_view(const at::Tensor& bytes, int64_t heads, int64_t rows, int64_t head_dim) {
  const int64_t t = tiles(rows), total = k_carrier_bytes(heads, rows, head_dim);
  TORCH_CHECK(bytes.scalar_type() == at::kChar && bytes.is_contiguous() && bytes.numel() == total,
              "int8 attention: a K carrier of ", heads, " x ", rows, " x ", head_dim, " needs ", total,
              " contiguous int8 bytes, got ", bytes.sizes(), " ", bytes.scalar_type());
  const at::Tensor flat = bytes.view(-1);
  int64_t off = 0;
  auto take = [&](int64_t n, at::ScalarType type, std::vector<int64_t> shape) {
    const int64_t size = n * int64_t(c10::elementSize(type));
    at::Tensor r = flat.narrow(0, off, size).view(type).view(shape);
    off += size;
    return r;
  };
  KCarrier c;
  c.rows = rows;
  c.k8 = take(heads * t * kTile * head_dim, at::kChar, {heads, t * kTile, head_dim});
  c.scale = take(heads * t, at::kFloat, {heads, t});
  c.tile_mean = take(heads * t * head_dim, at::kFloat, {heads, t, head_dim});
  c.head_mean = take(heads * head_dim, at::kFloat, {heads, head_dim});
  c.k_factor = take(heads * head_dim, at::kFloat, {heads, head_dim});
  c.q_factor = take(heads * head_dim, at::kFloat, {heads, head_dim});
  c.norm = take(heads, at::kFloat, {heads});
  return c;
}

void quantize_k_rows(const at::Tensor& k, const KCarrier& c, int64_t row0) {
  check_input(k, "k");
  const int64_t g = c.k8.size(0), d = c.k8.size(2), t = tiles(c.rows);
  TORCH_CHECK(k.size(0) == g && k.size(2) == d && row0 % kTile == 0 && row0 >= 0 && row0 + k.size(1) <= c.rows,
              "int8 attention: k rows ", k.sizes(), " at row ", row0, " do not fit a carrier of ", g, " x ", c.rows,
              " x ", d, " (slabs start at multiples of ", kTile, ")");
  if (k.size(1) == 0) return;
  const c10::cuda::CUDAGuard guard(k.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (row0 == 0) {  // the subtracted means and the channel factors: this slab's
    at::Tensor hm = c.head_mean;
    at::sum_out(hm, k, {1}, false, at::kFloat).div_(double(k.size(1)));
    channel_factors(k, hm, c);
    c.norm.zero_();  // maxed into by every slab
  }
  kernels::AttnQuantParams p = quant_params(k);
  p.subtract = c.head_mean.data_ptr<float>();
  p.factor = c.k_factor.data_ptr<float>();
  p.out = c.k8.data_ptr<int8_t>();
  p.scale = c.scale.data_ptr<float>();
  p.tile_mean = c.tile_mean.data_ptr<float>();
  p.norm = c.norm.data_ptr<float>();
  p.out_tiles = static_cast<int>(t);
  p.tile_offset = static_cast<int>(row0 / kTile);
  check_launch(kernels::attn_quantize(p, stream), "(K slab quantization)");
}

QTiles quantize_q(const at::Tensor& q, double softmax_scale, const KCarrier& k) {
  check_input(q, "q");
  TORCH_CHECK(k.q_factor.defined() && k.q_factor.dim() == 2 && k.q_factor.size(0) == q.size(0) &&
                  k.q_factor.size(1) == q.size(2) && k.q_factor.device() == q.device(),
              "int8 attention: q ", q.sizes(), " on ", q.device(), " does not fit the K carrier's channel factors ",
              k.q_factor.defined() ? k.q_factor.sizes() : at::IntArrayRef{});
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t g = q.size(0), d = q.size(2), t = tiles(q.size(1));
  const auto f32 = q.options().dtype(at::kFloat);
  QTiles r;
  r.rows = q.size(1);
  r.q8 = at::empty({g, t * kTile, d}, q.options().dtype(at::kChar));
  r.scale = at::empty({g, t}, f32);
  r.tile_mean = at::empty({g, t, d}, f32);
  r.norm = at::empty({g, t}, f32);
  r.check = at::empty({g, t * 4}, q.options().dtype(at::kByte));
  kernels::AttnQuantParams p = quant_params(q);
  p.extra_scale = static_cast<float>(softmax_scale * 1.4426950408889634);  // exp -> exp2
  p.factor = k.q_factor.data_ptr<float>();
  p.out = r.q8.data_ptr<int8_t>();
  p.scale = r.scale.data_ptr<float>();
  p.tile_mean = r.tile_mean.data_ptr<float>();
  p.tile_norm = r.norm.data_ptr<float>();
  check_launch(kernels::attn_quantize(p, c10::cuda::getCurrentCUDAStream()), "(Q quantization)");
  return r;
}

Kernel auto_kernel(int64_t head_dim) {
  return head_dim == 128 && kernels::int8_attention_sm90_ready() ? Kernel::Sm90 : Kernel::Portable;
}

at::Tensor attend(const QTiles& q, const KCarrier& k, const at::Tensor& v, const TileList& tiles_, Kernel kernel) {
  check_input(v, "v");
  const int64_t g = q.q8.size(0), d = q.q8.size(2);
  TORCH_CHECK(k.k8.size(0) == g && k.k8.size(2) == d && v.size(0) == g && v.size(2) == d && v.size(1) == k.rows,
              "int8 attention: q tiles ", q.q8.sizes(), ", k carrier ", k.k8.sizes(), " (", k.rows, " rows) and v ",
              v.sizes(), " do not fit");
  TORCH_CHECK(v.device() == q.q8.device() && k.k8.device() == v.device(), "int8 attention: q on ", q.q8.device(),
              ", k on ", k.k8.device(), ", v on ", v.device());
  TORCH_CHECK(v.stride(1) % 8 == 0 && v.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(v.data_ptr()) % 16 == 0,
              "int8 attention: v needs 16-byte aligned rows, strides ", v.strides());
  const c10::cuda::CUDAGuard guard(v.device());
  TORCH_CHECK(kernel != Kernel::Sm90 || auto_kernel(d) == Kernel::Sm90, "int8 attention: the sm90 kernel needs ",
              "head_dim 128 on a compute capability 9.0 device and a build for sm_90a; head_dim is ", d, " on ",
              v.device());
  at::Tensor o = at::empty({g, q.rows, d}, v.options());
  kernels::Int8AttnParams p;
  p.q = q.q8.data_ptr<int8_t>();
  p.q_scale = q.scale.data_ptr<float>();
  p.k = k.k8.data_ptr<int8_t>();
  p.k_scale = k.scale.data_ptr<float>();
  if (k.norm.defined() && q.check.defined()) {
    p.k_norm = k.norm.data_ptr<float>();
    p.check = q.check.data_ptr<uint8_t>();
    // The tiles whose bound is too loose arrive flagged; the bounded pass writes the others'.
    const at::Tensor loose = q.norm.mul(k.norm.unsqueeze(1)).gt(kLooseBound).to(at::kByte);
    q.check.view({g, -1, 4}).copy_(loose.unsqueeze(2).expand({g, loose.size(1), 4}));
  }
  p.v = v.data_ptr();
  p.v_head_stride = v.stride(0);
  p.v_row_stride = v.stride(1);
  p.o = o.data_ptr();
  p.o_head_stride = o.stride(0);
  p.o_row_stride = o.stride(1);
  p.type = *kernels::elem_of(v.scalar_type());
  p.heads = static_cast<int>(g);
  p.q_rows = static_cast<int>(q.rows);
  p.kv_rows = static_cast<int>(k.rows);
  p.head_dim = static_cast<int>(d);
  if (tiles_.offsets.defined()) {
    const int64_t qt = tiles(q.rows);
    TORCH_CHECK(tiles_.offsets.scalar_type() == at::kInt && tiles_.indices.scalar_type() == at::kInt &&
                    tiles_.offsets.numel() == g * qt + 1 && tiles_.offsets.is_contiguous() &&
                    tiles_.indices.is_contiguous() && tiles_.offsets.device() == v.device() &&
                    tiles_.indices.device() == v.device(),
                "int8 attention: tile list offsets ", tiles_.offsets.sizes(), " (", tiles_.offsets.scalar_type(),
                ") do not fit ", g, " heads x ", qt, " query tiles (int32, contiguous, on ", v.device(), ")");
    p.offsets = tiles_.offsets.data_ptr<int32_t>();
    p.indices = tiles_.indices.data_ptr<int32_t>();
  }
  p.path = kernel == Kernel::Sm90 ? kernels::AttnPath::Sm90
           : kernel == Kernel::Portable ? kernels::AttnPath::Portable
                                        : kernels::AttnPath::Auto;
  check_launch(kernels::int8_attention(p, c10::cuda::getCurrentCUDAStream()), "(attention)");
  return o;
}

#else

bool built() { return false; }
KCarrier quantize_k(const at::Tensor&, bool) { TORCH_CHECK(false, "int8 attention: built without CUDA"); }
KCarrier carrier_view(const at::Tensor&, int64_t, int64_t, int64_t) { TORCH_CHECK(false, "int8 attention: built without CUDA"); }
void quantize_k_rows(const at::Tensor&, const KCarrier&, int64_t) { TORCH_CHECK(false, "int8 attention: built without CUDA"); }
QTiles quantize_q(const at::Tensor&, double, const KCarrier&) { TORCH_CHECK(false, "int8 attention: built without CUDA"); }
at::Tensor attend(const QTiles&, const KCarrier&, const at::Tensor&, const TileList&, Kernel) {
  TORCH_CHECK(false, "int8 attention: built without CUDA");
}
Kernel auto_kernel(int64_t) { return Kernel::Portable; }

#endif

}  // namespace sp::exec::int8attn
