// Private to core: page-aligned host memory for the pinned tier, shared by the cpu and
// cuda backends (Device::allocate_host).
#pragma once

#include <cstddef>

namespace strata::detail {

// mmap, bound to `numa_node` before first touch (when there is more than one node), and
// mlock'ed when `lock`; a refused mbind or mlock is warned about once and the memory is
// used as it is (touched up front when unlocked). Throws OutOfBudget when mmap fails.
void* map_host_memory(size_t bytes, int numa_node, bool lock, bool* locked);
void unmap_host_memory(void* p, size_t bytes);

}  // namespace strata::detail
