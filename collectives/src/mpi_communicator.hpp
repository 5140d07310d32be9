// Private: the mpi backend's entry points for communicator.cpp.
#pragma once

#include <memory>

#include "strata/collectives/communicator.hpp"

namespace strata::coll::detail {
// True when MPI is initialized (by Strata or by the application). Never initializes it.
bool mpi_already_initialized();
std::unique_ptr<Communicator> make_mpi_communicator();
// MPI_Comm_split of an mpi communicator (topology.hpp's split). Collective over `comm`.
std::unique_ptr<Communicator> split_mpi_communicator(Communicator& comm, int color, int key);
}  // namespace strata::coll::detail
