#include "strata/memory/topology.hpp"

#include <hwloc.h>
#include <sched.h>

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
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(topo.t, o));) {
    if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_GPU || o->attr->osdev.type == HWLOC_OBJ_OSDEV_COPROC) {
      if (!gpus.empty()) gpus += ", ";
      gpus += o->name ? o->name : "gpu";
    }
  }
  m.gpus = gpus.empty() ? "none" : gpus;
  return m;
}

}  // namespace strata
