// The nccl backend in a build without CUDA or NCCL: it says why it is missing.
#include "strata/collectives/nccl.hpp"

namespace strata::coll {

namespace {
const char* kReason = "Strata was built without the nccl backend (no CUDA compiler or no NCCL found at configure time)";
}

bool nccl_available(std::string* reason) {
  if (reason) *reason = kReason;
  return false;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int) { throw Unavailable(kReason); }

}  // namespace strata::coll
