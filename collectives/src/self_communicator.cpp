// The `self` backend: world size 1, for a process started without a launcher.
//
// Why not an MPI singleton: Open MPI 4's singleton init forks an orted daemon, which
// costs a few tenths of a second and fails in sandboxes that forbid it or have no
// usable network interface; a one-process run gains nothing from MPI. With one rank
// every collective is a copy (or nothing, in place), so this backend is exact.
// HostBackend::Mpi still gives a singleton when one is wanted.
//
// Operations run on the calling thread: `after` is waited for there, then the copy is
// made, and the returned event is already complete (failed with after's error, if any).
#include "self_communicator.hpp"

#include <cstring>

namespace strata::coll::detail {

namespace {

class SelfCommunicator final : public Communicator {
 public:
  SelfCommunicator() : Communicator(Shape{0, 1, 0, 1, CommBackend::Self}) {}

 protected:
  Event do_all_gather(const void* send, void* recv, size_t count, DataType t, Event after) override {
    return run(after, [&] { copy(recv, send, count * size_of(t)); });
  }
  Event do_reduce_scatter(const void* send, void* recv, size_t count, DataType t, ReduceOp,
                          Event after) override {
    return run(after, [&] { copy(recv, send, count * size_of(t)); });
  }
  Event do_all_reduce(const void* send, void* recv, size_t count, DataType t, ReduceOp, Event after) override {
    return run(after, [&] { copy(recv, send, count * size_of(t)); });
  }
  Event do_broadcast(void*, size_t, DataType, int, Event after) override {
    return run(after, [] {});
  }
  Event do_barrier(Event after) override { return run(after, [] {}); }
  Event do_all_to_all(const void* send, void* recv, size_t count, DataType t, Event after) override {
    return run(after, [&] { copy(recv, send, count * size_of(t)); });
  }

 private:
  static void copy(void* dst, const void* src, size_t bytes) {
    if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
  }
  template <class F>
  static Event run(const Event& after, F&& body) {
    std::exception_ptr err;
    try {
      after.wait();
    } catch (...) {
      err = std::current_exception();
    }
    body();  // runs even when `after` failed, as on every backend
    if (!err) return Event();
    auto [ev, host] = HostEvent::make();
    host->complete(err);
    return ev;
  }
};

}  // namespace

std::unique_ptr<Communicator> make_self_communicator() { return std::make_unique<SelfCommunicator>(); }

}  // namespace strata::coll::detail
