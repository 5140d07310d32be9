// The checks every backend shares, the backend choice, and launcher detection.
#include "strata/collectives/communicator.hpp"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>

#include "mpi_communicator.hpp"
#include "self_communicator.hpp"

namespace strata::coll {

namespace {
std::atomic<double> g_collective_timeout{kDefaultCollectiveTimeout};
}  // namespace

void set_collective_timeout(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds))
    throw CollectiveUsageError("collective timeout " + std::to_string(seconds) +
                               " s: give a number of seconds >= 0 (0 turns the watchdog off)");
  g_collective_timeout.store(seconds);
}

double collective_timeout() { return g_collective_timeout.load(); }

const char* to_string(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "max"; }

const char* to_string(CommBackend b) {
  switch (b) {
    case CommBackend::Self: return "self";
    case CommBackend::Mpi: return "mpi";
    case CommBackend::Nccl: return "nccl";
    case CommBackend::Staged: return "staged";
    case CommBackend::Sim: return "sim";
  }
  return "?";
}

namespace {
std::string collective_message(const std::string& call, const std::string& op, int rank, int world,
                               long code, const std::string& detail) {
  std::ostringstream os;
  os << call << " failed on rank " << rank << " of " << world << " (" << op << "): " << detail << " (code "
     << code << ")";
  return os.str();
}

std::string describe(size_t count, DataType t) {
  return std::to_string(count) + " " + to_string(t);
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}
}  // namespace

CollectiveError::CollectiveError(const std::string& call, const std::string& op, int rank, int world,
                                 long code, const std::string& detail)
    : Error(collective_message(call, op, rank, world, code, detail)), code_(code), rank_(rank) {}

std::string Communicator::where(const char* op) const {
  return std::string(op) + " on rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (" +
         to_string(backend_) + "): ";
}

namespace {
void check_data(const std::string& where, const char* name, const void* p,
                size_t count) {
  if (p == nullptr && count > 0)
    throw CollectiveUsageError(where + name + " is null but holds " + std::to_string(count) + " elements");
}
void check_same_type(const std::string& where, DataType send, DataType recv) {
  if (send != recv)
    throw CollectiveUsageError(where + "send holds " + to_string(send) + " but recv holds " + to_string(recv) +
                               "; both must have one type");
}
}  // namespace

Event Communicator::all_gather(ConstView send, MutView recv, Event after) {
  const std::string w = where("all_gather");
  check_same_type(w, send.dtype(), recv.dtype());
  check_data(w, "send", send.data(), send.count());
  check_data(w, "recv", recv.data(), recv.count());
  const size_t n = send.count();
  if (recv.count() != n * static_cast<size_t>(size_))
    throw CollectiveUsageError(w + "recv holds " + describe(recv.count(), recv.dtype()) + ", expected send (" +
                               describe(n, send.dtype()) + ") x world size " + std::to_string(size_) + " = " +
                               describe(n * size_, send.dtype()));
  const size_t esz = size_of(send.dtype());
  const void* own_slice = static_cast<const char*>(recv.data()) + static_cast<size_t>(rank_) * n * esz;
  if (send.data() != own_slice && overlaps(send.data(), send.bytes(), recv.data(), recv.bytes()))
    throw CollectiveUsageError(w + "send overlaps recv; in place means send is exactly recv's slice " +
                               std::to_string(rank_) + " (elements " + std::to_string(rank_ * n) + ".." +
                               std::to_string((rank_ + 1) * n) + ")");
  return do_all_gather(send.data(), recv.data(), n, send.dtype(), std::move(after));
}

Event Communicator::reduce_scatter(ConstView send, MutView recv, ReduceOp op, Event after) {
  const std::string w = where("reduce_scatter");
  check_same_type(w, send.dtype(), recv.dtype());
  check_data(w, "send", send.data(), send.count());
  check_data(w, "recv", recv.data(), recv.count());
  const size_t n = recv.count();
  if (send.count() != n * static_cast<size_t>(size_))
    throw CollectiveUsageError(w + "send holds " + describe(send.count(), send.dtype()) + ", expected recv (" +
                               describe(n, recv.dtype()) + ") x world size " + std::to_string(size_) + " = " +
                               describe(n * size_, recv.dtype()));
  if (overlaps(send.data(), send.bytes(), recv.data(), recv.bytes()))
    throw CollectiveUsageError(w + "send and recv overlap; reduce_scatter needs separate buffers");
  return do_reduce_scatter(send.data(), recv.data(), n, send.dtype(), op, std::move(after));
}

namespace {
// send and recv: one type, valid, and as many elements (all_reduce, all_to_all).
void check_equal_buffers(const std::string& w, ConstView send, MutView recv) {
  check_same_type(w, send.dtype(), recv.dtype());
  check_data(w, "send", send.data(), send.count());
  check_data(w, "recv", recv.data(), recv.count());
  if (send.count() != recv.count())
    throw CollectiveUsageError(w + "send holds " + describe(send.count(), send.dtype()) + " but recv holds " +
                               describe(recv.count(), recv.dtype()) + "; they must match");
}
}  // namespace

Event Communicator::all_to_all(ConstView send, MutView recv, Event after) {
  const std::string w = where("all_to_all");
  check_equal_buffers(w, send, recv);
  if (send.count() % static_cast<size_t>(size_) != 0)
    throw CollectiveUsageError(w + "send holds " + describe(send.count(), send.dtype()) +
                               ", which is not a whole part for each of the " + std::to_string(size_) +
                               " ranks; give a multiple of the world size");
  if (overlaps(send.data(), send.bytes(), recv.data(), recv.bytes()))
    throw CollectiveUsageError(w + "send and recv overlap; all_to_all needs separate buffers");
  return do_all_to_all(send.data(), recv.data(), send.count() / static_cast<size_t>(size_), send.dtype(),
                       std::move(after));
}

Event Communicator::all_reduce(ConstView send, MutView recv, ReduceOp op, Event after) {
  const std::string w = where("all_reduce");
  check_equal_buffers(w, send, recv);
  if (send.data() != recv.data() && overlaps(send.data(), send.bytes(), recv.data(), recv.bytes()))
    throw CollectiveUsageError(w + "send and recv overlap without being the same buffer (in place)");
  return do_all_reduce(send.data(), recv.data(), send.count(), send.dtype(), op, std::move(after));
}

Event Communicator::all_reduce(MutView buf, ReduceOp op, Event after) {
  return all_reduce(ConstView(buf), buf, op, std::move(after));
}

Event Communicator::broadcast(MutView buf, int root, Event after) {
  const std::string w = where("broadcast");
  check_data(w, "buf", buf.data(), buf.count());
  if (root < 0 || root >= size_)
    throw CollectiveUsageError(w + "root " + std::to_string(root) + " is not a rank (0.." +
                               std::to_string(size_ - 1) + ")");
  return do_broadcast(buf.data(), buf.count(), buf.dtype(), root, std::move(after));
}

Event Communicator::barrier(Event after) { return do_barrier(std::move(after)); }

std::string detect_launcher() {
  // Set by mpirun (Open MPI), by hydra / srun --mpi=pmi2, and by PMIx launchers
  // (srun --mpi=pmix, prterun), for each launched process. SLURM_NTASKS alone is not
  // used: sbatch sets it for the batch script itself, which is not a launched rank.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return var;
  return "";
}

std::unique_ptr<Communicator> make_host_communicator(HostBackend which) {
  if (which == HostBackend::Auto)
    which = (!detect_launcher().empty() || detail::mpi_already_initialized()) ? HostBackend::Mpi
                                                                               : HostBackend::Self;
  if (which == HostBackend::Self) return detail::make_self_communicator();
  return detail::make_mpi_communicator();
}

}  // namespace strata::coll
