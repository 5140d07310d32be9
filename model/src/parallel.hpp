// A fork-join loop over the machine's cores for the model's element-wise passes and
// attention heads. Matmuls are OpenBLAS's own threads; this is only for loops around them.
#pragma once

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

namespace strata::detail {

inline unsigned model_threads() {
  static const unsigned n = std::max(1u, std::thread::hardware_concurrency());
  return n;
}

// Calls fn(i) for i in [0, n), in chunks of `grain`, on up to model_threads() threads
// (the caller's included). The first exception is rethrown after all threads joined.
template <class Fn>
void parallel_for(long n, long grain, Fn&& fn) {
  if (n <= 0) return;
  grain = std::max(1L, grain);
  const long chunks = (n + grain - 1) / grain;
  const unsigned threads = static_cast<unsigned>(std::min<long>(model_threads(), chunks));
  if (threads <= 1) {
    for (long i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<long> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto work = [&] {
    try {
      for (;;) {
        const long c = next.fetch_add(1);
        if (c >= chunks || failed.load()) return;
        const long end = std::min(n, (c + 1) * grain);
        for (long i = c * grain; i < end; ++i) fn(i);
      }
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace strata::detail
