// The collective watchdog (mpi_watchdog.hpp).
#include "mpi_watchdog.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "mpi_progress.hpp"
#include "strata/core/log.hpp"

namespace strata::coll::detail {

namespace {
constexpr int kQueryTag = 1;
constexpr int kAnswerTag = 2;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}
}  // namespace

void MpiWatchdog::start(int rank, int size) {
  rank_ = rank;
  size_ = size;
  if (size < 2) return;
  STRATA_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  STRATA_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  STRATA_CHECK_MPI(MPI_Irecv(&incoming_, 2, MPI_INT64_T, MPI_ANY_SOURCE, kQueryTag, comm_, &incoming_req_));
}

void MpiWatchdog::stop() {
  if (!active()) return;
  if (incoming_req_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&incoming_req_);
    MPI_Wait(&incoming_req_, MPI_STATUS_IGNORE);
  }
  // Answers to a rank that has gone may never complete: let MPI finish or drop them.
  for (Outgoing& o : outgoing_)
    if (o.req != MPI_REQUEST_NULL) MPI_Request_free(&o.req);
  outgoing_.clear();
  MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

WatchedOp MpiWatchdog::posted(uint64_t order, const OpDesc&) {
  return WatchedOp{order, ++started_[order], Clock::now()};
}

MpiWatchdog::Answer MpiWatchdog::answer_for(int64_t order, const WatchedOp* oldest, const OpDesc* desc) const {
  Answer a;
  a.order = order;
  auto it = started_.find(static_cast<uint64_t>(order));
  a.started = it == started_.end() ? 0 : static_cast<int64_t>(it->second);
  if (oldest != nullptr) {
    a.waiting_order = static_cast<int64_t>(oldest->order);
    a.waiting_number = static_cast<int64_t>(oldest->number);
    a.waited_s = seconds_since(oldest->since);
    std::snprintf(a.op, sizeof a.op, "%s", desc->op);
  }
  return a;
}

void MpiWatchdog::serve(const WatchedOp* oldest, const OpDesc* desc) {
  if (!active()) return;
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (incoming_req_ == MPI_REQUEST_NULL || MPI_Test(&incoming_req_, &flag, &st) != MPI_SUCCESS || !flag) break;
    outgoing_.push_back(Outgoing{answer_for(incoming_.order, oldest, desc), MPI_REQUEST_NULL});
    Outgoing& o = outgoing_.back();  // a deque keeps its elements in place as it grows
    if (MPI_Isend(&o.answer, sizeof(Answer), MPI_BYTE, st.MPI_SOURCE, kAnswerTag, comm_, &o.req) != MPI_SUCCESS)
      o.req = MPI_REQUEST_NULL;
    if (MPI_Irecv(&incoming_, 2, MPI_INT64_T, MPI_ANY_SOURCE, kQueryTag, comm_, &incoming_req_) != MPI_SUCCESS)
      incoming_req_ = MPI_REQUEST_NULL;  // no more queries are answered; the collectives go on
  }
  while (!outgoing_.empty()) {
    int flag = 1;
    if (outgoing_.front().req != MPI_REQUEST_NULL) MPI_Test(&outgoing_.front().req, &flag, MPI_STATUS_IGNORE);
    if (!flag) break;
    outgoing_.pop_front();
  }
}

void MpiWatchdog::check(const WatchedOp* oldest, const OpDesc* desc) {
  if (!active() || oldest == nullptr) return;
  const double timeout = collective_timeout();
  if (timeout <= 0 || seconds_since(oldest->since) < timeout) return;
  report_and_exit(*oldest, *desc, timeout);
}

std::string MpiWatchdog::describe_rank(int r, const Answer* a, const WatchedOp& stuck) const {
  std::ostringstream os;
  os << "  rank " << r << ": ";
  if (a == nullptr) {
    os << "did not answer: it is stopped, hung in a system call, or gone";
    return os.str();
  }
  os << "has not arrived: it has started " << a->started << " collective" << (a->started == 1 ? "" : "s")
     << " on communicator " << stuck.order << "; ";
  if (a->waiting_order < 0)
    os << "it is in no collective (busy, or stalled outside one)";
  else
    os << "it has waited " << fmt_seconds(a->waited_s) << " in " << a->op << " #" << a->waiting_number
       << " on communicator " << a->waiting_order;
  return os.str();
}

void MpiWatchdog::report_and_exit(const WatchedOp& stuck, const OpDesc& desc, double timeout) {
  // Ask every other rank where it is; answer theirs meanwhile (they time out too).
  const double grace = std::clamp(timeout, 1.0, 10.0);
  const Query q{static_cast<int64_t>(stuck.order), static_cast<int64_t>(stuck.number)};
  std::vector<Answer> answers(static_cast<size_t>(size_));
  std::vector<MPI_Request> sends, recvs(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  std::vector<char> answered(static_cast<size_t>(size_), 0);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request s = MPI_REQUEST_NULL;
    if (MPI_Isend(&q, 2, MPI_INT64_T, r, kQueryTag, comm_, &s) == MPI_SUCCESS) sends.push_back(s);
    MPI_Irecv(&answers[r], sizeof(Answer), MPI_BYTE, r, kAnswerTag, comm_, &recvs[r]);
  }
  const auto asked = Clock::now();
  int pending = size_ - 1;
  while (pending > 0 && seconds_since(asked) < grace) {
    serve(&stuck, &desc);
    for (int r = 0; r < size_; ++r) {
      int flag = 0;
      if (recvs[r] == MPI_REQUEST_NULL || MPI_Test(&recvs[r], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag)
        continue;
      answered[r] = 1;
      --pending;
    }
    // The others answer from their own progress threads within milliseconds; this is
    // the pace of asking again, not a stand-in for their work.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::ostringstream os;
  os << "collective timeout: rank " << rank_ << " of " << size_ << " has waited " << fmt_seconds(seconds_since(stuck.since))
     << " in " << desc.op;
  if (desc.count > 0) os << " of " << desc.count << " " << to_string(desc.dtype);
  os << " (collective #" << stuck.number
     << " on communicator " << stuck.order << ", " << desc.call << "), longer than strata.collective_timeout ("
     << fmt_seconds(timeout) << ").";
  std::vector<int> arrived;
  std::string behind;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const Answer* a = answered[r] ? &answers[r] : nullptr;
    if (a != nullptr && a->started >= q.number) {
      arrived.push_back(r);
      continue;
    }
    behind += "\n" + describe_rank(r, a, stuck);
  }
  os << "\nRanks that have not arrived (asked for " << fmt_seconds(grace) << "):" << (behind.empty() ? " none" : behind);
  arrived.push_back(rank_);
  std::sort(arrived.begin(), arrived.end());
  os << "\nRanks in it:";
  for (size_t i = 0; i < arrived.size(); ++i) os << (i ? ", " : " ") << arrived[i];
  os << "\nExiting with code " << kCollectiveTimeoutExitCode
     << ". Checkpoints saved before are complete: resume from the last one. Fix: find why the ranks above fell "
        "behind (a stopped process, a failed node, a full or slow disk); if they are only slow, raise "
        "strata.collective_timeout (seconds; 0 waits forever).";
  log::error(os.str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(kCollectiveTimeoutExitCode);
}

}  // namespace strata::coll::detail
