// Schedule program: the one description of what a planned run does, step by step (docs/schedule.md).
//
// compile_*() turn the plan's decisions for a sublayer (or the final layer, the embedding) into
// typed steps naming the buffers they read and write, their cost terms and the bytes they
// allocate outside the arena. Slab loops are steps too (Loop ... EndLoop: `count` slabs of
// `rows` rows); buffers declared inside a loop body live within one slab, those outside it
// across the loop. A Program points into the ir::Model it was compiled from; keep it alive.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "contracts/contracts.hpp"
#include "ir/model.hpp"

namespace sp::plan {

// What the compiler reads of a sublayer's schedule (plan::SublayerPlan is one). A chunk
// covering every row, or a slice covering every feature, is the full computation.
struct Schedule {
  int64_t token_chunk = 0;    // rows per slab: K/V projection, MLP, out projection
  int64_t q_chunk = 0;        // attention: Q rows per slab (== tokens when Q is not streamed)
  int64_t feature_slice = 0;  // MLP: hidden features per slice (== hidden when not sliced)
  bool streamed_out = false;  // attention: each Q slab's output projected and added at once
};

// What a buffer holds (for printing and for the budget error's terms).
enum class BufRole {
  GlobalK,      // [kv_heads, L, head_dim]      every key of the sublayer (or the consumer's K carrier)
  GlobalV,      // [kv_heads, L, head_dim]
  Normed32,     // [c, dim] fp32                normalized + modulated rows (staged path)
  Normed,       // [c, dim]                     the same in the activation dtype
  RowStats,     // [c, k] fp32                  per-row statistics of a staged norm
  KV,           // [2, c, kv_width]             projected k (0) and v (1)
  Staged32,     // [c, width] fp32              Q or K during Q/K norm and RoPE (staged path)
  RopeTmp,      // [c, heads, rotary_dim/2]     one rotary half (staged path)
  Q,            // [c, q_width]                 projected q
  QFolded,      // [kv_heads, rep*c, head_dim]  q head-major, GQA groups folded into rows
  AttnOut,      // [c, q_width]                 one slab's attention output
  AttnOutFull,  // [T, q_width]                 the complete attention output
  Proj,         // [c, dim]                     a projection before the residual add
  Hidden,       // [2|1, c, f]                  MLP gate (0) / up (1) of a feature slice
  Acc,          // [c, dim] fp32                accumulator over feature slices
  Output,       // [T, out] fp32                the model output
  Weight,       // an acquired weight (slice), converted where its format is not a view
  LoraAx,       // [c, rank]                    A·x of a LoRA adapter (one slab)
  KSlab,        // [kv_heads, c, head_dim]      one slab of K on its way into a consumer's carrier
  SeqRows,      // [own rows, width]            this rank's rows of Q, K or V, or of the attention output (sequence parallel)
  SeqHeads,     // [L, heads[me]*hd]            every rank's rows of this rank's heads (sequence parallel)
};
const char* to_string(BufRole);
const char* describe(BufRole);

struct Buffer {
  BufRole role;
  std::string label;  // e.g. "K", "weight blocks.0.attn.qkv.weight rows [0, 1536)"
  std::vector<int64_t> shape;
  ir::DType dtype;
  // Acquired weights that the weight source hands out as views own no bytes.
  bool view = false;
  int depth = 0;  // loop depth of its declaration (0: the whole program)
  int64_t bytes() const;
};

// Where a step's tensor comes from.
enum class Src {
  Buffer,    // a program buffer (prefix view of `shape`, or a slab of a global buffer)
  Residual,  // the residual stream: the current slab's rows
  Context,   // a context input (cross-attention K/V source): the current slab's rows
  Tokens,    // a segment's input tokens (embedding)
};

struct Operand {
  Src src = Src::Buffer;
  int buf = -1;              // Src::Buffer
  std::string name;          // Src::Context / Src::Tokens
  int slab_dim = -1;         // >= 0: the current token slab's rows along this dim of the buffer
  std::vector<int64_t> shape;  // the view the step uses
};

// rows [base + per_feature * f0, + length) with `step`, f0 the first feature of the current
// feature slab (0 outside a feature loop).
struct SliceExpr {
  int64_t base = 0, per_feature = 0, length = -1, step = 1;
};

// What moves a step's bytes: ATen operations (at the copy bandwidth) or one of the fused row
// kernels (at its own measured bandwidth).
enum class Mover { Memory, NormKernel, QkKernel };

// Cost terms of one execution of a step.
struct Terms {
  double flops = 0;       // multiply-adds x 2
  double bytes = 0;       // bytes read + written
  int64_t launches = 0;   // kernel launches / ATen operations
  int64_t gemm_rows = 0;  // > 0: a matmul over this many rows (its efficiency)
  ir::DType dtype = ir::DType::F32;  // compute dtype of the FLOPs
  bool attention = false;            // FLOPs of an attention kernel (Rates::attention_ratio)
  int64_t attention_heads = 0;       // attention: the K/V heads of one call (its tiles per query tile)
  int64_t attention_kv = 0;          // attention: the K/V length
  Mover mover = Mover::Memory;
  int64_t gemm_cols = 0;  // a matmul: its output features (with gemm_rows, its efficiency)
  double link_bytes = 0;  // bytes this rank sends and receives between ranks (Rates::link_bytes_per_s)
  // The link time runs beside the steps that follow until the exchange completes (an exchange
  // with `received`), instead of before them.
  bool overlapped = false;
  // The share of the link time that runs beside this step's own work (an exchange that attends
  // what arrives while the rest travels); the rest comes after it.
  double link_beside = 0;
};

enum class Axis { Tokens, Features };

// One projection weight, by the segment its rows belong to (empty: every segment).
struct SegWeight {
  std::string segment;
  int weight = -1;          // the acquired Weight buffer
  std::string bias;         // empty: none
  SliceExpr bias_rows;      // rows of the bias vector
  std::string norm_weight;  // Q/K norm weight of this projection set (QkNorm / QkNormRope)
  int bias_buf = -1;        // >= 0: the bias as acquired in the compute dtype (used instead)
};

struct LoopStep {
  Axis axis = Axis::Tokens;
  int64_t base = 0;   // absolute residual row of index 0 (token loops)
  int64_t begin = 0;  // first index
  int64_t rows = 0;   // per slab
  int64_t count = 0;  // slabs
  int end = -1;       // index of the matching EndLoop
};
struct EndLoopStep {
  int begin = -1;
};
// A weight (slice) into its Weight buffer, as the format converts it to `dtype`.
struct AcquireStep {
  const ir::Linear* linear = nullptr;  // null: the raw tensor `tensor` (a bias in another dtype)
  std::string tensor;
  SliceExpr rows;
  SliceExpr cols;
  ir::DType dtype;
  int out = -1;
  bool native = false;  // the stored slice as a view, for the format's own GEMM (FormatCaps::native_gemm)
};
struct ReleaseStep {
  int weight = -1;
};
struct ZeroStep {
  Operand t;
  int64_t from = 0;  // the rows [from, end) of t's first dimension
};
// out := modulate(norm(residual rows)); fused: one kernel, else fp32 staging with `stats`.
struct NormStep {
  const ir::Norm* norm = nullptr;
  const ir::Modulation* mod = nullptr;
  ir::ModRef ref;
  bool fused = false;
  Operand out;
  Operand stats;  // staged: [n, 1] fp32 row statistics
};
enum class Layout {
  Same,       // dst := src (a cast where dtypes differ); token-major [n, heads*hd]
  HeadMajor,  // dst [heads, n, hd] := src [n, heads*hd]
  Folded,     // dst [G, rep*n, hd] := src [n, G*rep*hd]
};
struct CopyStep {
  Operand src, dst;
  Layout layout = Layout::Same;
  int64_t heads = 0, rep = 1, head_dim = 0;
};
// out (+)= in[:, cols] @ W^T (+ bias), W chosen by the segment of each row.
struct ProjectStep {
  Operand in, out;
  std::vector<SegWeight> weights;
  int64_t col_begin = 0, col_len = -1;  // input-feature range of the acquired weight
  bool accumulate = false;
  bool native = false;  // the weights' format runs the GEMM (natively acquired weights)
};
struct QkNormStep {
  Operand t;  // [n, heads*hd] fp32
  ir::QkNorm qk;
  std::vector<SegWeight> weights;  // norm_weight per segment
  int64_t heads = 0, head_dim = 0;
  Operand stats;  // [n, heads | 1] fp32 statistics
};
struct RopeStep {
  Operand t;  // [n, heads*hd] fp32, rotated in place
  const ir::Rope* rope = nullptr;
  int64_t heads = 0, head_dim = 0;
  Operand tmp;  // [n, heads, rotary_dim/2] fp32
};
// Q/K norm and RoPE in one kernel, from in [n, heads*hd] into dst in `layout`.
struct QkNormRopeStep {
  Operand in, dst;
  Layout layout = Layout::HeadMajor;
  ir::QkNorm qk;
  const ir::Rope* rope = nullptr;
  std::vector<SegWeight> weights;
  int64_t heads = 0, rep = 1, head_dim = 0;
};
struct PatchStep {
  std::string patch;
  contracts::TensorRole role;
  Operand t;
};
// The K slab [kv_heads, n, hd] of the current token slab into the consumer's K carrier
// (ConsumerCaps::k_carrier_bytes), at the slab's rows of kv_rows.
struct CarryKStep {
  std::string consumer;
  Operand k;
  Operand carrier;
  int64_t kv_rows = 0;
};
// out [n, heads*hd] token-major := consumer(q, K, V); `carried`: k is the consumer's K carrier of
// kv_rows rows. q folded [G, rep*n, hd] or token-major, K and V head-major [G, kv_rows, hd] or
// token-major (as [1, G, rows, hd] views with strided heads). `call`: the consumer's other inputs.
struct AttendStep {
  std::string consumer;
  Operand q, k, v, out;
  Layout q_layout = Layout::Folded, kv_layout = Layout::HeadMajor;
  int64_t kv_heads = 0, rep = 1, head_dim = 0;
  double scale = 1.0;
  bool carried = false;
  int64_t kv_rows = 0;
  contracts::AttnCall call;
  // Under a ulysses split, for a consumer that reads its rows' places (ConsumerCaps::positions):
  // the Q slab holds `rows` rows of each rank in rank order, slab i of each rank's rows of the
  // sublayer (`ranks[r]`, this rank `me`), each attended in a call of its own at its first row;
  // the rows past a rank's own are left zero. No ranks: one call, at the slab's first row.
  struct Pieces {
    std::vector<ir::RowRange> ranks;
    int64_t rows = 0, me = 0;
  } pieces;
};
// Sequence parallel (Sequence): a collective over every rank of the process group. Every rank
// runs the same ones in the same order, whatever rows it holds: at loop depth 0, or once per
// slab of a token loop that every rank runs as many times (padded with empty slabs).
//   RowsToHeads: in [rows[me], sum(heads) * unit] -> out, every rank's rows of this rank's heads
//                ([sum(rows), heads[me] * unit] token-major, or [heads[me], sum(rows), unit]):
//                the rows of one slab placed in `out` holding every row (`held`).
//   Ring:        out [rows[me], H * hd] := attention of q (in) [rows[me], H * hd] over the
//                keys and values of every rank, k and v [rows[me], G * hd] here, the K/V
//                blocks passed around the ranks and attended by `consumer`'s attend_lse,
//                q_chunk query rows at a time, the outputs merged in fp32.
//   Complete:    waits for the RowsToHeads in flight through `received` and places its rows.
//   Ulysses:     out [rows[me], sum(heads) * unit] := the attention of this rank's Q rows `in`
//                (the same shape) by `attend`, each rank's heads attended by that rank. Each
//                rank's rows arrive in `q_heads` [sum(rows), heads[me] * unit] (attend.q folds
//                them where its layout is Folded) in rounds, rank me - r's in round r, and are
//                attended as they come, this rank's own first; each piece's output (attend.out,
//                as q_heads) goes back to its rank at once. So a piece travels while another is
//                attended.
// A RowsToHeads is left in flight through `sent` and `received` (program buffers of one slab of
// every rank): it completes at the next exchange through the same `received`, or at a Complete
// step, so that the steps between run while it travels.
enum class Exchange { RowsToHeads, Ring, Complete, Ulysses };
struct ExchangeStep {
  Exchange kind = Exchange::RowsToHeads;
  Operand in, out;
  std::vector<int64_t> rows{}, heads{};  // per rank
  int64_t unit = 0;                  // features per head (Ulysses: per query head)
  Layout out_layout = Layout::Same;  // RowsToHeads: Same or HeadMajor
  Operand k{}, v{};                  // Ring
  int64_t rep = 1, q_chunk = 0;      // Ring: query heads per K/V head, query rows per score block
  double scale = 1.0;                // Ring
  std::string consumer{};            // Ring: a consumer that returns the log-sum-exp (ConsumerCaps::lse)
  Operand sent{}, received{};        // RowsToHeads in flight (above); Complete: `received`; Ulysses: `sent`, the pieces out and back
  // RowsToHeads, one slab of a token loop: each rank sends `chunk` rows (padded past its `held`
  // rows); the real ones land in `out` (every row) at their rows. `arrival`: each rank sends its
  // real rows alone and they land straight in `out` (token-major; `received` is `out`) in the
  // order they arrive, slab after slab, each slab's in rank order: for a consumer to which the
  // order of its key rows is nothing (ConsumerCaps::positions No), K and V in the same order.
  std::vector<int64_t> held{};
  int64_t chunk = 0;
  bool arrival = false;
  Operand q_heads{};                 // Ulysses
  std::optional<AttendStep> attend{};  // Ulysses: the attention of this rank's heads (none where it has no heads)
};
struct ActivateStep {
  Operand t;
  ir::ActKind act;
};
struct MulStep {
  Operand dst, src;  // dst *= src
};
struct AddStep {
  Operand dst, src;  // dst += src
};
struct AddBiasStep {
  Operand t;
  std::string bias;
};
// residual rows += gate * y (gate from the modulation, or 1).
struct ResidualAddStep {
  Operand y;
  const ir::Modulation* mod = nullptr;
  ir::ModRef ref;
  bool fused = false;  // one fused row kernel per piece (fused_norm), else ATen
};

// One LoRA adapter on the weight slice a projection used: output rows `rows` and input
// columns `cols` of the full weight (resolved per feature slab like an acquire's).
struct LoraUse {
  const ir::LoraAdapter* adapter = nullptr;
  SliceExpr rows, cols;
};
// After a ProjectStep: out[:, r] += scale * (in @ A[:, cols]^T) @ B[r]^T for each adapter of
// the weight each row's segment used (`weights` as the projection's, `uses` parallel to it),
// r the adapter's rows within the projected ones; A·x goes through the `ax` buffer.
struct LoraStep {
  std::string patch;  // the registered patch implementing it
  Operand in, out;
  std::vector<SegWeight> weights;
  std::vector<std::vector<LoraUse>> uses;
  Operand ax;
};

using StepBody = std::variant<LoopStep, EndLoopStep, AcquireStep, ReleaseStep, ZeroStep, NormStep, CopyStep,
                              ProjectStep, QkNormStep, RopeStep, QkNormRopeStep, PatchStep, AttendStep, ActivateStep,
                              MulStep, AddStep, AddBiasStep, ResidualAddStep, LoraStep, CarryKStep, ExchangeStep>;
const char* step_name(const StepBody&);
// The attention a step runs: an AttendStep's, or a Ulysses exchange's; null for other steps.
inline const AttendStep* attend_of(const StepBody& b) {
  if (const auto* a = std::get_if<AttendStep>(&b)) return a;
  const auto* x = std::get_if<ExchangeStep>(&b);
  return x && x->attend ? &*x->attend : nullptr;
}

struct Step {
  StepBody body;
  std::string what;           // human-readable summary
  std::vector<int> reads, writes;  // buffers
  Terms terms;                // one execution
  int64_t transient = 0;      // bytes allocated outside the arena while the step runs
  int depth = 0;              // loop depth
};

struct Program {
  std::string name;  // "blocks.3.attn", "final", "embed"
  std::vector<Buffer> buffers;
  std::vector<Step> steps;
  // Rows of the residual stream the program reads and writes.
  ir::RowRange rows;
};

// Sequence parallel: the residual stream's rows shared out over `ranks` processes (shares() of
// every row; this one is `rank`), self-attention seeing the other ranks' rows through
// exchanges: Ulysses trades rows for K/V head groups around attention (all-to-all), Ring
// passes K/V blocks around the ranks. One rank: no split.
enum class SeqMode { Ulysses, Ring };
const char* to_string(SeqMode);
struct Sequence {
  int64_t rank = 0, ranks = 1;
  SeqMode mode = SeqMode::Ulysses;
  bool sharded = false;  // the blocks' weights sharded over the ranks (exec/dist/sharded.hpp), not replicated
  bool split() const { return ranks > 1; }
  bool operator==(const Sequence&) const = default;
};
// n items over p ranks: the first n % p take one more (std::invalid_argument for n < 0, p < 1).
std::vector<int64_t> shares(int64_t n, int64_t p);
// The residual rows rank `s.rank` holds of a stream of `tokens` rows.
ir::RowRange own_rows(const Sequence& s, int64_t tokens);
// How many rows of `rr` each rank holds, and the most any rank holds.
std::vector<int64_t> rows_per_rank(const Sequence& s, int64_t tokens, ir::RowRange rr);
// Which rows of `rr` each rank holds (empty ranges where it holds none).
std::vector<ir::RowRange> ranges_per_rank(const Sequence& s, int64_t tokens, ir::RowRange rr);
int64_t most_rows(const Sequence& s, int64_t tokens, ir::RowRange rr);
// Under a ulysses split, the rows of a self-attention sublayer's K/V slabs and of its Q slabs per
// rank, which every rank's exchanges trade (so every rank's must be the same): the schedule's
// token chunk, and its q chunk over the ranks, each within 1 and `most`, the most rows any rank
// holds of the sublayer.
std::pair<int64_t, int64_t> ulysses_slabs(const Schedule& p, int64_t most, int64_t ranks);
// "ulysses over 2 ranks, rank 0: rows [0, 1537) of 3073"; "" for one rank.
std::string sequence_text(const Sequence& s, int64_t tokens);

// Whether the device's fused row kernels run: norm + modulation, and Q/K norm + RoPE, the latter
// not where a patch reads or modifies Q or K (patches run on fp32 staging).
bool fused_norm(const ir::Model& m, const contracts::DeviceCaps& dev);
bool fused_qk(const ir::Model& m, const ir::Attention& a, const contracts::Registry& reg,
              const contracts::DeviceCaps& dev);
// The consumer that ring attention attends each K/V block with: the sublayer's where it returns
// the log-sum-exp (ConsumerCaps::lse), else "math".
std::string ring_consumer(const contracts::Registry& reg, const ir::Attention& a);
// Which row operations a plan runs and why (explain()).
std::string row_kernels_note(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev);
// fp32, or fp64 for an fp64 model: norms, RoPE, feature-slice accumulation, the output.
ir::DType accumulation_dtype(ir::DType activations);

// `kv_budget`: the run-time input of routed attention (plan::Options::kv_budget). `seq`: the
// rows this rank computes (plan::Options::sequence); a program of a split sublayer also runs
// its exchanges.
Program compile_sublayer(const ir::Model& m, const ir::Block& b, const ir::Sublayer& s, const Schedule& p,
                         const contracts::Registry& reg, const contracts::DeviceCaps& dev, double kv_budget = 1.0,
                         const Sequence& seq = {});
Program compile_final(const ir::Model& m, int64_t chunk, const contracts::Registry& reg,
                      const contracts::DeviceCaps& dev, const Sequence& seq = {});
Program compile_embed(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                      const Sequence& seq = {});
// The row norm of a block with a post_norm, run after its sublayers.
Program compile_post_norm(const ir::Model& m, const ir::Block& b, const contracts::Registry& reg,
                          const contracts::DeviceCaps& dev, const Sequence& seq = {});

// Calls f(step, runs) for every step but the loop markers, `runs` how often one run of the
// program executes it (the slab counts of its enclosing loops, multiplied).
template <typename F>
void for_each_run(const Program& p, F&& f) {
  std::vector<int64_t> times = {1};
  for (const Step& s : p.steps) {
    if (const auto* l = std::get_if<LoopStep>(&s.body)) times.push_back(times.back() * l->count);
    else if (std::holds_alternative<EndLoopStep>(s.body)) times.pop_back();
    else f(s, times.back());
  }
}

// Programs compiled in this process so far: a forward compiles none (the plan holds its parts).
int64_t programs_compiled();

// "Q [1072, 384] bf16"
std::string buffer_text(const Buffer& b);
// The program as text: one step per line (indented by loop depth), then the buffers placed.
std::string to_text(const Program& p, const std::vector<int64_t>& offsets, int64_t arena_bytes);

}  // namespace sp::plan
