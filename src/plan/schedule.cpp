#include "plan/schedule.hpp"

#include <algorithm>
#include <tuple>

#include "plan/plan.hpp"

namespace sp::plan {

using ir::DType;

const char* to_string(Buf b) {
  static const char* names[] = {"K", "V", "N32", "H", "KV", "K32", "Q", "Q32", "RopeTmp",
                                "QF", "O", "OFull", "Y", "U", "Acc", "Out"};
  return names[static_cast<int>(b)];
}

int64_t BufferSpec::bytes() const {
  int64_t n = static_cast<int64_t>(ir::dtype_size(dtype));
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t PhaseSpec::storage_bytes(Buf owner) const {
  int64_t n = 0;
  for (const auto& b : buffers)
    if (b.id == owner || b.share == owner) n = std::max(n, b.bytes());
  return n;
}

int64_t PhaseSpec::total_bytes(const contracts::DeviceCaps& dev) const {
  int64_t t = 0;
  for (const auto& b : buffers)
    if (b.share == Buf::Count) t += dev.round_alloc(storage_bytes(b.id));
  for (const auto& e : extras) t += dev.round_alloc(e.bytes);
  return t;
}

const BufferSpec* PhaseSpec::find(Buf id) const {
  for (const auto& b : buffers)
    if (b.id == id) return &b;
  return nullptr;
}

ir::DType accumulation_dtype(ir::DType activations) {
  return activations == DType::F64 ? DType::F64 : DType::F32;
}

int64_t acquire_bytes(const contracts::Registry& reg, const std::string& format, int64_t rows, int64_t cols,
                      DType dtype) {
  if (reg.format(format).dense) return 0;
  return rows * cols * static_cast<int64_t>(ir::dtype_size(dtype));
}

bool fused_norm(const ir::Model& m, const contracts::DeviceCaps& dev) {
  return dev.fused_row_kernels == contracts::Cap::Yes &&
         (m.dtype == DType::F32 || m.dtype == DType::F16 || m.dtype == DType::BF16);
}

bool fused_qk(const ir::Model& m, const ir::Attention& a, const contracts::Registry& reg,
              const contracts::DeviceCaps& dev) {
  if (!fused_norm(m, dev)) return false;
  return std::none_of(a.patches.begin(), a.patches.end(), [&](const std::string& name) {
    const auto& p = reg.patch(name);
    return p.touches(contracts::TensorRole::Q) || p.touches(contracts::TensorRole::K);
  });
}

std::string row_kernels_note(const ir::Model& m, const contracts::Registry& reg,
                             const contracts::DeviceCaps& dev) {
  if (dev.fused_row_kernels != contracts::Cap::Yes)
    return std::string("ATen operations with fp32 staging (device '") + dev.name + "' declares fused row kernels: " +
           contracts::to_string(dev.fused_row_kernels) + ")";
  if (!fused_norm(m, dev))
    return std::string("ATen operations with fp32 staging (the fused kernels take fp32, fp16 and bf16, not ") +
           ir::to_string(m.dtype) + ")";
  std::string note = "fused kernels (norm + modulation; Q/K norm + RoPE)";
  std::vector<std::string> staged;
  for (const auto& b : m.blocks)
    for (const auto& s : b.sublayers)
      if (const auto* a = std::get_if<ir::Attention>(&s.body); a && !fused_qk(m, *a, reg, dev))
        staged.push_back(b.name + "." + s.name);
  if (!staged.empty())
    note += "; Q/K staged in fp32 in " + std::to_string(staged.size()) + " sublayer(s) (first: " + staged.front() +
            ") because a patch reads or modifies Q or K";
  return note;
}

namespace {

int64_t rows(int64_t chunk, int64_t tokens) { return std::min(chunk, tokens); }

void add_acquire(PhaseSpec& ph, const contracts::Registry& reg, const ir::Linear& l, int64_t r, int64_t c,
                 DType dt) {
  const int64_t b = acquire_bytes(reg, l.format, r, c, dt);
  if (b > 0) ph.extras.push_back({"acquire " + l.weight, b});
}

// Held acquisitions of one projection per distinct projection set (joint attention holds
// each stream's weights).
template <typename F>
void add_proj_acquire(PhaseSpec& ph, const contracts::Registry& reg, const ir::Attention& a, F&& rows_cols, DType dt) {
  for (const ir::AttnProj* p : a.all_proj()) {
    auto [l, r, c] = rows_cols(*p);
    if (l) add_acquire(ph, reg, *l, r, c, dt);
  }
}

std::vector<PhaseSpec> attention_phases(const ir::Model& m, const ir::Sublayer& s, const ir::Attention& a,
                                        const SublayerPlan& p, const contracts::Registry& reg,
                                        const contracts::DeviceCaps& dev) {
  const int64_t R = m.rows(s.segments).size(), D = m.dim, wq = a.heads * a.head_dim, wkv = a.kv_heads * a.head_dim;
  const bool cross = a.kind == ir::AttnKind::Cross;
  const int64_t L = cross ? m.context(a.context).length : R;  // K/V rows
  const int64_t kv_in = cross ? m.context(a.context).dim : D;
  const int64_t r = a.heads / a.kv_heads, half = a.rope.style == ir::RopeStyle::None ? 0 : a.rope.rotary_dim / 2;
  const int64_t mlp = a.parallel ? a.parallel->hidden : 0;
  const DType dt = m.dtype, f32 = accumulation_dtype(dt);
  const bool streamed_out = p.chosen(legality::Transform::StreamedOutProj);
  const bool fn = fused_norm(m, dev), fq = fused_qk(m, a, reg, dev);
  const BufferSpec k{Buf::K, {a.kv_heads, L, a.head_dim}, dt}, v{Buf::V, {a.kv_heads, L, a.head_dim}, dt};
  using Acq = std::tuple<const ir::Linear*, int64_t, int64_t>;

  std::vector<PhaseSpec> out;
  {
    const int64_t c = rows(p.token_chunk, L);
    PhaseSpec ph{"kv", {k, v}, {}};
    if (!cross) {  // cross-attention projects the context rows as they are
      if (!fn) ph.buffers.push_back({Buf::N32, {c, D}, f32});
      ph.buffers.push_back({Buf::H, {c, D}, dt});
    }
    ph.buffers.push_back({Buf::KV, {2, c, wkv}, dt});
    if (!fq) {
      // Once H holds the normed rows, N32 is dead: K32 reuses its bytes.
      ph.buffers.push_back({Buf::K32, {c, wkv}, f32, (cross || fn) ? Buf::Count : Buf::N32});
      if (half > 0) ph.buffers.push_back({Buf::RopeTmp, {c, a.kv_heads, half}, f32});
    }
    add_proj_acquire(ph, reg, a, [&](const ir::AttnProj& pr) { return Acq{&pr.k_linear(), wkv, kv_in}; }, dt);
    add_proj_acquire(ph, reg, a, [&](const ir::AttnProj& pr) { return Acq{&pr.v_linear(), wkv, kv_in}; }, dt);
    out.push_back(ph);
  }
  {
    const int64_t c = rows(p.q_chunk, R);
    PhaseSpec ph{"q", {k, v}, {}};
    if (!streamed_out) ph.buffers.push_back({Buf::OFull, {R, wq}, dt});
    // Per slab: N32 -> H, then Q32 and later Y reuse N32's bytes; Q is dead once copied to
    // Q32, QF once attended, so QF and O reuse Q's bytes. Fused, the kernel reads Q while
    // it writes QF (own bytes), and Y reuses the first staging buffer that is dead by then.
    if (!fn) ph.buffers.push_back({Buf::N32, {c, D}, f32});
    ph.buffers.push_back({Buf::H, {c, D}, dt});
    ph.buffers.push_back({Buf::Q, {c, wq}, dt});
    if (!fq) {
      ph.buffers.push_back({Buf::Q32, {c, wq}, f32, fn ? Buf::Count : Buf::N32});
      if (half > 0) ph.buffers.push_back({Buf::RopeTmp, {c, a.heads, half}, f32});
    }
    ph.buffers.push_back({Buf::QF, {a.kv_heads, r * c, a.head_dim}, dt, fq ? Buf::Count : Buf::Q});
    if (streamed_out) {
      ph.buffers.push_back({Buf::O, {c, wq}, dt, Buf::Q});
      ph.buffers.push_back({Buf::Y, {c, D}, dt, !fn ? Buf::N32 : !fq ? Buf::Q32 : Buf::QF});
      if (mlp) {
        ph.buffers.push_back({Buf::U, {1, c, mlp}, dt});
        add_proj_acquire(ph, reg, a, [&](const ir::AttnProj& pr) { return Acq{&*pr.qkv, mlp, D}; }, dt);
      }
      add_proj_acquire(ph, reg, a, [&](const ir::AttnProj& pr) { return Acq{&pr.out, D, wq + mlp}; }, dt);
    }
    contracts::AttnShape sh{r * c, L, a.kv_heads, a.kv_heads, a.head_dim, dt, dev.kind, dev.threads};
    ph.extras.push_back({"consumer '" + a.consumer + "' call", reg.consumer(a.consumer).call_bytes(sh)});
    add_proj_acquire(ph, reg, a, [&](const ir::AttnProj& pr) { return Acq{&pr.q_linear(), wq, D}; }, dt);
    out.push_back(ph);
  }
  if (!streamed_out) {
    const int64_t c = rows(p.token_chunk, R);
    PhaseSpec ph{"out", {{Buf::OFull, {R, wq}, dt}, {Buf::Y, {c, D}, dt}}, {}};
    if (mlp) {  // the parallel MLP is recomputed here, slab by slab, from the unchanged rows
      if (!fn) ph.buffers.push_back({Buf::N32, {c, D}, f32});
      ph.buffers.push_back({Buf::H, {c, D}, dt});
      ph.buffers.push_back({Buf::U, {1, c, mlp}, dt});
      add_proj_acquire(ph, reg, a, [&](const ir::AttnProj& pr) { return Acq{&*pr.qkv, mlp, D}; }, dt);
    }
    add_proj_acquire(ph, reg, a, [&](const ir::AttnProj& pr) { return Acq{&pr.out, D, wq + mlp}; }, dt);
    out.push_back(ph);
  }
  return out;
}

PhaseSpec mlp_phase(const ir::Model& m, const ir::Sublayer& s, const ir::Mlp& mlp, const SublayerPlan& p,
                    const contracts::Registry& reg, const contracts::DeviceCaps& dev) {
  const int64_t T = m.rows(s.segments).size(), D = m.dim, c = rows(p.token_chunk, T), f = p.feature_slice;
  const DType dt = m.dtype;
  const bool sliced = f < mlp.hidden;
  const bool fn = fused_norm(m, dev);
  PhaseSpec ph{"mlp", {}, {}};
  if (!fn) ph.buffers.push_back({Buf::N32, {c, D}, accumulation_dtype(dt)});
  ph.buffers.push_back({Buf::H, {c, D}, dt});
  ph.buffers.push_back({Buf::U, {mlp.gated() ? 2 : 1, c, f}, dt});
  ph.buffers.push_back({Buf::Y, {c, D}, dt});
  // The accumulator starts after H holds the normed rows: it reuses N32's bytes.
  const DType acc = accumulation_dtype(dt);
  if (sliced) ph.buffers.push_back({Buf::Acc, {c, D}, acc, fn ? Buf::Count : Buf::N32});
  // ATen's CPU kernels cast mixed-dtype operands through temporaries: accumulating a 16-bit
  // slice into the fp32 accumulator and adding it into the 16-bit residual hold two fp32
  // copies of the slab at once. CUDA kernels cast in registers.
  if (sliced && dt != acc && dev.kind == contracts::DeviceKind::CPU)
    ph.extras.push_back({"mixed-dtype casts (CPU)", 2 * c * D * static_cast<int64_t>(ir::dtype_size(acc))});
  // Sliced: one slice of each weight at a time; otherwise the whole weight, held for the block.
  const int64_t up_rows = mlp.gated() ? 2 * f : f;
  if (mlp.gate) {
    add_acquire(ph, reg, *mlp.gate, f, D, dt);
    add_acquire(ph, reg, *mlp.up, f, D, dt);
  } else {
    add_acquire(ph, reg, *mlp.up, up_rows, D, dt);
  }
  add_acquire(ph, reg, mlp.down, D, f, dt);
  return ph;
}

}  // namespace

std::vector<PhaseSpec> sublayer_phases(const ir::Model& m, const ir::Sublayer& s, const SublayerPlan& p,
                                       const contracts::Registry& reg, const contracts::DeviceCaps& dev) {
  if (const auto* a = std::get_if<ir::Attention>(&s.body)) return attention_phases(m, s, *a, p, reg, dev);
  return {mlp_phase(m, s, std::get<ir::Mlp>(s.body), p, reg, dev)};
}

PhaseSpec final_phase(const ir::Model& m, int64_t chunk, const contracts::Registry& reg) {
  const ir::FinalLayer& fl = *m.final_layer;
  const int64_t T = m.rows(fl.segments).size(), c = rows(chunk, T);
  const DType acc = accumulation_dtype(m.dtype);
  const int64_t asz = static_cast<int64_t>(ir::dtype_size(acc));
  PhaseSpec ph{"final", {{Buf::Out, {T, fl.proj.out_features}, acc}, {Buf::N32, {c, m.dim}, acc}}, {}};
  // The projection runs in fp32: a dense fp32 weight is used as is, anything else is converted once.
  const bool as_is = reg.format(fl.proj.format).dense && m.dtype == acc;
  if (!as_is) {
    ph.extras.push_back({"fp32 " + fl.proj.weight, fl.proj.out_features * m.dim * asz});
    if (!fl.proj.bias.empty()) ph.extras.push_back({"fp32 " + fl.proj.bias, fl.proj.out_features * asz});
  }
  return ph;
}

PhaseSpec embed_phase(const ir::Model& m, const contracts::Registry& reg) {
  PhaseSpec ph{"embed", {}, {}};
  // Each segment's embedding weight is acquired, used and released in turn: the largest counts.
  int64_t worst = 0;
  std::string what;
  for (const auto& e : m.embeds) {
    const int64_t b = acquire_bytes(reg, e.linear.format, m.dim, e.linear.in_features, m.dtype);
    if (b > worst) {
      worst = b;
      what = "acquire " + e.linear.weight;
    }
  }
  if (worst > 0) ph.extras.push_back({what, worst});
  return ph;
}

}  // namespace sp::plan
