// The `strata` command line: train, bench, plan. Every recoverable error becomes one
// clear message and exit code 2 (bad input) or 1 (runtime failure).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "strata/core/error.hpp"
#include "cli.hpp"

namespace strata::cli {
Runner& selected() {
  static Runner r;
  return r;
}
}  // namespace strata::cli

int main(int argc, char** argv) {
  CLI::App app{"Strata: ZeRO-3 training with tiered offload (device, pinned host, NVMe)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata 0.1.0");
  strata::cli::add_bench(app);
  strata::cli::add_train(app);
  strata::cli::add_plan(app);
  strata::cli::add_export(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return strata::cli::selected() ? strata::cli::selected()() : 0;
  } catch (const strata::ConfigError& e) {
    std::fprintf(stderr, "strata: configuration error: %s\n", e.what());
    return 2;
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 1;
  }
}
