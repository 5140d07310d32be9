// Private: the `scheduler` section's table (config_scheduler.cpp), which
// config_table.cpp's top level holds.
#pragma once

#include "strata/core/config_keys.hpp"

namespace strata {
const ConfigSection& scheduler_config_section();
}  // namespace strata
