#include "strata/memory/topology.hpp"

#include <hwloc.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace strata {

namespace {
struct Topo {
  hwloc_topology_t t{};
  Topo() {
    hwloc_topology_init(&t);
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    hwloc_topology_load(t);
  }
  ~Topo() { hwloc_topology_destroy(t); }
};

// Whole disks from /sys/block, for machines where hwloc sees no block devices (virtual
// disks outside its PCI view). Loop, RAM, zram and device-mapper devices are left out.
std::vector<DiskInfo> sysfs_disks() {
  std::vector<DiskInfo> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/block", ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("loop") || name.starts_with("ram") || name.starts_with("zram") || name.starts_with("dm-"))
      continue;
    DiskInfo d;
    d.name = name;
    std::ifstream model(e.path() / "device" / "model");
    std::getline(model, d.model);
    while (!d.model.empty() && d.model.back() == ' ') d.model.pop_back();
    unsigned long long sectors = 0;  // of 512 bytes, whatever the disk's own sector size
    std::ifstream size(e.path() / "size");
    if (size >> sectors) d.bytes = sectors * 512;
    out.push_back(std::move(d));
  }
  std::sort(out.begin(), out.end(), [](const DiskInfo& a, const DiskInfo& b) { return a.name < b.name; });
  return out;
}
}  // namespace

int nearest_numa_node(const Device& device) {
  int node = device.numa_node();
  if (node >= 0) return node;
  Topo topo;
  hwloc_cpuset_t set = hwloc_bitmap_alloc();
  int result = -1;
  if (hwloc_get_last_cpu_location(topo.t, set, HWLOC_CPUBIND_THREAD) == 0) {
    hwloc_nodeset_t nodes = hwloc_bitmap_alloc();
    hwloc_cpuset_to_nodeset(topo.t, set, nodes);
    result = hwloc_bitmap_first(nodes);
    hwloc_bitmap_free(nodes);
  }
  hwloc_bitmap_free(set);
  return result;
}

MachineSummary machine_summary() {
  Topo topo;
  MachineSummary m;
  m.cores = hwloc_get_nbobjs_by_type(topo.t, HWLOC_OBJ_CORE);
  m.threads = hwloc_get_nbobjs_by_type(topo.t, HWLOC_OBJ_PU);
  m.numa_nodes = hwloc_get_nbobjs_by_type(topo.t, HWLOC_OBJ_NUMANODE);
  hwloc_obj_t root = hwloc_get_root_obj(topo.t);
  m.memory_bytes = root->total_memory;
  if (const char* model = hwloc_obj_get_info_by_name(hwloc_get_obj_by_type(topo.t, HWLOC_OBJ_PACKAGE, 0), "CPUModel"))
    m.cpu_model = model;
  std::string gpus;
  // One GPU shows up as several OS devices (cuda0, nvml0, opencl0d0, card0): list the
  // CUDA ones when there are any, else the NVML ones, else every GPU-like device.
  std::vector<GpuInfo> cuda, nvml, other;
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(topo.t, o));) {
    const auto type = o->attr->osdev.type;
    if (type == HWLOC_OBJ_OSDEV_GPU || type == HWLOC_OBJ_OSDEV_COPROC) {
      if (!gpus.empty()) gpus += ", ";
      gpus += o->name ? o->name : "gpu";
      GpuInfo g;
      g.name = o->name ? o->name : "gpu";
      if (const char* model = hwloc_obj_get_info_by_name(o, "GPUModel")) g.model = model;
      if (const char* kib = hwloc_obj_get_info_by_name(o, "CUDAGlobalMemorySize"))
        g.memory_bytes = std::strtoull(kib, nullptr, 10) * 1024;
      const char* backend = hwloc_obj_get_info_by_name(o, "Backend");
      const std::string b = backend ? backend : "";
      (b == "CUDA" ? cuda : b == "NVML" ? nvml : other).push_back(std::move(g));
    } else if (type == HWLOC_OBJ_OSDEV_BLOCK) {
      DiskInfo d;
      d.name = o->name ? o->name : "disk";
      if (const char* model = hwloc_obj_get_info_by_name(o, "Model")) d.model = model;
      if (const char* kib = hwloc_obj_get_info_by_name(o, "Size")) d.bytes = std::strtoull(kib, nullptr, 10) * 1024;
      m.disks.push_back(std::move(d));
    }
  }
  m.gpus = gpus.empty() ? "none" : gpus;
  m.gpu_list = !cuda.empty() ? cuda : !nvml.empty() ? nvml : other;
  if (m.disks.empty()) m.disks = sysfs_disks();
  for (auto& d : m.disks) {
    std::ifstream rot("/sys/block/" + d.name + "/queue/rotational");
    int r = -1;
    if (rot >> r) d.rotational = r;
  }
  return m;
}

}  // namespace strata
