#include "host_memory.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <numa.h>
#include <numaif.h>

#include "strata/core/error.hpp"
#include "strata/core/log.hpp"

namespace strata::detail {

void* map_host_memory(size_t bytes, int node, bool lock, bool* locked) {
  *locked = false;
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED)
    throw OutOfBudget("pinned pool: cannot map " + format_bytes(bytes) + ": " + std::strerror(errno) +
                      "; lower strata.pinned_budget");
  // Transparent huge pages, asked for before first touch: the pool is then physically
  // contiguous in 2 MiB runs, and an O_DIRECT request maps to a few segments instead of
  // hundreds of scattered 4 KiB pages (measured in docs/bench-io.md). Advice only: a
  // kernel without THP ignores it.
  madvise(base, bytes, MADV_HUGEPAGE);
  if (node >= 0 && numa_available() >= 0 && numa_max_node() > 0) {
    // Bind before first touch so pages land on the node nearest the device.
    unsigned long mask = 1UL << node;
    if (mbind(base, bytes, MPOL_BIND, &mask, sizeof(mask) * 8, 0) != 0)
      log::warn_once("pinned-mbind", std::string("pinned pool: mbind to NUMA node ") + std::to_string(node) +
                                         " refused (" + std::strerror(errno) + "); using the default policy");
  }
  if (lock) {
    if (mlock(base, bytes) == 0) {
      *locked = true;
    } else {
      log::warn_once("pinned-mlock",
                     "pinned pool: mlock of " + format_bytes(bytes) + " refused (" + std::strerror(errno) +
                         "); using unlocked memory (raise `ulimit -l` for locked pages)");
      // Touch the pages so later copies do not fault them in one by one.
      std::memset(base, 0, bytes);
    }
  }
  return base;
}

void unmap_host_memory(void* p, size_t bytes) {
  if (p) munmap(p, bytes);  // unlocks too
}

}  // namespace strata::detail
