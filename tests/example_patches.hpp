// The built-in registry with the example patches of the tests (example_patches.cpp).
#pragma once

#include "contracts/contracts.hpp"
#include "exec/registry.hpp"

namespace sp::test {

void register_example_patches(contracts::Registry& reg);
contracts::Registry example_registry();

}  // namespace sp::test
