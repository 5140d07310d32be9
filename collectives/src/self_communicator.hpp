// Private: the one-process communicator.
#pragma once

#include <memory>

#include "strata/collectives/communicator.hpp"

namespace strata::coll::detail {
std::unique_ptr<Communicator> make_self_communicator();
}
