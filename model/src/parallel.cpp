#include "parallel.hpp"

namespace strata::detail {

void run_on_openmp(long chunks, unsigned threads, void (*body)(void*, long), void* ctx) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(static_cast<int>(threads))
  for (long c = 0; c < chunks; ++c) body(ctx, c);
}

}  // namespace strata::detail
