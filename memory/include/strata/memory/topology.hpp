// Machine topology from hwloc and libnuma: which NUMA node is nearest a device, and a
// one-line summary of the machine for reports.
#pragma once

#include <string>

#include "strata/core/device.hpp"

namespace strata {

// NUMA node nearest the device: the device's own answer when it has one (cuda), else
// the node hwloc reports for the CPU this thread runs on. -1 when unknown.
int nearest_numa_node(const Device& device);

struct MachineSummary {
  std::string cpu_model;
  int cores = 0;          // physical cores
  int threads = 0;        // logical processors
  int numa_nodes = 0;
  unsigned long long memory_bytes = 0;
  std::string gpus;       // hwloc's OS devices of GPU type, comma separated, or "none"
};
MachineSummary machine_summary();

}  // namespace strata
