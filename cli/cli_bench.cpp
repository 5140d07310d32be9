#include "strata/bench/commands.hpp"
#include "cli.hpp"

namespace strata::cli {

void add_bench(CLI::App& app) {
  auto* b = app.add_subcommand("bench", "Measure offload bandwidth against capacity, beside a reference tool");
  b->require_subcommand(1);
  bench::add_io(*b, selected());
  bench::add_optimizer(*b, selected());
  bench::add_collectives(*b, selected());
  bench::add_copy(*b, selected());
  bench::add_capacity(*b, selected());
  bench::add_step(*b, selected());
}

}  // namespace strata::cli
