// Model IR: the semantics of a transformer as a planner sees it.
//
// A model is a token-major residual stream (width `dim`) of named token segments, with optional
// input projections, blocks and a final layer. Every sublayer of a block has one shape,
//     x += gate * body(modulate(norm(x)))
// with body an Attention or an Mlp: the granularity the schedule transformations act on, so
// legality and cost reason per sublayer without pattern-matching a graph. Weights are referenced
// by name (with their format), never owned; runtime tensors are named inputs. No ATen here.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace sp::ir {

enum class DType { F32, BF16, F16, F64, I8, F8E4M3, F8E5M2 };
enum class NormKind { LayerNorm, RMSNorm };
enum class ActKind { Gelu, GeluTanh, Silu };
enum class RopeStyle { None, Interleaved, SplitHalf };
enum class QkNormKind { None, PerHead, AcrossHeads };
// How gate and up projections of a gated MLP are stored.
enum class GateUpLayout { None /* plain MLP */, Separate, FusedHalves, Interleaved };
// Shared: one set for all tokens; PerSegment: one per token segment; PerToken: one per row.
enum class ModScope { None, Shared, PerSegment, PerToken };
enum class AttnKind { Self, Cross };

// The entry of `names`, written in the enum's declaration order, for enumerator e.
template <typename E, size_t N>
constexpr const char* name_of(E e, const char* const (&names)[N]) {
  return static_cast<size_t>(e) < N ? names[static_cast<size_t>(e)] : "?";
}

const char* to_string(DType);
const char* to_string(NormKind);
const char* to_string(ActKind);
const char* to_string(RopeStyle);
const char* to_string(QkNormKind);
const char* to_string(GateUpLayout);
const char* to_string(ModScope);
const char* to_string(AttnKind);
size_t dtype_size(DType);
// Parses "gelu", "gelu-tanh", "silu"; throws IrError naming `field` otherwise.
ActKind parse_act(const std::string& s, const std::string& field);
// Parses the dtypes activations (and written checkpoints) may have: "fp32", "bf16", "fp16";
// throws IrError naming `field` otherwise. A caller that accepts "auto" resolves it first.
DType parse_dtype(const std::string& s, const std::string& field);
// The activation dtypes by name, as parse_dtype accepts them: "fp32", "bf16", "fp16".
std::vector<std::string> activation_dtype_names();

// "[2, 3]"
std::string shape_text(const std::vector<int64_t>& shape);

// The smallest multiple of `multiple` (> 0) that is >= v, for v >= 0: chunk sizes rounded
// to a consumer's alignment, byte counts rounded to an allocator's granule.
constexpr int64_t round_up(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

class IrError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A named range of a fused weight's output (rows) or input (columns).
struct Region {
  std::string name;
  int64_t offset = 0;
  int64_t size = 0;
  bool operator==(const Region&) const = default;
};

// A low-rank update of a Linear's weight, applied lazily per slab (exec/patches/lora.cpp):
// y[:, rows] += scale * (x @ A^T) @ B^T for output rows [row_offset, row_offset + rows).
struct LoraAdapter {
  std::string a, b;     // names in the weight source: A [rank, in_features], B [rows, rank]
  int64_t rank = 0;
  double scale = 1;     // strength * alpha / rank (strength where the file has no alpha)
  int64_t row_offset = 0, rows = 0;
  bool operator==(const LoraAdapter&) const = default;
};

struct Linear {
  std::string weight;          // name in the weight source; weight shape [out, in]
  std::string bias;            // empty: no bias
  int64_t in_features = 0;
  int64_t out_features = 0;
  std::string format = "dense";  // weight format name (contracts registry)
  bool fp32_compute = false;     // computed in fp32 (final projections)
  // The dtype the weight source holds the weight in when it is not the model's (a family that
  // keeps some weights in fp32 in a 16-bit model); acquiring it in that dtype converts nothing.
  std::optional<DType> stored;
  std::vector<Region> out_regions;
  std::vector<Region> in_regions;
  std::vector<LoraAdapter> loras;  // applied on top of the weight in every projection of it
  const Region* out_region(const std::string& name) const;
  bool operator==(const Linear&) const = default;
};

struct Norm {
  NormKind kind = NormKind::RMSNorm;
  bool affine = false;
  std::string weight, bias;  // used when affine (bias only for LayerNorm, may be empty)
  double eps = 1e-6;
  bool operator==(const Norm&) const = default;
};

// Indices into a per-block modulation table of `count` vectors of width dim.
// A negative index means "not present" (scale 0, shift 0, gate 1).
struct ModRef {
  int shift = -1, scale = -1, gate = -1;
  bool operator==(const ModRef&) const = default;
};

struct Rope {
  RopeStyle style = RopeStyle::None;
  int64_t rotary_dim = 0;  // leading head dims rotated; <= head_dim, even
  std::string table = "rope";  // runtime input: cos/sin [tokens, rotary_dim/2]
  bool operator==(const Rope&) const = default;
};

struct QkNorm {
  QkNormKind kind = QkNormKind::None;
  double eps = 1e-6;
  bool operator==(const QkNorm&) const = default;
};

// The projections of one token stream. q_norm / k_norm name the QK-norm weights.
struct AttnProj {
  std::optional<Linear> qkv;  // fused: out regions q|k|v (and mlp for a parallel MLP)
  std::optional<Linear> q, k, v;
  std::string q_norm, k_norm;
  Linear out;  // parallel MLP: in regions attn|mlp
  bool fused() const { return qkv.has_value(); }
  const Linear& q_linear() const { return qkv ? *qkv : *q; }
  const Linear& k_linear() const { return qkv ? *qkv : *k; }
  const Linear& v_linear() const { return qkv ? *qkv : *v; }
  bool operator==(const AttnProj&) const = default;
};

// An MLP computed from the attention's fused input projection (region "mlp") whose
// activated output joins the attention output in the output projection (Flux single blocks).
struct ParallelMlp {
  int64_t hidden = 0;
  ActKind act = ActKind::GeluTanh;
  bool operator==(const ParallelMlp&) const = default;
};

struct Attention {
  AttnKind kind = AttnKind::Self;
  std::string context;  // Cross: runtime input [context_tokens, context dim]; K/V come from it
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  AttnProj proj;  // rows of every segment without an entry in segment_proj
  // Joint attention over streams with their own weights: segment name -> projections.
  std::vector<std::pair<std::string, AttnProj>> segment_proj;
  QkNorm qk_norm;
  Rope rope;
  std::optional<ParallelMlp> parallel;
  std::string consumer = "sdpa";
  std::vector<std::string> patches;  // patch instance names (contracts registry)
  const AttnProj& proj_for(const std::string& segment) const;
  std::vector<const AttnProj*> all_proj() const;
  bool operator==(const Attention&) const = default;
};

struct Mlp {
  GateUpLayout layout = GateUpLayout::None;
  ActKind act = ActKind::GeluTanh;
  int64_t hidden = 0;          // FFN width (per half for gated MLPs)
  std::optional<Linear> up;    // plain: [hidden, dim]; FusedHalves/Interleaved: [2*hidden, dim]
  std::optional<Linear> gate;  // Separate only: [hidden, dim]
  Linear down;                 // [dim, hidden]
  std::vector<std::string> patches;
  bool operator==(const Mlp&) const = default;
};

struct Sublayer {
  std::string name;
  std::vector<std::string> segments;  // rows it applies to (contiguous); empty: all tokens
  Norm norm;
  ModRef mod;
  std::variant<Attention, Mlp> body;
  bool is_attention() const { return std::holds_alternative<Attention>(body); }
  bool operator==(const Sublayer&) const = default;
};

struct Modulation {
  ModScope scope = ModScope::None;
  int count = 0;          // vectors per segment (or per token)
  std::string table;      // runtime input: [segments|tokens, count, dim]
  bool operator==(const Modulation&) const = default;
};

// A norm applied in place to the rows of `segments` after a block's sublayers, without
// modulation (e.g. the final norm of a text refiner whose blocks run over the text rows only).
struct RowNorm {
  std::vector<std::string> segments;
  Norm norm;
  bool operator==(const RowNorm&) const = default;
};

struct Block {
  std::string name;
  Modulation modulation;
  std::vector<Sublayer> sublayers;
  std::optional<RowNorm> post_norm;
  bool operator==(const Block&) const = default;
};

struct FinalLayer {
  std::vector<std::string> segments;  // rows projected to the output; empty: all tokens
  Norm norm;
  Modulation modulation;  // count 2: shift, scale
  ModRef mod;
  Linear proj;            // fp32_compute typically true; its out_features is the output width
  // Per segment, its own projection instead of proj (e.g. a video and an audio head). A head
  // narrower than proj writes the leading columns of its rows; the others are 0.
  std::vector<std::pair<std::string, Linear>> heads;
  const Linear& proj_for(const std::string& segment) const;
  bool operator==(const FinalLayer&) const = default;
};

struct Segment {
  std::string name;
  int64_t length = 0;
  bool operator==(const Segment&) const = default;
};

// A token stream outside the residual (runtime input [length, dim]), e.g. embedded text
// that cross-attention reads.
struct Context {
  std::string name;
  int64_t length = 0, dim = 0;
  bool operator==(const Context&) const = default;
};

// A segment's input projection into the residual. With linear.fp32_compute the segment's
// tokens come in the accumulation dtype and are projected in it (e.g. patch embeddings a
// model keeps in fp32), then rounded to the activation dtype.
struct SegmentEmbed {
  std::string segment;
  Linear linear;
  bool operator==(const SegmentEmbed&) const = default;
};

struct RowRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

struct Model {
  std::string name;
  int64_t dim = 0;
  DType dtype = DType::F32;       // activation dtype
  std::vector<Segment> segments;  // in token order
  std::vector<Context> contexts;
  std::vector<SegmentEmbed> embeds;  // segments without one take their tokens as [length, dim]
  std::vector<Block> blocks;
  std::optional<FinalLayer> final_layer;

  int64_t tokens() const;
  const Segment& segment(const std::string& name) const;  // throws IrError
  int64_t segment_begin(const std::string& name) const;
  // Rows covered by `segments` (all tokens when empty); throws unless they are contiguous.
  RowRange rows(const std::vector<std::string>& segments) const;
  const SegmentEmbed* embed_for(const std::string& segment) const;
  int64_t input_features(const std::string& segment) const;
  int64_t output_tokens() const;
  const Context& context(const std::string& name) const;  // throws IrError
  // Rows of K and V of an attention sublayer: the context's for cross-attention, else its own.
  int64_t kv_rows(const Sublayer& s) const;
  // Segment boundaries strictly inside `r`: a slab over r splits into one more piece for
  // each (per-segment modulation, per-segment projections).
  int64_t inner_boundaries(RowRange r) const;
  bool operator==(const Model&) const = default;
};

// Throws IrError naming the field path and the values on any inconsistency.
void validate(const Model& m);

// Calls fn on every Linear of the model: the segments' embeddings, every projection of every
// sublayer, the final layer's projection and heads.
void for_each_linear(Model& m, const std::function<void(Linear&)>& fn);
// The same for the projections of one block's sublayers.
void for_each_linear(const Block& b, const std::function<void(const Linear&)>& fn);
// The block with the names of its sublayers and of the tensors and tables it reads replaced by
// "*" (an empty name stays empty): blocks equal in this form compute alike, differing only in
// what they read.
Block anonymous(Block b);
// The names of the weight tensors a block reads: its linears' weights, biases and LoRA
// factors and its affine norms' weights and biases (Q/K norms and the row norm after the block included).
std::vector<std::string> tensor_names(const Block& b);
// The same for the rest of the model: the embeddings' and the final layer's.
std::vector<std::string> tensor_names_outside_blocks(const Model& m);

}  // namespace sp::ir
