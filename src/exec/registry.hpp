// The built-in registry: every consumer, weight format and patch of this library, each
// registered once with its capabilities and its implementation.
//
// Design note. This header includes no ATen, so planning code and its tests can use the
// built-in contracts. A new consumer or format is one file in consumers/ or formats/ and
// one line in registry.cpp; one defined elsewhere is added with contracts::Registry::add.
//
// Example:
//     sp::contracts::Registry reg = sp::exec::builtin_registry();
//     sp::plan::Plan p = sp::plan::make_plan(model, reg, device, {});
#pragma once

#include "contracts/contracts.hpp"

namespace sp::exec {

contracts::Registry builtin_registry();

}  // namespace sp::exec
