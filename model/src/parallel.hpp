// A fork-join loop over the machine's cores for the model's element-wise passes and
// attention heads, on the threads of the model's matmul library:
//  - Forked (the fp32 model on OpenBLAS): OpenBLAS runs its sgemm on its own pthreads,
//    which cannot take other work; the loop forks threads of its own for each call.
//  - OpenMp (the 16-bit model, and the fp32 one where oneDNN's sgemm stands in for
//    OpenBLAS's, cpu_sgemm.hpp): oneDNN runs on OpenMP's team, whose idle threads spin for
//    a while after each matmul; the loop runs on that team, so the cores are not shared
//    between two sets of threads. Measured on GPT-2 small at 2 cores, a bf16 step takes
//    0.6 s (of 11) less than with forked threads, and an fp32 step 0.8 s (of 19) more
//    than with its forked threads (there OpenMP's team would compete with OpenBLAS's).
// A thread chooses with UseLoopThreads for the duration of a call.
#pragma once

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

namespace strata::detail {

// The threads the model computes on (its loops, and its matmuls' library), decided once
// per process by threads_for below from this process's environment.
unsigned model_threads();

// OMP_NUM_THREADS where it starts with a positive number (as OpenMP reads it); else the
// cores this process may run on (`affinity`, its CPU mask), shared among the ranks on its
// node when the launcher names how many there are (`local_ranks`: Open MPI's
// OMPI_COMM_WORLD_LOCAL_SIZE, MPICH's MPI_LOCALNRANKS) and left them every core (`affinity`
// equal to `online`, the machine's cores: not bound to some of them, where each has its
// own already). At least 1. Ranks that share cores and each run a thread per core fight
// over them: measured with 4 ranks on 2 cores (gpt.mpi.np4), OpenMP's spinning workers
// made the fp32 test 1.7x slower than OpenBLAS's threads did, where a thread per rank's
// share runs it 3-5x faster than either (docs/training.md).
unsigned threads_for(const char* omp_num_threads, unsigned affinity, unsigned online, const char* local_ranks);

enum class LoopThreads { Forked, OpenMp };

inline thread_local LoopThreads current_loop_threads = LoopThreads::Forked;

// Sets the calling thread's loop threads for its lifetime, and restores them after.
class UseLoopThreads {
 public:
  explicit UseLoopThreads(LoopThreads t) : saved_(current_loop_threads) { current_loop_threads = t; }
  ~UseLoopThreads() { current_loop_threads = saved_; }
  UseLoopThreads(const UseLoopThreads&) = delete;
  UseLoopThreads& operator=(const UseLoopThreads&) = delete;

 private:
  LoopThreads saved_;
};

// Sets the calling thread's OpenMP team size (the threads oneDNN runs on) for its lifetime,
// whatever the caller's OpenMP setting, and restores that after (parallel.cpp).
class OpenMpTeam {
 public:
  explicit OpenMpTeam(unsigned threads);
  ~OpenMpTeam();
  OpenMpTeam(const OpenMpTeam&) = delete;
  OpenMpTeam& operator=(const OpenMpTeam&) = delete;

 private:
  int saved_;
};

// Runs body(ctx, c) for c in [0, chunks) on `threads` of OpenMP's team (parallel.cpp, the
// one file compiled with OpenMP). body must not throw.
void run_on_openmp(long chunks, unsigned threads, void (*body)(void*, long), void* ctx);

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
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  // Chunk c, or nothing once a chunk has failed; the first failure is kept.
  auto chunk = [&](long c) {
    if (failed.load()) return;
    try {
      const long end = std::min(n, (c + 1) * grain);
      for (long i = c * grain; i < end; ++i) fn(i);
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
  };
  if (current_loop_threads == LoopThreads::OpenMp) {
    run_on_openmp(chunks, threads, [](void* ctx, long c) { (*static_cast<decltype(chunk)*>(ctx))(c); }, &chunk);
    if (error) std::rethrow_exception(error);
    return;
  }
  std::atomic<long> next{0};
  auto work = [&] {
    for (long c = next.fetch_add(1); c < chunks && !failed.load(); c = next.fetch_add(1)) chunk(c);
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace strata::detail
