// Machine topology from hwloc and libnuma: which NUMA node is nearest a device, and a
// one-line summary of the machine for reports.
#pragma once

#include <string>
#include <vector>

#include "strata/core/device.hpp"

namespace strata {

// NUMA node nearest the device: the device's own answer when it has one (cuda), else
// the node hwloc reports for the CPU this thread runs on. -1 when unknown.
int nearest_numa_node(const Device& device);

struct DiskInfo {
  std::string name;             // kernel name, e.g. "nvme0n1", "vda"
  std::string model;            // as hwloc (or sysfs) reports it; may be empty
  unsigned long long bytes = 0;  // capacity; 0 when unknown
  int rotational = -1;          // 1: spinning (or a virtual disk that says so), 0: not, -1: unknown
};

struct GpuInfo {
  std::string name;             // hwloc's OS device name, e.g. "cuda0", "nvidia0"
  std::string model;            // e.g. "NVIDIA H100 80GB HBM3"; may be empty
  unsigned long long memory_bytes = 0;  // 0 when hwloc does not say
};

struct MachineSummary {
  std::string cpu_model;
  int cores = 0;          // physical cores
  int threads = 0;        // logical processors
  int numa_nodes = 0;
  unsigned long long memory_bytes = 0;
  std::string gpus;       // hwloc's OS devices of GPU type, comma separated, or "none"
  // Block devices hwloc sees (whole disks; when it sees none, as in many VMs, those in
  // /sys/block other than loop, ram, zram and device-mapper devices).
  std::vector<DiskInfo> disks;
  // One entry per GPU: CUDA devices when hwloc's CUDA/NVML plugins see them, else every
  // OS device of GPU or co-processor type.
  std::vector<GpuInfo> gpu_list;
};
MachineSummary machine_summary();

}  // namespace strata
