// The MPI progress thread: initializes MPI, posts operations in order, drives them to
// completion and completes their events. See mpi_backend.hpp for the design.
#include "mpi_progress.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "strata/core/error.hpp"
#include "strata/core/log.hpp"

namespace strata::coll::detail {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(buf, static_cast<size_t>(len));
}

namespace {

using Clock = std::chrono::steady_clock;

// Polling policy while operations are in flight (see mpi_backend.hpp). After the last
// post or completion the thread polls hot (MPI_Testsome, then yield) for a window long
// enough for the bytes in flight to move at a modest 1 GB/s, plus kHotWindowBase; a
// transfer needs this, since Open MPI moves shared-memory fragments only inside our
// progress calls. Past the window the ranks are most likely waiting for a late peer,
// so the thread sleeps, doubling from kMinSleep to kMaxSleep between polls (about 10%
// of a core), and to kMaxSleepLong once the wait has lasted kLongWait (about 1%):
// a peer that is that late will hardly notice another millisecond.
constexpr auto kHotWindowBase = std::chrono::microseconds(200);
constexpr double kHotBytesPerNs = 1.0;
constexpr auto kMinSleep = std::chrono::microseconds(5);
constexpr auto kMaxSleep = std::chrono::microseconds(100);
constexpr auto kLongWait = std::chrono::milliseconds(10);
constexpr auto kMaxSleepLong = std::chrono::microseconds(1000);
// With nothing in flight the thread still wakes this often to answer the watchdog's
// queries of other ranks (where the world has more than one rank).
constexpr auto kIdleWatch = std::chrono::milliseconds(100);

// Reductions of 16-bit floats: MPI has no such type, so the backend registers two
// 2-byte datatypes and these operations for them, which widen to float and round back.
MPI_Datatype g_bf16 = MPI_DATATYPE_NULL;
MPI_Datatype g_fp16 = MPI_DATATYPE_NULL;

template <class H, class Convert, class Back, class Combine>
void reduce16(void* in, void* inout, int len, Convert to_f, Back from_f, Combine combine) {
  const auto* a = static_cast<const H*>(in);
  auto* b = static_cast<H*>(inout);
  for (int i = 0; i < len; ++i) b[i] = from_f(combine(to_f(a[i]), to_f(b[i])));
}

template <class Combine>
void reduce16_any(void* in, void* inout, int* len, MPI_Datatype* dt, Combine combine) {
  if (*dt == g_bf16)
    reduce16<Bf16>(in, inout, *len, [](Bf16 h) { return to_float(h); }, [](float f) { return to_bf16(f); },
                   combine);
  else if (*dt == g_fp16)
    reduce16<Fp16>(in, inout, *len, [](Fp16 h) { return to_float(h); }, [](float f) { return to_fp16(f); },
                   combine);
  else
    STRATA_CHECK(false, "16-bit reduction called with a datatype that is neither bf16 nor fp16");
}

void sum16(void* in, void* inout, int* len, MPI_Datatype* dt) {
  reduce16_any(in, inout, len, dt, [](float x, float y) { return x + y; });
}
void max16(void* in, void* inout, int* len, MPI_Datatype* dt) {
  // NaN wins, as with the built-in MPI_MAX on floats in practice and with NCCL.
  reduce16_any(in, inout, len, dt, [](float x, float y) { return (x != x || x > y) ? x : y; });
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

}  // namespace

MpiProgress& MpiProgress::instance() {
  // Constructed on first use, so that nothing touches MPI until a communicator is
  // made; destroyed (MPI finalized) at exit, after every communicator made later.
  static MpiProgress p;
  return p;
}

MpiProgress::MpiProgress() {
  thread_ = std::thread([this] { thread_main(); });
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return init_done_; });
  if (init_error_) {
    lock.unlock();
    thread_.join();
    std::rethrow_exception(init_error_);
  }
}

MpiProgress::~MpiProgress() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t MpiProgress::new_order_key() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_order_++;
}

MPI_Datatype MpiProgress::datatype(DataType t) const {
  switch (t) {
    case DataType::U8: return MPI_UINT8_T;
    case DataType::I32: return MPI_INT32_T;
    case DataType::I64: return MPI_INT64_T;
    case DataType::F16: return fp16_;
    case DataType::BF16: return bf16_;
    case DataType::F32: return MPI_FLOAT;
    case DataType::F64: return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op MpiProgress::reduce_op(ReduceOp op, DataType t) const {
  const bool half = t == DataType::F16 || t == DataType::BF16;
  if (op == ReduceOp::Sum) return half ? sum16_ : MPI_SUM;
  return half ? max16_ : MPI_MAX;
}

Event MpiProgress::submit(Op op) {
  auto [ev, done] = HostEvent::make();
  // A host dependency wakes the thread when it completes; others are polled. The copy
  // keeps it alive here: once queued, the progress thread may run the operation and drop
  // its own reference (the only one, for an event recorded just for this call) before
  // then() below is reached.
  const Event after = op.after;
  auto* dep = dynamic_cast<HostEvent*>(after.impl());
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming_.push_back(Pending{std::move(op), done});
  }
  cv_.notify_one();
  if (dep != nullptr) dep->then([this](std::exception_ptr) { wake(); });
  return ev;
}

void MpiProgress::wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    kick_ = true;
  }
  cv_.notify_one();
}

std::exception_ptr MpiProgress::error_for(const OpDesc& d, int code) const {
  std::string what = std::string(d.op) + " of " + std::to_string(d.count) + " " + to_string(d.dtype);
  return std::make_exception_ptr(
      CollectiveError(d.call, what, world_.rank, world_.size, code, mpi_error_string(code)));
}

void MpiProgress::init_mpi() {
  int initialized = 0, finalized = 0;
  STRATA_CHECK_MPI(MPI_Initialized(&initialized));
  STRATA_CHECK_MPI(MPI_Finalized(&finalized));
  if (finalized) throw Unavailable("MPI was already finalized in this process; no MPI communicator can be made");
  if (initialized) {
    STRATA_CHECK_MPI(MPI_Query_thread(&info_.thread_level));
    if (info_.thread_level != MPI_THREAD_MULTIPLE)
      throw Unavailable(std::string("MPI was initialized by the application with ") +
                        thread_level_name(info_.thread_level) +
                        "; Strata calls MPI from its own thread and needs MPI_THREAD_MULTIPLE: initialize "
                        "with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let Strata initialize MPI");
    info_.initialized_here = false;
  } else {
    // This thread makes every MPI call Strata makes, so FUNNELED would do; MULTIPLE,
    // when given, also lets the application call MPI from its own threads.
    STRATA_CHECK_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &info_.thread_level));
    info_.initialized_here = true;
    // Errors of non-blocking collectives surface in MPI_Testsome and are raised on
    // MPI_COMM_WORLD's handler (Open MPI), not the request's communicator: make them
    // returned there too, so that they become CollectiveErrors rather than aborts.
    STRATA_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    if (info_.thread_level < MPI_THREAD_FUNNELED)
      log::warn(std::string("MPI provided only ") + thread_level_name(info_.thread_level) +
                "; Strata calls MPI from one thread only, which works with common MPI libraries");
  }
  STRATA_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_.rank));
  STRATA_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world_.size));
  set_process_rank(world_.rank);
  MPI_Comm local;
  STRATA_CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_.rank, MPI_INFO_NULL, &local));
  STRATA_CHECK_MPI(MPI_Comm_rank(local, &world_.local_rank));
  STRATA_CHECK_MPI(MPI_Comm_size(local, &world_.local_size));
  STRATA_CHECK_MPI(MPI_Comm_free(&local));

  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  STRATA_CHECK_MPI(MPI_Get_library_version(version, &len));
  info_.library.assign(version, static_cast<size_t>(len));
  if (auto nl = info_.library.find('\n'); nl != std::string::npos) info_.library.resize(nl);
  if (auto comma = info_.library.find(','); comma != std::string::npos) info_.library.resize(comma);

  STRATA_CHECK_MPI(MPI_Type_contiguous(2, MPI_BYTE, &bf16_));
  STRATA_CHECK_MPI(MPI_Type_commit(&bf16_));
  STRATA_CHECK_MPI(MPI_Type_contiguous(2, MPI_BYTE, &fp16_));
  STRATA_CHECK_MPI(MPI_Type_commit(&fp16_));
  g_bf16 = bf16_;
  g_fp16 = fp16_;
  STRATA_CHECK_MPI(MPI_Op_create(&sum16, 1, &sum16_));
  STRATA_CHECK_MPI(MPI_Op_create(&max16, 1, &max16_));
  watchdog_.start(world_.rank, world_.size);
}

void MpiProgress::finalize_mpi() {
  watchdog_.stop();
  STRATA_CHECK_MPI(MPI_Op_free(&sum16_));
  STRATA_CHECK_MPI(MPI_Op_free(&max16_));
  STRATA_CHECK_MPI(MPI_Type_free(&bf16_));
  STRATA_CHECK_MPI(MPI_Type_free(&fp16_));
  if (info_.initialized_here) STRATA_CHECK_MPI(MPI_Finalize());
}

// Posts every pending op whose turn has come: its dependency is complete and no
// earlier op with its order key is still waiting. Returns whether anything was posted.
bool MpiProgress::post_ready(std::deque<Pending>& pending, std::vector<MPI_Request>& reqs,
                             std::vector<Active>& active) {
  bool posted = false;
  std::vector<uint64_t> blocked;
  for (auto it = pending.begin(); it != pending.end();) {
    const uint64_t key = it->op.order;
    if (std::find(blocked.begin(), blocked.end(), key) != blocked.end() || !it->op.after.ready()) {
      blocked.push_back(key);
      ++it;
      continue;
    }
    Pending p = std::move(*it);
    it = pending.erase(it);
    posted = true;
    // A failed dependency still posts the op, so that the other ranks do not hang.
    std::exception_ptr dep_error;
    try {
      p.op.after.wait();
    } catch (...) {
      dep_error = std::current_exception();
    }
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS;
    // Numbered whether or not it completes at once: every rank numbers the same ops.
    const WatchedOp watched = watchdog_.posted(p.op.order, p.op.desc);
    try {
      rc = p.op.post(&req);
    } catch (...) {
      p.done->complete(std::current_exception());
      continue;
    }
    if (rc != MPI_SUCCESS) {
      p.done->complete(dep_error ? dep_error : error_for(p.op.desc, rc));
    } else if (req == MPI_REQUEST_NULL) {
      p.done->complete(dep_error);
    } else {
      reqs.push_back(req);
      active.push_back(Active{std::move(p.done), p.op.desc, dep_error, p.op.bytes, watched});
    }
  }
  return posted;
}

// Drives the active requests once; completes the events of those that finished.
bool MpiProgress::test_active(std::vector<MPI_Request>& reqs, std::vector<Active>& active) {
  if (reqs.empty()) return false;
  const int n = static_cast<int>(reqs.size());
  thread_local std::vector<int> indices;
  thread_local std::vector<MPI_Status> statuses;
  indices.resize(reqs.size());
  statuses.resize(reqs.size());
  int outcount = 0;
  const int rc = MPI_Testsome(n, reqs.data(), &outcount, indices.data(), statuses.data());
  std::vector<std::pair<std::shared_ptr<HostEvent>, std::exception_ptr>> finished;
  if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
    // No per-request answer: every active op is failed; their requests are abandoned.
    for (auto& a : active) {
      OpDesc d = a.desc;
      d.call = "MPI_Testsome";
      finished.emplace_back(std::move(a.done), a.dependency_error ? a.dependency_error : error_for(d, rc));
    }
    reqs.clear();
    active.clear();
  } else if (outcount != MPI_UNDEFINED && outcount > 0) {
    for (int k = 0; k < outcount; ++k) {
      const int i = indices[k];
      const int err = rc == MPI_ERR_IN_STATUS ? statuses[k].MPI_ERROR : MPI_SUCCESS;
      Active& a = active[i];
      std::exception_ptr e = a.dependency_error;
      if (!e && err != MPI_SUCCESS) e = error_for(a.desc, err);
      finished.emplace_back(std::move(a.done), e);
      reqs[i] = MPI_REQUEST_NULL;  // MPI has done so already for successes; errors too
    }
    size_t w = 0;
    for (size_t r = 0; r < reqs.size(); ++r) {
      if (!active[r].done) continue;  // finished above
      reqs[w] = reqs[r];
      active[w] = std::move(active[r]);
      ++w;
    }
    reqs.resize(w);
    active.resize(w);
  }
  // Completion runs callbacks, which may submit more work: no lock is held here.
  for (auto& [done, err] : finished) done->complete(err);
  return !finished.empty();
}

void MpiProgress::watch(const std::vector<Active>& active) {
  if (!watchdog_.active()) return;
  const Active* oldest = nullptr;
  for (const Active& a : active)
    if (oldest == nullptr || a.watched.since < oldest->watched.since) oldest = &a;
  watchdog_.serve(oldest ? &oldest->watched : nullptr, oldest ? &oldest->desc : nullptr);
  watchdog_.check(oldest ? &oldest->watched : nullptr, oldest ? &oldest->desc : nullptr);
}

void MpiProgress::thread_main() {
  try {
    init_mpi();
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    init_error_ = std::current_exception();
    init_done_ = true;
    cv_.notify_all();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    init_done_ = true;
  }
  cv_.notify_all();

  std::deque<Pending> pending;
  std::vector<MPI_Request> reqs;
  std::vector<Active> active;
  auto last_progress = Clock::now();
  auto sleep = kMinSleep;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!incoming_.empty()) {
        pending.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
      kick_ = false;
    }
    bool progressed = post_ready(pending, reqs, active);
    progressed = test_active(reqs, active) || progressed;
    const auto now = Clock::now();
    if (progressed) {
      last_progress = now;
      sleep = kMinSleep;
      continue;
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (!incoming_.empty() || kick_) continue;
    if (pending.empty() && active.empty()) {
      lock.unlock();
      watch(active);
      lock.lock();
      if (!incoming_.empty() || kick_) continue;
      if (stop_) break;
      // The watchdog answers other ranks' queries while this rank has nothing in flight.
      if (watchdog_.active())
        cv_.wait_for(lock, kIdleWatch, [&] { return !incoming_.empty() || kick_ || stop_; });
      else
        cv_.wait(lock, [&] { return !incoming_.empty() || kick_ || stop_; });
      continue;
    }
    size_t bytes = 0;
    for (const auto& a : active) bytes += a.bytes;
    const auto hot = kHotWindowBase + std::chrono::nanoseconds(static_cast<int64_t>(bytes / kHotBytesPerNs));
    if (now - last_progress < hot && !active.empty()) {
      lock.unlock();
      std::this_thread::yield();
      continue;
    }
    // Past the hot window: the watchdog's turn (not on every spin of the hot poll).
    lock.unlock();
    watch(active);
    lock.lock();
    cv_.wait_for(lock, sleep, [&] { return !incoming_.empty() || kick_; });
    sleep = std::min<std::chrono::microseconds>(sleep * 2, now - last_progress < kLongWait ? kMaxSleep : kMaxSleepLong);
  }
  finalize_mpi();
}

}  // namespace strata::coll::detail
