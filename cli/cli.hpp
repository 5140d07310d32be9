// Subcommands of the `strata` CLI. Each add_* (one file per family: cli_bench.cpp,
// cli_train.cpp, cli_plan.cpp, ...) registers its options and, when its subcommand is
// chosen, sets selected() to its body; main() runs it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace strata::cli {

using Runner = std::function<int()>;
Runner& selected();  // the chosen subcommand's body (main.cpp)

void add_bench(CLI::App& app);   // cli_bench.cpp
void add_train(CLI::App& app);   // cli_train.cpp: train, sample, eval
void add_plan(CLI::App& app);    // cli_plan.cpp
void add_export(CLI::App& app);  // cli_export.cpp: export, import
// Further families add their declaration here and one call in main.cpp.

}  // namespace strata::cli
