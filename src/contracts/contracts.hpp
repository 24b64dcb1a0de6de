// Capability contracts: what each party of a run permits, as plain data.
//
// Legality never asks which implementation this is; it asks the contract. Every capability is
// tri-state, and Unknown fails closed like No but is reported as "undeclared". Consumers, weight
// formats and patches are registered by name, each with its implementation (an opaque Impl that
// planning never calls; exec/registry.hpp). Sizes an implementation allocates internally are
// declared here as pure functions, so the cost model and the executor cannot disagree.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/model.hpp"

namespace sp::contracts {

enum class Cap { Unknown, No, Yes };

// The implementation registered with a capability contract, opaque to planning code.
struct Impl {
  virtual ~Impl() = default;
};
const char* to_string(Cap);

enum class DeviceKind { CPU, CUDA };

// CPU: the packing a 16-bit GEMM allocates per worker thread for operands of `elements` in
// all: the figure measured at saturating sizes (`per_thread`, DeviceCaps::gemm_scratch), below
// them at most 32 KiB plus 4 bytes per operand element (oneDNN's fp16 and bf16 kernels).
inline int64_t gemm_packing_per_thread(int64_t per_thread, int64_t elements) {
  return per_thread > 0 ? std::min(per_thread, (int64_t{32} << 10) + 4 * elements) : 0;
}

// Shapes an attention call sees: q_rows query rows per head group against kv_rows keys.
struct AttnShape {
  int64_t q_rows = 0, kv_rows = 0, heads = 0, kv_heads = 0, head_dim = 0;
  ir::DType dtype = ir::DType::F32;
  DeviceKind device = DeviceKind::CPU;
  int threads = 1;  // CPU worker threads (per-thread scratch)
  int64_t gemm_scratch_per_thread = 0;  // CPU: a GEMM's operand packing per thread (DeviceCaps::gemm_scratch)
  bool k_carried = false;  // K arrives as the consumer's own carrier (ConsumerCaps::k_carrier_bytes)
};

// An attention call's run-time inputs as the plan fixes them (the executor sets q_begin per Q
// slab): the block's index, the sublayer's query rows, and what a routed (block-sparse) consumer
// keeps: `kv_budget` of the video key tiles per video query tile, the video rows (set only where
// the K/V rows are the model's rows [0, kv_rows)).
struct AttnCall {
  int64_t layer = 0;
  ir::RowRange queries;
  double kv_budget = 1.0;
  ir::RowRange video;
  int64_t q_begin = 0;  // the first query row of the call, in the model's token order
  // Whether a call against kv_rows keys drops key tiles.
  bool routed(int64_t kv_rows) const { return kv_budget < 1.0 && video.begin < video.end && video.end <= kv_rows; }
};

struct ConsumerCaps {
  std::string name;
  std::string description;
  Cap accepts_bounded_q = Cap::Unknown;  // bounded Q slab against global K/V
  Cap requires_global_k = Cap::Unknown;  // Yes: K must be complete before any Q slab
  Cap requires_global_v = Cap::Unknown;
  Cap slab_output = Cap::Unknown;        // output produced per Q slab
  // Yes: Q, K and V may arrive as views of token-major [rows, heads, head_dim] buffers (heads
  // strided in a row, head_dim contiguous); the planner then saves V's head-major copy.
  Cap strided_heads = Cap::Unknown;
  // Yes: attend_lse also returns each query row's log-sum-exp, so that outputs over parts of
  // K/V merge (ring attention passes K/V blocks around the ranks).
  Cap lse = Cap::Unknown;
  // Yes: what the call computes depends on where its query rows are (AttnCall::q_begin: routed
  // tiles, a Python consumer's q_start). A ulysses split then attends each rank's rows of a Q
  // slab in a call of their own, at their place in the model's rows. No: it depends on neither
  // its query rows' places nor its key rows' order (the same order for K and V), so that a
  // ulysses split may receive K/V rows straight into place in the order they arrive.
  Cap positions = Cap::Unknown;
  std::set<ir::DType> dtypes;            // accepted activation dtypes
  int64_t q_align = 1;                   // Q slab rows must be a multiple (except the last)
  int64_t kv_align = 1;                  // global K/V length must be a multiple
  // Bytes the consumer allocates for one call (output + scratch), by shape.
  std::function<int64_t(const AttnShape&)> call_bytes;
  // Separate allocations of those bytes that may be large (over 1 MiB): each may be counted
  // up to DeviceCaps::reuse_slack above its size (DeviceCaps::held).
  int call_allocations = 1;
  // Set: the consumer takes K as a carrier of its own (e.g. quantized K) that the K/V phase fills
  // slab by slab, slabs starting at multiples of k_carrier_align rows; its bytes by shape.
  std::function<int64_t(int64_t kv_heads, int64_t kv_rows, int64_t head_dim)> k_carrier_bytes;
  int64_t k_carrier_align = 1;
  // The share of dense attention's work a call does (a block-sparse consumer's visited tiles),
  // for the cost model. Unset: 1.
  std::function<double(const AttnShape&, const AttnCall&)> work_fraction;
  std::shared_ptr<const Impl> impl;
};

struct DeviceCaps;

// One native GEMM call of a format: rows x in_features against out_features, written into an
// output of dtype `out`, or added to it.
struct GemmCall {
  int64_t rows = 0, in_features = 0, out_features = 0;
  ir::DType out = ir::DType::BF16;
  bool accumulate = false;
};

struct FormatCaps {
  std::string name;
  std::string description;
  ir::DType storage = ir::DType::F32;  // element type as stored (dense: the model dtype)
  bool dense = true;                   // stored in the model dtype: acquired as a view
  Cap out_slicing = Cap::Unknown;      // row (output-feature) slices
  Cap in_slicing = Cap::Unknown;       // column (input-feature) slices
  int64_t out_align = 1, in_align = 1;
  Cap held_execution = Cap::Unknown;   // acquire once per block, reuse for every slab
  std::shared_ptr<const Impl> impl;
  // Native GEMM: where this answers true the format runs the projection itself on a view of the
  // stored slice (quantized activations, FLOPs at the 8-bit rate), with `gemm_workspace` allocated
  // beside the arena while it runs, instead of handing out a dense weight. Null: never.
  std::function<bool(const DeviceCaps&)> native_gemm;
  std::function<int64_t(const GemmCall&, const DeviceCaps&)> gemm_workspace;
  // The kernel the native GEMM runs on a device, in words (--explain); null: not declared.
  std::function<std::string(const DeviceCaps&)> gemm_kernel;
  // Relative L2 error of one projection against the same projection on the dequantized weight
  // (activation quantization); 0: exact up to rounding of the compute dtype.
  double tolerance = 0;
  // Element type of the stored weight of a model computing in `model`.
  ir::DType stored(ir::DType model) const { return dense ? model : storage; }
  // Copies of the whole weight (compute dtype) an acquire makes outside the arena while it runs
  // (a host's weight hook: the tensor it returns and its assembly).
  int whole_copies = 0;
  // Bytes an acquire of rows x cols for compute in `compute` allocates on a device while it
  // runs, besides its result (a temporary of a conversion); null: none.
  std::function<int64_t(int64_t rows, int64_t cols, ir::DType compute, const DeviceCaps&)> acquire_scratch;
  // Bytes an acquire of rows x cols for compute in `compute` allocates: none for a view, else the slice.
  int64_t acquire_bytes(int64_t rows, int64_t cols, ir::DType model, ir::DType compute) const {
    if (dense && compute == model) return 0;
    return rows * cols * static_cast<int64_t>(ir::dtype_size(compute));
  }
};

enum class TensorRole { Q, K, V, AttnOut, MlpHidden, BlockInput, BlockOutput };
const char* to_string(TensorRole);

struct PatchCaps {
  std::string name;   // instance name used in the IR
  std::string description;
  std::set<TensorRole> reads, modifies;
  Cap row_local = Cap::Unknown;      // may run on a token slab
  Cap feature_local = Cap::Unknown;  // may run on a feature slice of a row
  // Bytes one application allocates on `device` on a [rows, cols] tensor of `dtype`.
  std::function<int64_t(int64_t rows, int64_t cols, ir::DType dtype, DeviceKind device)> scratch_bytes;
  std::shared_ptr<const Impl> impl;
  bool touches(TensorRole r) const { return reads.count(r) != 0 || modifies.count(r) != 0; }
};

// Rates of the time estimate (plan/cost.hpp), measured by exec/device/probe.hpp; 0 means not
// measured, and the cost model uses its documented defaults for the device kind. A new rate
// is a member here and an entry of kRateFields, and its measurement in the probe.
struct Rates {
  double flops_per_s = 0;      // dense matmul throughput in 16-bit floats (bf16, fp16)
  double flops_per_s_f32 = 0;  // dense matmul throughput in fp32 (fp64 is taken as half)
  double bytes_per_s = 0;      // memory bandwidth: bytes read + written per second by a large copy
  double launch_s = 0;         // fixed cost of one small operation: dispatch and kernel launch
  double launch_gap_s = 0;     // the device's own cost of one, with the host ahead of it (a GPU)
  double gemm_half_rows = 0;   // rows at which a matmul reaches half its peak (efficiency rows/(rows+k))
  double gemm_probe_cols = 0;  // output features of the matmuls that curve was taken at (0: rows alone)
  double attention_ratio = 0;  // attention (SDPA) throughput as a fraction of the matmul peak
  double attention_ratio_ragged = 0;  // the same for a K/V length that is not a multiple of 128
  double attention_call_tiles = 0;    // time one attention call loses besides its waves, in tiles
  double attention_unit_tiles = 0;    // attention tiles one GPU multiprocessor runs at once (1 on a CPU)
  double attention_lone_wave = 0;     // time of a wave of one tile per multiprocessor, of a full wave's
  double row_bytes_per_s = 0;   // bandwidth of the fused norm + modulation kernel (bytes read + written)
  double qk_bytes_per_s = 0;    // bandwidth of the fused Q/K norm + RoPE kernel (bytes read + written)
  double host_bytes_per_s = 0;  // copies from pinned host memory onto the device (bytes per second)
  double link_bytes_per_s = 0;  // sequence parallel: bytes one rank sends + receives per second in an all-to-all
  bool operator==(const Rates&) const = default;
};

// What 0 means for a rate of a measured probe: never measured so (a cached probe holding it is
// not used), a measurement, or nothing to measure (no fused kernels; `streamplan probe` omits it).
enum class RateZero { Invalid, Measured, Absent };

// Each rate once: its name (the probe's JSON cache and `streamplan probe`), its member, how
// `streamplan probe` prints it, and what 0 means for it.
struct RateField {
  const char* name;
  double Rates::*member;
  const char* unit;
  double scale;
  RateZero zero;
};
inline constexpr RateField kRateFields[] = {
    {"flops_per_s", &Rates::flops_per_s, "GFLOP/s (16-bit matmul peak)", 1e9, RateZero::Invalid},
    {"flops_per_s_f32", &Rates::flops_per_s_f32, "GFLOP/s (fp32 matmul peak)", 1e9, RateZero::Invalid},
    {"gemm_half_rows", &Rates::gemm_half_rows, "rows at half the peak", 1, RateZero::Measured},
    {"gemm_probe_cols", &Rates::gemm_probe_cols, "output features of those matmuls", 1, RateZero::Invalid},
    {"bytes_per_s", &Rates::bytes_per_s, "GB/s (copy)", 1e9, RateZero::Invalid},
    {"host_bytes_per_s", &Rates::host_bytes_per_s, "GB/s (host to device)", 1e9, RateZero::Invalid},
    {"launch_s", &Rates::launch_s, "us per operation", 1e-6, RateZero::Invalid},
    {"launch_gap_s", &Rates::launch_gap_s, "us per operation on the device", 1e-6, RateZero::Invalid},
    {"attention_ratio", &Rates::attention_ratio, "of the matmul peak", 1, RateZero::Invalid},
    {"attention_ratio_ragged", &Rates::attention_ratio_ragged, "of the matmul peak (ragged K/V)", 1, RateZero::Measured},
    {"attention_call_tiles", &Rates::attention_call_tiles, "tiles per call", 1, RateZero::Measured},
    {"attention_unit_tiles", &Rates::attention_unit_tiles, "attention tiles at once per multiprocessor", 1, RateZero::Invalid},
    {"attention_lone_wave", &Rates::attention_lone_wave, "of a full wave's time (one tile per multiprocessor)", 1, RateZero::Invalid},
    {"row_bytes_per_s", &Rates::row_bytes_per_s, "GB/s (fused row kernels)", 1e9, RateZero::Absent},
    {"qk_bytes_per_s", &Rates::qk_bytes_per_s, "GB/s (fused Q/K norm + RoPE)", 1e9, RateZero::Absent},
    // Measured over a process group when one is given (exec::dist::probe_link), not by `streamplan probe`.
    {"link_bytes_per_s", &Rates::link_bytes_per_s, "GB/s (all-to-all between ranks)", 1e9, RateZero::Absent},
};

struct DeviceCaps {
  std::string name;
  DeviceKind kind = DeviceKind::CPU;
  int64_t memory_total = 0, memory_free = 0;
  std::set<ir::DType> dtypes;
  int cc_major = 0, cc_minor = 0;
  int threads = 1;
  int compute_units = 0;  // GPU: streaming multiprocessors (0: not a GPU)
  // CUDA's caching allocator rounds each block up; CPU allocations are exact.
  int64_t alloc_round = 1;
  // CUDA: the most bytes the caching allocator counts beyond a large request (over 1 MiB) when
  // it hands out a cached block whole; 0 where allocations are exact.
  int64_t reuse_slack = 0;
  Rates rates;  // of the time estimate; 0 where not measured
  // One-pass row kernels: norm + modulation into the activation dtype, and Q/K norm + RoPE
  // into the attention layout (exec/kernels/fused.hpp). Yes drops the fp32 staging buffers.
  Cap fused_row_kernels = Cap::Unknown;
  // CPU: bytes a GEMM in a dtype allocates per worker thread to pack its operands (oneDNN on
  // AMX / AVX512-BF16 units), by dtype; absent: none. Measured by exec::describe_device.
  std::map<ir::DType, int64_t> gemm_scratch_per_thread;
  // CPU: bytes per element an in-place multiply of a tensor in a 16-bit dtype by an fp32 one
  // allocates (fp32 temporaries, where ATen's kernels have no mixed-dtype vectors), by dtype;
  // absent: none. Measured by exec::describe_device.
  std::map<ir::DType, int64_t> mixed_multiply_bytes_per_element;
  int64_t round_alloc(int64_t bytes) const;
  // The most bytes `allocations` separate requests of `bytes` in all may hold at once: each
  // rounded, and each large one with the reuse slack. The activation estimate counts every
  // allocation a planned run makes outside the weights this way.
  int64_t held(int64_t bytes, int allocations = 1) const;
  bool operator==(const DeviceCaps&) const = default;
  int64_t gemm_scratch(ir::DType dtype) const { return of(gemm_scratch_per_thread, dtype); }
  // All threads' packing of one GEMM in `dtype` whose operands have `elements` in all.
  int64_t gemm_packing(ir::DType dtype, int64_t elements) const {
    return threads * gemm_packing_per_thread(gemm_scratch(dtype), elements);
  }
  int64_t mixed_multiply_bytes(ir::DType dtype, int64_t elements) const {
    return of(mixed_multiply_bytes_per_element, dtype) * elements;
  }

 private:
  // A per-dtype figure; 0 where the dtype is absent.
  static int64_t of(const std::map<ir::DType, int64_t>& by_dtype, ir::DType dtype) {
    const auto it = by_dtype.find(dtype);
    return it == by_dtype.end() ? 0 : it->second;
  }
};

// On the CPU an ATen operation with a number operand wraps it in a 0-dim tensor (a double,
// then one of the operation's dtype) while it runs; CUDA wraps numbers on the host.
int64_t scalar_operand_bytes(ir::DType op, DeviceKind device);

class ContractError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class Registry {
 public:
  void add(ConsumerCaps c);
  void add(FormatCaps f);
  void add(PatchCaps p);
  const ConsumerCaps& consumer(const std::string& name) const;  // throws ContractError listing known names
  const FormatCaps& format(const std::string& name) const;
  const PatchCaps& patch(const std::string& name) const;
  bool has_consumer(const std::string& n) const { return consumers_.count(n) != 0; }
  std::vector<std::string> consumer_names() const;
  std::vector<std::string> format_names() const;
  std::vector<std::string> patch_names() const;

 private:
  std::map<std::string, ConsumerCaps> consumers_;
  std::map<std::string, FormatCaps> formats_;
  std::map<std::string, PatchCaps> patches_;
};

}  // namespace sp::contracts
