#include "exec/registry.hpp"

namespace sp::exec {

// Each defined in its own file (consumers/, formats/, patches/): capabilities + implementation.
namespace consumers {
void register_sdpa(contracts::Registry& reg);
void register_math(contracts::Registry& reg);
void register_int8_attention(contracts::Registry& reg);
void register_sparse(contracts::Registry& reg);
}  // namespace consumers
namespace formats {
void register_dense(contracts::Registry& reg);
void register_int8_rowwise(contracts::Registry& reg);
void register_fp8(contracts::Registry& reg);
void register_int8(contracts::Registry& reg);
void register_convrot_int8(contracts::Registry& reg);
}  // namespace formats
namespace patches {
void register_lora(contracts::Registry& reg);
}  // namespace patches

contracts::Registry builtin_registry() {
  contracts::Registry r;
  consumers::register_sdpa(r);
  consumers::register_math(r);
  consumers::register_int8_attention(r);
  consumers::register_sparse(r);
  formats::register_dense(r);
  formats::register_int8_rowwise(r);
  formats::register_fp8(r);
  formats::register_int8(r);
  formats::register_convrot_int8(r);
  patches::register_lora(r);
  return r;
}

}  // namespace sp::exec
