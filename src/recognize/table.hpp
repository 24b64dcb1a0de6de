// Internal: the data model of recognition tables and the shape-expression helpers shared by
// the engine (recognize.cpp), the tensor lists (checkpoint.cpp) and the family tables
// (tables_*.cpp). Not part of the public API.
//
// A table entry, e.g. for diffusers Flux:
//   {"transformer_blocks.{layers}.attn.to_k.weight", "dim, dim",
//    "double_blocks.{layers}.img_attn.qkv.weight", Op::Concat0, 1}
// reads: a tensor named transformer_blocks.<i>.attn.to_k.weight for every i in 0..layers-1,
// of shape [dim, dim], is part 1 (0-based, along dim 0) of canonical
// double_blocks.<i>.img_attn.qkv.weight. Shapes are sums of products of integers and symbols
// ("3*dim+ffn"); how they bind: README.md, "Engine".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "recognize/recognize.hpp"

namespace sp::recognize::detail {

using Symbols = std::map<std::string, int64_t>;
using Features = std::set<std::string>;

struct Entry {
  std::string name;            // pattern; "{sym}" = block index over 0..sym-1
  std::string shape;           // comma-separated dimension expressions
  std::string canonical = {};  // canonical pattern; empty: same as name (original layout)
  Source::Op op = Source::Op::Copy;
  int part = 0;              // Concat0: position of this part within the canonical tensor
  std::string feature = {};  // non-empty: present iff the feature is on (all or none)
};

// The entries with each one named "<p>.weight+bias" replaced by the weight "<p>.weight" and,
// after it, its bias "<p>.bias": shaped as the weight's first dimension, with the canonical
// name's "weight" likewise replaced, the same op, part and feature.
std::vector<Entry> with_biases(std::vector<Entry> entries);

// A symbol that is one integer field of the config: Family::structure reads it, symbols writes it.
struct Field {
  const char* symbol;
  int64_t FamilyConfig::*field;
};
void set_fields(FamilyConfig& c, const Symbols& s, std::span<const Field> fields);
Symbols field_symbols(const FamilyConfig& c, std::span<const Field> fields);

struct Layout {
  std::string name;
  std::vector<Entry> entries;
};

struct Preset {
  std::string name;   // accepted by preset()
  FamilyConfig real;  // real dimensions
  FamilyConfig tiny;  // same structure, small widths
};

struct Family {
  std::string name;
  std::vector<Layout> layouts;  // "original" first: it defines the canonical names and shapes
  std::vector<Preset> presets;
  // Structural fields of the config from bound symbols and the features that are on. Only
  // what shapes cannot give is taken from the sidecar (Wan head_dim); a sidecar value that
  // contradicts the shapes throws RecognizeError.
  FamilyConfig (*structure)(const Symbols&, const Features&, const Sidecar&);
  // Inverse of structure(): symbols and features of a config (checkpoint_tensors).
  Symbols (*symbols)(const FamilyConfig&);
  Features (*features)(const FamilyConfig&);
  // Conventions for a config that matches no preset; leaves rope_axes_dim empty where the
  // family has no default for this head_dim.
  void (*custom_defaults)(FamilyConfig&);
  // Family-specific checks once conventions are final; throws RecognizeError.
  void (*check)(const FamilyConfig&, const Symbols&);
};

const Family& wan_family();
const Family& flux_family();
const Family& avdit_family();
const Family& minimax_h3_family();
const std::vector<const Family*>& all_families();
const Family* find_family(const std::string& name);  // nullptr if unknown

// ---- shape expressions ----
struct Term {
  int64_t coef = 1;
  std::vector<std::string> syms;
};
using Expr = std::vector<Term>;  // sum of terms

std::vector<Expr> parse_shape(const std::string& shape);  // throws std::logic_error (table bug)
std::optional<int64_t> evaluate(const Expr& e, const Symbols& syms);
std::string to_string(const Expr& e);
using io::shape_string;

std::string join(const std::vector<std::string>& v);  // "a, b, c"

// Placeholder symbol of a pattern ("" if none) and the pattern with "{symbol}" replaced by `value`.
std::string placeholder(const std::string& pattern);
std::string expand(const std::string& pattern, const std::string& value);

// Equal structural fields (everything but the variant name, block counts and conventions;
// of segments only the count).
bool same_structure(const FamilyConfig& a, const FamilyConfig& b);
// Copies the convention fields (eps, rope, text_tokens, timestep_scale, segments).
void copy_conventions(const FamilyConfig& from, FamilyConfig& to);

// Checks shared by families that rotate the whole head and have one fixed stream order:
// rotary_dim == head_dim and no sidecar `segments`. `family` and `streams` name them in errors.
void check_whole_head_rope(const FamilyConfig& c, const std::string& family, const std::string& streams);
// A sidecar head_dim must equal c.head_dim, read from the width of the tensor `width` names
// ("QK-norm", "norm_q", "q_norm").
void check_sidecar_head_dim(const FamilyConfig& c, const Sidecar& sidecar, const std::string& width);

}  // namespace sp::recognize::detail
