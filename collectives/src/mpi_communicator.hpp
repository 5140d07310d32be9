// Private: the mpi backend's entry points for communicator.cpp.
#pragma once

#include <memory>

#include "strata/collectives/communicator.hpp"

namespace strata::coll::detail {
// True when MPI is initialized (by Strata or by the application). Never initializes it.
bool mpi_already_initialized();
std::unique_ptr<Communicator> make_mpi_communicator();
}  // namespace strata::coll::detail
