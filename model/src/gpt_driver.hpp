// gpt.cpp reads the driver by this name; the driver itself is public
// (strata/model/gpt_driver.hpp), since the runtime's simulator runs through it too.
#pragma once

#include "strata/model/gpt_driver.hpp"
