// The sub-benchmarks of `strata bench`. Each add_* registers its subcommand (and its
// options) under `bench`, and sets `run` to its body when that subcommand is chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace strata::bench {

using Runner = std::function<int()>;

void add_io(CLI::App& bench, Runner& run);  // bench/bench_io.cpp
void add_optimizer(CLI::App& bench, Runner& run);  // bench/bench_optimizer.cpp
void add_collectives(CLI::App& bench, Runner& run);  // bench/bench_collectives.cpp
void add_copy(CLI::App& bench, Runner& run);  // bench/bench_copy.cpp
void add_capacity(CLI::App& bench, Runner& run);  // bench/bench_capacity.cpp
void add_step(CLI::App& bench, Runner& run);  // bench/bench_step.cpp

}  // namespace strata::bench
