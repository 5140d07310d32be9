#include "strata/runtime/train/rank.hpp"

#include "strata/collectives/nccl.hpp"

namespace strata {

void RankContext::reset() {
  nccl.reset();
  device.reset();
  host_comm.reset();
}

RankContext open_rank(const Config& config) {
  RankContext r;
  coll::set_collective_timeout(config.strata.collective_timeout);
  r.host_comm = coll::make_host_communicator(coll::HostBackend::Auto);
  validate_for_world(config, r.host_comm->size());
  DeviceOptions d;
  d.backend = config.strata.backend;
  d.ordinal = d.backend == Backend::Cuda ? r.host_comm->local_rank() : 0;
  r.device_ordinal = d.ordinal;
  r.device = make_device(d);
  // Device buffers need a communicator that reads device memory: NCCL, even for one rank.
  if (d.backend == Backend::Cuda) r.nccl = coll::make_nccl_communicator(*r.host_comm, d.ordinal);
  return r;
}

}  // namespace strata
