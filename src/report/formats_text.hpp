// The weight formats of a model's linears as `--explain` prints them: grouped by what they
// share, or one line per linear (`--explain=full`).
//
// Design note. A 40-block model has hundreds of linears, and almost all of them read alike
// ("dense, stored in higher precision; GEMM: matmul of the stored weight"). Grouped, linears
// with the same format, reason and GEMM make one line that says how many there are and
// which blocks hold them ("400 linears in blocks 0–39 (10 per block): ..."); the linears
// outside the blocks (embeddings, final layer) are named. Blocks are found from the IR, not
// from weight names.
//
// Example:
//     const auto lines = sp::models::format_lines(model, weights, reg, dev);
//     std::cout << sp::report::formats_text(model, lines, /*full=*/false);
#pragma once

#include <string>
#include <vector>

#include "ir/model.hpp"
#include "models/quant_load.hpp"

namespace sp::report {

std::string formats_text(const ir::Model& m, const std::vector<models::FormatLine>& lines, bool full);

}  // namespace sp::report
