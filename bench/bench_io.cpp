// strata bench io: lands with the I/O engine (issue 2).
#include <cstdio>

#include "strata/bench/commands.hpp"

namespace strata::bench {

void add_io(CLI::App& bench, Runner& run) {
  auto* io = bench.add_subcommand("io", "NVMe read/write bandwidth through the io_uring engine, beside fio");
  io->callback([&run] {
    run = [] {
      std::fprintf(stderr, "strata bench io: the I/O engine is not built yet\n");
      return 1;
    };
  });
}

}  // namespace strata::bench
