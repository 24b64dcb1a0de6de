#include "exec/registry.hpp"

#include "exec/consumers/consumer.hpp"
#include "exec/formats/weights.hpp"
#include "exec/patches/patch.hpp"

namespace sp::exec {

contracts::Registry builtin_registry() {
  contracts::Registry r;
  consumers::register_sdpa(r);
  consumers::register_math(r);
  formats::register_dense(r);
  formats::register_int8_rowwise(r);
  patches::register_examples(r);
  return r;
}

}  // namespace sp::exec
