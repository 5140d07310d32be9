// The sim backend's communicator (core/sim.hpp): one process plays rank `rank` of a
// symmetric data-parallel group of `world` ranks. Buffers are never touched. Each
// collective takes latency + the bytes a ring moves per rank over the bus bandwidth:
//   all_gather, reduce_scatter   (world-1)/world x the full buffer
//   all_reduce                   2 (world-1)/world x the buffer
//   broadcast                    the buffer;  barrier: latency only
// (nothing at all with one rank). Collectives run one at a time in call order on one
// lane ("collectives" in the trace), each after its `after` event and no earlier than
// the calling thread's now, and complete as sim events.
#pragma once

#include <memory>

#include "strata/collectives/communicator.hpp"
#include "strata/core/sim.hpp"

namespace strata::coll {

// Throws ConfigError when rank is not in [0, world) or a cost is not positive.
std::unique_ptr<Communicator> make_sim_communicator(int rank, int world, const SimCostModel& cost);

}  // namespace strata::coll
