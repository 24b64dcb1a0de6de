// The LoRA step of a projection: y[:, rows] += scale * B (A x) for every adapter of the
// projected weight, lazily per slab (ir::LoraAdapter, exec/patches/lora.cpp). Of a sliced
// projection each adapter contributes its rows inside the projected ones from the columns it
// reads; summed over input slices that is B (A x) by linearity (exec/patches/README.md), which
// the patch declares (feature_local) and this compiler checks.
#include "plan/compiler.hpp"

namespace sp::plan::detail {

namespace {

// The overlap of rows [r.base, + r.length) (step 1, not feature-dependent) with an adapter.
int64_t static_overlap(const SliceExpr& r, const ir::LoraAdapter& a) {
  return std::max<int64_t>(0, std::min(r.base + r.length, a.row_offset + a.rows) - std::max(r.base, a.row_offset));
}

}  // namespace

void Compiler::lora(const Operand& in, const Operand& out, const std::vector<SegWeight>& ws, int64_t in_features,
                    int64_t n, int64_t col_begin, int64_t col_len, DType cd) {
  std::vector<std::vector<LoraUse>> uses(ws.size());
  const double csz = double(ir::dtype_size(cd));
  int64_t max_rank = 0, launches = 0, transient = 0, count = 0, operands = 0;
  double flops = 0, bytes = 0;
  std::string target;
  for (size_t i = 0; i < ws.size(); ++i) {
    const AcquireStep* acq = acquire_of(ws[i].weight);
    if (!acq || !acq->linear || acq->linear->loras.empty()) continue;
    const ir::Linear& l = *acq->linear;
    SliceExpr rows = acq->rows.length < 0 ? SliceExpr{0, 0, l.out_features, 1} : acq->rows;
    SliceExpr cols = acq->cols.length < 0 ? SliceExpr{0, 0, l.in_features, 1} : acq->cols;
    cols.base += col_begin;
    if (col_len >= 0) cols.length = col_len;
    const bool sliced_in = cols.per_feature != 0 || cols.length < l.in_features;
    if (sliced_in && reg_.patch("lora").feature_local != contracts::Cap::Yes)
      throw contracts::ContractError("lora on '" + l.weight +
                                     "': the projection reads an input-feature slice and the patch does not declare "
                                     "feature_local");
    for (const ir::LoraAdapter& ad : l.loras) {
      const bool fixed = rows.per_feature == 0 && rows.step == 1;
      const int64_t r = fixed ? static_overlap(rows, ad) : std::min(rows.length, ad.rows);
      if (r == 0) continue;
      uses[i].push_back({&ad, rows, cols});
      max_rank = std::max(max_rank, ad.rank);
      operands = std::max({operands, (n + ad.rank) * cols.length, (n + r) * ad.rank});
      flops += 2.0 * double(n) * double(ad.rank) * double(cols.length + r);
      bytes += (double(n) * double(cols.length) + double(ad.rank) * double(cols.length) + 2.0 * double(n * ad.rank) +
                double(r * ad.rank) + 2.0 * double(n * r)) * csz;
      launches += 2;
      // The adapters are held in the model dtype; a projection computing in another one (the
      // fp32 final projection) converts the A and B slices it uses while the step runs.
      if (cd != dt_)
        transient = std::max(transient, dev_.held(ad.rank * cols.length * int64_t(csz)) +
                                            dev_.held(r * ad.rank * int64_t(csz)));
      ++count;
    }
    if (!uses[i].empty()) target += (target.empty() ? "" : ", ") + l.weight;
  }
  if (count == 0) return;
  // Its GEMMs pack their operands as the projection's do (DeviceCaps::gemm_scratch).
  transient += dev_.held(dev_.gemm_packing(cd, operands));
  const Operand ax = whole(buffer(BufRole::LoraAx, "LoraAx", {n, max_rank}, cd));
  Terms t{flops, bytes, launches, n, cd};
  emit(LoraStep{"lora", in, out, ws, std::move(uses), ax},
       "lora: " + std::to_string(count) + " adapter(s) on " + target + " (" + std::to_string(in_features) + " inputs)",
       t, transient);
}

}  // namespace sp::plan::detail
