// Schedule shapes: the buffers each phase of the bounded executor allocates.
//
// Design note. This is the one place that says how large every scratch buffer of a
// planned run is. The executor allocates exactly these specs (exec/workspace), the
// cost model adds them up, and consumers / weight formats declare what they allocate
// internally as `extras`. Changing a buffer here changes both at once.
//
// Example:
//     for (const PhaseSpec& ph : sp::plan::sublayer_phases(model, sub, splan, reg, dev))
//       std::cout << ph.name << " " << ph.total_bytes(dev) << "\n";
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "contracts/contracts.hpp"
#include "ir/model.hpp"

namespace sp::plan {

struct SublayerPlan;

enum class Buf {
  K,       // [kv_heads, T, head_dim]       global keys
  V,       // [kv_heads, T, head_dim]       global values
  N32,     // [c, dim] fp32                 normalized + modulated rows
  H,       // [c, dim]                      N32 in the activation dtype
  KV,      // [2, c, kv_heads*head_dim]     projected k (0) and v (1)
  K32,     // [c, kv_heads*head_dim] fp32   k during Q/K norm and RoPE
  Q,       // [c, heads*head_dim]           projected q
  Q32,     // [c, heads*head_dim] fp32      q during Q/K norm and RoPE
  RopeTmp, // [c, heads, rotary_dim/2] fp32 one rotary half, saved for the in-place rotation
  QF,      // [kv_heads, r*c, head_dim]     q folded head-major (GQA groups as rows)
  O,       // [c, heads*head_dim]           one slab's attention output, token-major
  OFull,   // [T, heads*head_dim]           complete attention output (not streamed)
  Y,       // [c, dim]                      projection result before the residual add
  U,       // [2|1, c, f]                   gate (0) / up (1) of a feature slice
  Acc,     // [c, dim] fp32                 accumulator over feature slices
  Out,     // [T, out_features] fp32        the model output
  Count
};
const char* to_string(Buf);

// A buffer whose `share` names another buffer of the phase lives in that buffer's storage:
// their lifetimes within a slab do not overlap (e.g. N32 is dead once H holds the normed
// rows, so Q32 and later Y reuse its bytes). The storage is sized for the largest sharer.
struct BufferSpec {
  Buf id;
  std::vector<int64_t> shape;
  ir::DType dtype;
  Buf share = Buf::Count;  // Count: owns its storage
  int64_t bytes() const;
};

struct Extra {
  std::string what;
  int64_t bytes = 0;
};

struct PhaseSpec {
  std::string name;
  std::vector<BufferSpec> buffers;
  std::vector<Extra> extras;
  int64_t total_bytes(const contracts::DeviceCaps& dev) const;
  const BufferSpec* find(Buf id) const;
  // Bytes of the storage buffer `owner` provides: its own and every sharer's, the largest.
  int64_t storage_bytes(Buf owner) const;
};

// The device's fused row kernels write the normed, modulated rows straight into H (no N32).
bool fused_norm(const ir::Model& m, const contracts::DeviceCaps& dev);
// ... and Q/K norm + RoPE straight from Q / KV into QF / K (no Q32, K32, RopeTmp). Patches
// that read or modify Q or K run on the fp32 staging buffers, so they rule it out.
bool fused_qk(const ir::Model& m, const ir::Attention& a, const contracts::Registry& reg,
              const contracts::DeviceCaps& dev);

// Which row operations a plan runs and why, for explain(): "fused kernels", or the ATen path
// with the reason (device, dtype), plus each attention sublayer whose Q/K stay staged.
std::string row_kernels_note(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev);

// fp32, or fp64 for an fp64 model: norms, RoPE, feature-slice accumulation, the output.
ir::DType accumulation_dtype(ir::DType activations);

// Bytes a weight source allocates to acquire `rows` x `cols` of a weight in `format`
// for compute in `dtype` (0 for dense formats, which hand out views).
int64_t acquire_bytes(const contracts::Registry& reg, const std::string& format, int64_t rows, int64_t cols,
                      ir::DType dtype);

std::vector<PhaseSpec> sublayer_phases(const ir::Model& m, const ir::Sublayer& s, const SublayerPlan& p,
                                       const contracts::Registry& reg, const contracts::DeviceCaps& dev);
PhaseSpec final_phase(const ir::Model& m, int64_t chunk, const contracts::Registry& reg);
PhaseSpec embed_phase(const ir::Model& m, const contracts::Registry& reg);

}  // namespace sp::plan
