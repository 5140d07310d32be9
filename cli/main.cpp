// The `strata` command line: train, bench, plan, export. Every failure becomes one clear
// message and a documented exit code (docs/failure-behaviour.md):
//   0 success, 1 runtime failure (I/O, corruption, a full tier), 2 bad input (config,
//   flags, files), 3 `strata plan`: it does not fit, 4 out of memory, 5 an unexpected
//   error (a bug in Strata), 100-127 command-line usage (CLI11's codes), 128 + N
//   `strata train` stopped by signal N after saving.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

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
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    const int rc = strata::cli::selected() ? strata::cli::selected()() : 0;
    // Standard output redirected to a full disk: what was printed is cut, and must not
    // pass for complete.
    const bool flushed = std::fflush(stdout) == 0;
    const int err = errno;
    if (!flushed || std::ferror(stdout)) {
      std::fprintf(stderr, "strata: error: writing standard output failed (%s): what it holds is incomplete; make "
                   "room where it is redirected, or redirect it elsewhere\n",
                   flushed ? "an earlier write failed" : std::strerror(err));
      return rc != 0 ? rc : 1;
    }
    return rc;
  } catch (const strata::ConfigError& e) {
    std::fprintf(stderr, "strata: configuration error: %s\n", e.what());
    return 2;
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "strata: out of memory: an allocation failed (std::bad_alloc); make the model, the "
                 "batch or the budgets smaller, or run where there is more memory\n");
    return 4;
  } catch (const std::exception& e) {
    // std::length_error, std::out_of_range, nlohmann::json's exceptions, ...: Strata
    // should have turned the cause into one of its own errors first.
    std::fprintf(stderr, "strata: unexpected error (a bug in Strata; please report it with the command line): %s\n",
                 e.what());
    return 5;
  } catch (...) {
    std::fprintf(stderr, "strata: unexpected error of unknown type (a bug in Strata; please report it with the "
                 "command line)\n");
    return 5;
  }
}
