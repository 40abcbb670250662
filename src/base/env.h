// Environment switches for A/B runs (QSPEC_W4A16_PACKED_X, QSPEC_PLANNER_TOKEN_BUCKETS, ...): one
// parse for every 0 / 1 switch, so each reads and rejects its value the same way.
#pragma once
#include <optional>

namespace qspec {

// NAME=1: true, NAME=0: false, unset or empty: nothing; any other value throws qspec::Error
// naming the variable and its value. Callers cache it (a static) where it sits on a hot path.
std::optional<bool> env_switch(const char* name);

}  // namespace qspec
