#include "plan/schedule.hpp"

#include <algorithm>

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

int64_t PhaseSpec::total_bytes(const contracts::DeviceCaps& dev) const {
  int64_t t = 0;
  for (const auto& b : buffers) t += dev.round_alloc(b.bytes());
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

namespace {

int64_t rows(int64_t chunk, int64_t tokens) { return std::min(chunk, tokens); }

void add_acquire(PhaseSpec& ph, const contracts::Registry& reg, const ir::Linear& l, int64_t r, int64_t c,
                 DType dt) {
  const int64_t b = acquire_bytes(reg, l.format, r, c, dt);
  if (b > 0) ph.extras.push_back({"acquire " + l.weight, b});
}

std::vector<PhaseSpec> attention_phases(const ir::Model& m, const ir::Attention& a, const SublayerPlan& p,
                                        const contracts::Registry& reg, const contracts::DeviceCaps& dev) {
  const int64_t T = m.tokens(), D = m.dim, wq = a.heads * a.head_dim, wkv = a.kv_heads * a.head_dim;
  const int64_t r = a.heads / a.kv_heads, half = a.rope.style == ir::RopeStyle::None ? 0 : a.rope.rotary_dim / 2;
  const DType dt = m.dtype, f32 = accumulation_dtype(dt);
  const bool streamed_out = p.chosen(legality::Transform::StreamedOutProj);
  const BufferSpec k{Buf::K, {a.kv_heads, T, a.head_dim}, dt}, v{Buf::V, {a.kv_heads, T, a.head_dim}, dt};
  const ir::Linear& kl = a.fused() ? *a.qkv : *a.k;
  const ir::Linear& vl = a.fused() ? *a.qkv : *a.v;
  const ir::Linear& ql = a.fused() ? *a.qkv : *a.q;

  std::vector<PhaseSpec> out;
  {
    const int64_t c = rows(p.token_chunk, T);
    PhaseSpec ph{"kv", {k, v, {Buf::N32, {c, D}, f32}, {Buf::H, {c, D}, dt}, {Buf::KV, {2, c, wkv}, dt},
                        {Buf::K32, {c, wkv}, f32}},
                 {}};
    if (half > 0) ph.buffers.push_back({Buf::RopeTmp, {c, a.kv_heads, half}, f32});
    add_acquire(ph, reg, kl, wkv, D, dt);
    add_acquire(ph, reg, vl, wkv, D, dt);
    out.push_back(ph);
  }
  {
    const int64_t c = rows(p.q_chunk, T);
    PhaseSpec ph{"q", {k, v}, {}};
    if (!streamed_out) ph.buffers.push_back({Buf::OFull, {T, wq}, dt});
    ph.buffers.push_back({Buf::N32, {c, D}, f32});
    ph.buffers.push_back({Buf::H, {c, D}, dt});
    ph.buffers.push_back({Buf::Q, {c, wq}, dt});
    ph.buffers.push_back({Buf::Q32, {c, wq}, f32});
    if (half > 0) ph.buffers.push_back({Buf::RopeTmp, {c, a.heads, half}, f32});
    ph.buffers.push_back({Buf::QF, {a.kv_heads, r * c, a.head_dim}, dt});
    if (streamed_out) {
      ph.buffers.push_back({Buf::O, {c, wq}, dt});
      ph.buffers.push_back({Buf::Y, {c, D}, dt});
      add_acquire(ph, reg, a.out, D, wq, dt);
    }
    contracts::AttnShape s{r * c, T, a.kv_heads, a.kv_heads, a.head_dim, dt, dev.kind, dev.threads};
    ph.extras.push_back({"consumer '" + a.consumer + "' call", reg.consumer(a.consumer).call_bytes(s)});
    add_acquire(ph, reg, ql, wq, D, dt);
    out.push_back(ph);
  }
  if (!streamed_out) {
    const int64_t c = rows(p.token_chunk, T);
    PhaseSpec ph{"out", {{Buf::OFull, {T, wq}, dt}, {Buf::Y, {c, D}, dt}}, {}};
    add_acquire(ph, reg, a.out, D, wq, dt);
    out.push_back(ph);
  }
  return out;
}

PhaseSpec mlp_phase(const ir::Model& m, const ir::Mlp& mlp, const SublayerPlan& p, const contracts::Registry& reg) {
  const int64_t T = m.tokens(), D = m.dim, c = rows(p.token_chunk, T), f = p.feature_slice;
  const DType dt = m.dtype;
  const bool sliced = f < mlp.hidden;
  PhaseSpec ph{"mlp",
               {{Buf::N32, {c, D}, accumulation_dtype(dt)},
                {Buf::H, {c, D}, dt},
                {Buf::U, {mlp.gated() ? 2 : 1, c, f}, dt},
                {Buf::Y, {c, D}, dt}},
               {}};
  if (sliced) ph.buffers.push_back({Buf::Acc, {c, D}, accumulation_dtype(dt)});
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
  if (const auto* a = std::get_if<ir::Attention>(&s.body)) return attention_phases(m, *a, p, reg, dev);
  return {mlp_phase(m, std::get<ir::Mlp>(s.body), p, reg)};
}

PhaseSpec final_phase(const ir::Model& m, int64_t chunk, const contracts::Registry& reg) {
  const ir::FinalLayer& fl = *m.final_layer;
  const int64_t T = m.tokens(), c = rows(chunk, T);
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
  if (m.embed) add_acquire(ph, reg, *m.embed, m.dim, m.embed->in_features, m.dtype);
  return ph;
}

}  // namespace sp::plan
