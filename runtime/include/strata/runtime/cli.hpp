// Subcommands of the `strata` CLI. Each add_* registers its options; run_selected
// runs whichever was chosen.
#pragma once

#include <CLI/CLI.hpp>

namespace strata::cli {

void add_bench(CLI::App& app);
int run_selected(CLI::App& app);

}  // namespace strata::cli
