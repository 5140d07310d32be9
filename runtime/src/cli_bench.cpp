#include "strata/bench/commands.hpp"
#include "strata/runtime/cli.hpp"

namespace strata::cli {

namespace {
bench::Runner g_selected;
}

void add_bench(CLI::App& app) {
  auto* b = app.add_subcommand("bench", "Measure offload bandwidth against capacity, beside a reference tool");
  b->require_subcommand(1);
  bench::add_io(*b, g_selected);
  bench::add_optimizer(*b, g_selected);
  bench::add_collectives(*b, g_selected);
}

int run_selected(CLI::App&) { return g_selected ? g_selected() : 0; }

}  // namespace strata::cli
