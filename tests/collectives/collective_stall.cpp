// A job with one late rank, for test_watchdog.py: every rank runs a few collectives, then
// rank `late` falls behind (stops itself with SIGSTOP, or stays busy outside collectives
// for `seconds`) while the others wait in the next collective. Exits 0 when the job
// finishes; the watchdog exits the waiting ranks with kCollectiveTimeoutExitCode first
// where the timeout is shorter than the delay.
//   mpirun -np N collective_stall OP {stop|busy} LATE_RANK SECONDS TIMEOUT
// OP: all_reduce, all_gather or barrier. TIMEOUT: seconds (strata.collective_timeout).
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "strata/collectives/communicator.hpp"

using namespace strata;

namespace {
void run(coll::Communicator& c, const std::string& op) {
  std::vector<float> a(1024, 1.0f), g(1024 * static_cast<size_t>(c.size()));
  if (op == "all_reduce")
    c.all_reduce(coll::MutView(a)).wait();
  else if (op == "all_gather")
    c.all_gather(std::span<const float>(a), coll::MutView(g)).wait();
  else if (op == "barrier")
    c.barrier().wait();
  else
    throw std::runtime_error("unknown op " + op);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: collective_stall OP {stop|busy} LATE_RANK SECONDS TIMEOUT\n");
    return 2;
  }
  const std::string op = argv[1], how = argv[2];
  const int late = std::atoi(argv[3]);
  const double seconds = std::atof(argv[4]);
  coll::set_collective_timeout(std::atof(argv[5]));
  auto comm = coll::make_host_communicator(coll::HostBackend::Mpi);
  for (int i = 0; i < 3; ++i) run(*comm, op);
  if (comm->rank() == late) {
    if (how == "stop")
      ::raise(SIGSTOP);  // continued (or killed) from outside
    else
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));  // the late rank's "work"
  }
  run(*comm, op);
  comm->barrier().wait();
  if (comm->rank() == 0) std::printf("job finished\n");
  return 0;
}
