#include <functional>

#include "strata/runtime/cli.hpp"

namespace strata::cli {

namespace {
std::function<int()> g_selected;
}

void add_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Measure offload bandwidth against capacity");
  bench->require_subcommand(1);
}

int run_selected(CLI::App&) { return g_selected ? g_selected() : 0; }

}  // namespace strata::cli
