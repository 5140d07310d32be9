#include "parallel.hpp"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>

namespace strata::detail {

namespace {

// The leading positive number of s ("4", "4,2"), or 0.
unsigned leading_count(const char* s) {
  if (!s) return 0;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  return end != s && v > 0 && v < 1 << 20 ? static_cast<unsigned>(v) : 0;
}

}  // namespace

unsigned threads_for(const char* omp_num_threads, unsigned affinity, unsigned online, const char* local_ranks) {
  if (const unsigned n = leading_count(omp_num_threads)) return n;
  const unsigned cores = std::max(1u, affinity);
  const unsigned ranks = leading_count(local_ranks);
  if (ranks > 1 && affinity >= online) return std::max(1u, cores / ranks);
  return cores;
}

unsigned model_threads() {
  static const unsigned n = [] {
    unsigned affinity = std::max(1u, std::thread::hardware_concurrency());
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) affinity = static_cast<unsigned>(CPU_COUNT(&set));
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!local) local = std::getenv("MPI_LOCALNRANKS");
    return threads_for(std::getenv("OMP_NUM_THREADS"), affinity, online > 0 ? static_cast<unsigned>(online) : affinity,
                       local);
  }();
  return n;
}

OpenMpTeam::OpenMpTeam(unsigned threads) : saved_(omp_get_max_threads()) {
  omp_set_num_threads(static_cast<int>(threads));
}

OpenMpTeam::~OpenMpTeam() { omp_set_num_threads(saved_); }

void run_on_openmp(long chunks, unsigned threads, void (*body)(void*, long), void* ctx) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(static_cast<int>(threads))
  for (long c = 0; c < chunks; ++c) body(ctx, c);
}

}  // namespace strata::detail
