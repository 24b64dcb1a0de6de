#include "exec/kernels/fused.hpp"

#include <sstream>

#ifdef STREAMPLAN_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "exec/kernels/elem.hpp"
#include "exec/kernels/row_kernels.cuh"
#endif

namespace sp::exec::fused {

#ifdef STREAMPLAN_WITH_CUDA

bool fused_rows_built() { return true; }

namespace {

kernels::Elem elem_of(const at::Tensor& t, const char* what) {
  const auto e = kernels::elem_of(t.scalar_type());
  TORCH_CHECK(e, "fused row kernel: ", what, " has dtype ", t.scalar_type(), "; expected fp32, fp16 or bf16");
  return *e;
}

void check_cuda(const at::Tensor& t, const at::Tensor& like, const char* what) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device(), "fused row kernel: ", what, " is on ", t.device(),
              ", expected ", like.device());
  TORCH_CHECK(t.dim() == 0 || t.stride(-1) == 1, "fused row kernel: ", what, " needs a unit last stride");
}

// Which shapes a parameter vector may have: one [width] vector for all rows, one per row
// ([rows, width]), or either; `Optional` also lets it be undefined (absent).
enum Shape : unsigned { Shared = 1, PerRow = 2, Either = Shared | PerRow, Optional = 4 };

kernels::RowVec row_vec(const at::Tensor& t, int64_t rows, int64_t width, const at::Tensor& like, const char* what,
                        unsigned want) {
  kernels::RowVec v;
  TORCH_CHECK(t.defined() || (want & Optional), "fused row kernel: ", what, " is missing");
  if (!t.defined()) return v;
  check_cuda(t, like, what);
  const bool per_row = t.dim() == 2;
  const bool shared_ok = (want & Shared) && t.dim() == 1 && t.size(0) == width;
  const bool per_row_ok = (want & PerRow) && per_row && t.size(0) == rows && t.size(1) == width;
  if (!shared_ok && !per_row_ok) {
    std::ostringstream expected;
    if (want & PerRow) expected << "[" << rows << ", " << width << "]" << ((want & Shared) ? " or " : "");
    if (want & Shared) expected << "[" << width << "]";
    TORCH_CHECK(false, "fused row kernel: ", what, " has shape ", t.sizes(), "; expected ", expected.str());
  }
  v.ptr = t.data_ptr();
  v.stride = per_row ? t.stride(0) : 0;
  v.type = elem_of(t, what);
  return v;
}

void check_launch(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "fused row kernel ", what, ": ", cudaGetErrorString(e));
}

}  // namespace

void norm_modulate(const at::Tensor& x, const at::Tensor& out, const NormArgs& n, const at::Tensor& scale,
                   const at::Tensor& shift) {
  check_cuda(x, x, "x");
  check_cuda(out, x, "out");
  TORCH_CHECK(x.dim() == 2 && out.sizes() == x.sizes(), "fused norm: x ", x.sizes(), " and out ", out.sizes(),
              " must be the same [rows, dim]");
  const int64_t rows = x.size(0), dim = x.size(1);
  kernels::NormModParams p;
  p.x = x.data_ptr();
  p.x_stride = x.stride(0);
  p.x_type = elem_of(x, "x");
  p.out = out.data_ptr();
  p.out_stride = out.stride(0);
  p.out_type = elem_of(out, "out");
  p.rows = rows;
  p.dim = dim;
  p.layer_norm = n.layer_norm;
  p.eps = static_cast<float>(n.eps);
  p.weight = row_vec(n.weight, rows, dim, x, "norm weight", Shared | Optional);
  p.bias = row_vec(n.bias, rows, dim, x, "norm bias", Shared | Optional);
  p.scale = row_vec(scale, rows, dim, x, "modulation scale", Either | Optional);
  p.shift = row_vec(shift, rows, dim, x, "modulation shift", Either | Optional);
  check_launch(kernels::norm_modulate(p, c10::cuda::getCurrentCUDAStream(x.get_device()).stream()), "norm_modulate");
}

void qk_norm_rope(const at::Tensor& in, const at::Tensor& out, ir::QkNormKind norm, double eps,
                  const at::Tensor& weight, const RopeArgs& rope) {
  check_cuda(in, in, "in");
  check_cuda(out, in, "out");
  TORCH_CHECK(out.dim() == 3 && in.dim() == 2 && in.size(0) == out.size(0) && in.size(1) == out.size(1) * out.size(2),
              "fused qk: in ", in.sizes(), " must be [rows, heads * head_dim] of out ", out.sizes());
  TORCH_CHECK(out.scalar_type() == in.scalar_type(), "fused qk: out dtype ", out.scalar_type(), " differs from in ",
              in.scalar_type());
  const int64_t rows = in.size(0), heads = out.size(1), hd = out.size(2);
  kernels::QkRopeParams p;
  p.in = in.data_ptr();
  p.in_stride = in.stride(0);
  p.type = elem_of(in, "in");
  p.out = out.data_ptr();
  p.out_row_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.rows = rows;
  p.heads = heads;
  p.head_dim = hd;
  p.eps = static_cast<float>(eps);
  if (norm != ir::QkNormKind::None) {
    const bool per_head = norm == ir::QkNormKind::PerHead;
    p.norm = per_head ? kernels::QkNorm::PerHead : kernels::QkNorm::AcrossHeads;
    p.weight = row_vec(weight, rows, per_head ? hd : heads * hd, in, "q/k norm weight", Shared);
  }
  if (rope.style != ir::RopeStyle::None) {
    TORCH_CHECK(rope.rotary_dim > 0 && rope.rotary_dim % 2 == 0 && rope.rotary_dim <= hd, "fused qk: rotary_dim ",
                rope.rotary_dim, " must be even and within head_dim ", hd);
    p.rope = rope.style == ir::RopeStyle::SplitHalf ? kernels::Rope::SplitHalf : kernels::Rope::Interleaved;
    p.rotary_dim = rope.rotary_dim;
    p.cos = row_vec(rope.cos, rows, rope.rotary_dim / 2, in, "rope cos", PerRow);
    p.sin = row_vec(rope.sin, rows, rope.rotary_dim / 2, in, "rope sin", PerRow);
  }
  check_launch(kernels::qk_norm_rope(p, c10::cuda::getCurrentCUDAStream(in.get_device()).stream()), "qk_norm_rope");
}

void residual_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate) {
  check_cuda(x, x, "x");
  check_cuda(y, x, "y");
  TORCH_CHECK(x.dim() == 2 && y.sizes() == x.sizes(), "fused residual add: x ", x.sizes(), " and y ", y.sizes(),
              " must be the same [rows, dim]");
  kernels::ResidualAddParams p;
  p.x = x.data_ptr();
  p.x_stride = x.stride(0);
  p.x_type = elem_of(x, "x");
  p.y = y.data_ptr();
  p.y_stride = y.stride(0);
  p.y_type = elem_of(y, "y");
  p.rows = x.size(0);
  p.dim = x.size(1);
  p.gate = row_vec(gate, p.rows, p.dim, x, "gate", Either | Optional);
  check_launch(kernels::residual_add(p, c10::cuda::getCurrentCUDAStream(x.get_device()).stream()), "residual_add");
}

#else

bool fused_rows_built() { return false; }

void residual_add(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "fused row kernels are not part of this build (no CUDA)");
}

void norm_modulate(const at::Tensor&, const at::Tensor&, const NormArgs&, const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "fused row kernels are not part of this build (no CUDA)");
}

void qk_norm_rope(const at::Tensor&, const at::Tensor&, ir::QkNormKind, double, const at::Tensor&, const RopeArgs&) {
  TORCH_CHECK(false, "fused row kernels are not part of this build (no CUDA)");
}

#endif

}  // namespace sp::exec::fused
