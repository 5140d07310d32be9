// The mpi backend's communicator: an MPI_Comm_dup of MPI_COMM_WORLD (or a split of one)
// whose operations run on the MPI progress thread (mpi_progress.cpp).
#include "mpi_communicator.hpp"

#include <climits>

#include "mpi_progress.hpp"

namespace strata::coll {

namespace detail {

namespace {

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MpiProgress& mp, MPI_Comm comm)
      : MpiCommunicator(mp, comm, Shape{mp.world().rank, mp.world().size, mp.world().local_rank,
                                        mp.world().local_size, CommBackend::Mpi}) {}
  MpiCommunicator(MpiProgress& mp, MPI_Comm comm, const Shape& shape)
      : Communicator(shape),
        mp_(mp),
        comm_(comm),
        order_(mp.new_order_key()),
        inflight_(std::make_shared<Inflight>()) {}

  ~MpiCommunicator() override {
    {
      std::unique_lock<std::mutex> lock(inflight_->mu);
      inflight_->cv.wait(lock, [&] { return inflight_->count == 0; });
    }
    MPI_Comm c = comm_;
    mp_.submit({order_, {"MPI_Comm_free", "destroy communicator", 0, DataType::U8},
                [c](MPI_Request*) mutable { return MPI_Comm_free(&c); }, {}, 0})
        .wait();
  }

  Event run_native(std::function<void(MPI_Comm)> fn, Event after) {
    MPI_Comm c = comm_;
    return submit({"(run_on_mpi_thread)", "run_on_mpi_thread", 0, DataType::U8},
                  [c, fn = std::move(fn)](MPI_Request*) {
                    fn(c);
                    return MPI_SUCCESS;
                  },
                  std::move(after), 0);
  }

  // MPI_Comm_split, in this communicator's call order, then the new one's rank, size
  // and ranks on this host.
  std::unique_ptr<Communicator> split(int color, int key) {
    MPI_Comm parent = comm_, out = MPI_COMM_NULL;
    Shape s;
    s.backend = CommBackend::Mpi;
    submit({"MPI_Comm_split", "split communicator", 0, DataType::U8},
           [&](MPI_Request*) {
             int rc = MPI_Comm_split(parent, color, key, &out);
             if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
             if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(out, &s.rank);
             if (rc == MPI_SUCCESS) rc = MPI_Comm_size(out, &s.size);
             MPI_Comm local = MPI_COMM_NULL;
             if (rc == MPI_SUCCESS)
               rc = MPI_Comm_split_type(out, MPI_COMM_TYPE_SHARED, s.rank, MPI_INFO_NULL, &local);
             if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(local, &s.local_rank);
             if (rc == MPI_SUCCESS) rc = MPI_Comm_size(local, &s.local_size);
             if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
             return rc;
           },
           {}, 0)
        .wait();
    return std::make_unique<MpiCommunicator>(mp_, out, s);
  }

 protected:
  Event do_all_gather(const void* send, void* recv, size_t count, DataType t, Event after) override {
    const int n = int_count(count, "all_gather");
    const bool in_place = send == static_cast<const char*>(recv) + static_cast<size_t>(rank()) * count * size_of(t);
    MPI_Datatype dt = mp_.datatype(t);
    MPI_Comm c = comm_;
    return submit({"MPI_Iallgather", "all_gather", count, t},
                  [=](MPI_Request* r) {
                    return MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, dt, recv, n, dt, c, r);
                  },
                  std::move(after), count * size_of(t) * static_cast<size_t>(size()));
  }

  Event do_reduce_scatter(const void* send, void* recv, size_t count, DataType t, ReduceOp op,
                          Event after) override {
    const int n = int_count(count, "reduce_scatter");
    MPI_Datatype dt = mp_.datatype(t);
    MPI_Op mop = mp_.reduce_op(op, t);
    MPI_Comm c = comm_;
    return submit({"MPI_Ireduce_scatter_block", "reduce_scatter", count, t},
                  [=](MPI_Request* r) { return MPI_Ireduce_scatter_block(send, recv, n, dt, mop, c, r); },
                  std::move(after), count * size_of(t) * static_cast<size_t>(size()));
  }

  Event do_all_reduce(const void* send, void* recv, size_t count, DataType t, ReduceOp op,
                      Event after) override {
    const int n = int_count(count, "all_reduce");
    MPI_Datatype dt = mp_.datatype(t);
    MPI_Op mop = mp_.reduce_op(op, t);
    MPI_Comm c = comm_;
    const bool in_place = send == recv;
    return submit({"MPI_Iallreduce", "all_reduce", count, t},
                  [=](MPI_Request* r) { return MPI_Iallreduce(in_place ? MPI_IN_PLACE : send, recv, n, dt, mop, c, r); },
                  std::move(after), 2 * count * size_of(t));
  }

  Event do_broadcast(void* buf, size_t count, DataType t, int root, Event after) override {
    const int n = int_count(count, "broadcast");
    MPI_Datatype dt = mp_.datatype(t);
    MPI_Comm c = comm_;
    return submit({"MPI_Ibcast", "broadcast", count, t},
                  [=](MPI_Request* r) { return MPI_Ibcast(buf, n, dt, root, c, r); }, std::move(after),
                  count * size_of(t));
  }

  Event do_all_to_all(const void* send, void* recv, size_t count, DataType t, Event after) override {
    const int n = int_count(count, "all_to_all");
    MPI_Datatype dt = mp_.datatype(t);
    MPI_Comm c = comm_;
    return submit({"MPI_Ialltoall", "all_to_all", count, t},
                  [=](MPI_Request* r) { return MPI_Ialltoall(send, n, dt, recv, n, dt, c, r); }, std::move(after),
                  count * size_of(t) * static_cast<size_t>(size()));
  }

  Event do_barrier(Event after) override {
    MPI_Comm c = comm_;
    return submit({"MPI_Ibarrier", "barrier", 0, DataType::U8}, [=](MPI_Request* r) { return MPI_Ibarrier(c, r); },
                  std::move(after), 0);
  }

 private:
  struct Inflight {
    std::mutex mu;
    std::condition_variable cv;
    size_t count = 0;
  };

  // MPI counts are int: a larger collective must be cut into pieces by the caller.
  int int_count(size_t count, const char* op) const {
    if (count > static_cast<size_t>(INT_MAX))
      throw CollectiveUsageError(where(op) + std::to_string(count) +
                                 " elements exceed the MPI backend's limit of INT_MAX per rank; cut the "
                                 "buffer into several collectives");
    return static_cast<int>(count);
  }

  Event submit(OpDesc desc, std::function<int(MPI_Request*)> post, Event after, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(inflight_->mu);
      ++inflight_->count;
    }
    Event ev = mp_.submit({order_, desc, std::move(post), std::move(after), bytes});
    static_cast<HostEvent*>(ev.impl())->then([inflight = inflight_](std::exception_ptr) {
      std::lock_guard<std::mutex> lock(inflight->mu);
      if (--inflight->count == 0) inflight->cv.notify_all();
    });
    return ev;
  }

  MpiProgress& mp_;
  MPI_Comm comm_;
  uint64_t order_;  // keeps this communicator's operations in call order
  std::shared_ptr<Inflight> inflight_;
};

}  // namespace

bool mpi_already_initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

std::unique_ptr<Communicator> make_mpi_communicator() {
  MpiProgress& mp = MpiProgress::instance();
  MPI_Comm comm = MPI_COMM_NULL;
  // Order key 0: setup work on MPI_COMM_WORLD, in call order like everything else.
  mp.submit({0, {"MPI_Comm_dup", "create communicator", 0, DataType::U8},
             [&comm](MPI_Request*) {
               int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
               if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
               return rc;
             },
             {}, 0})
      .wait();
  return std::make_unique<MpiCommunicator>(mp, comm);
}

std::unique_ptr<Communicator> split_mpi_communicator(Communicator& comm, int color, int key) {
  auto* mc = dynamic_cast<MpiCommunicator*>(&comm);
  if (mc == nullptr)
    throw CollectiveUsageError(std::string("split_mpi_communicator needs an mpi communicator, not a ") +
                               to_string(comm.backend()) + " one");
  return mc->split(color, key);
}

}  // namespace detail

MpiInfo mpi_info() { return detail::MpiProgress::instance().info(); }

Event run_on_mpi_thread(Communicator& comm, std::function<void(MPI_Comm)> fn, Event after) {
  auto* mc = dynamic_cast<detail::MpiCommunicator*>(&comm);
  if (mc == nullptr)
    throw CollectiveUsageError(std::string("run_on_mpi_thread needs an mpi communicator, not a ") +
                               to_string(comm.backend()) + " one");
  return mc->run_native(std::move(fn), std::move(after));
}

}  // namespace strata::coll
