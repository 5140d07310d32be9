// strata bench collectives: all_gather and reduce_scatter bus bandwidth against
// message size, laid out as nccl-tests lays it out, beside a reference.
//
//   mpirun -np 2 strata bench collectives [--min-bytes 1K --max-bytes 64M --iters 20]
//
// Sizes follow nccl-tests: `size` is the bytes of the whole buffer (all_gather's
// output, reduce_scatter's input), `count` its elements; each rank holds size/n.
// algbw = size / time and busbw = algbw * (n-1)/n for both collectives (the bytes each
// rank must receive, over the time). `time` is the mean per operation over --iters
// back-to-back operations, each waited for before the next is called, on the slowest
// rank. `#wrong` counts elements that differ from the exact expected result in a
// checked run before the timed ones.
//
// References (mpi backend), timed on the MPI thread itself: the same collective as one
// blocking MPI call (MPI_Allgather, MPI_Reduce_scatter_block: `ref`), and as the
// non-blocking call Strata posts followed at once by MPI_Wait (`ref-nb`). Strata
// against ref-nb is what Strata's queue, progress thread and events cost; ref-nb
// against ref is what Open MPI's non-blocking algorithms cost against its blocking ones.
//
// Scopes (--scope): `world`, all ranks in one collective; `node`, the ranks of each node
// together (every node at once, as a hybrid layout's gathers within the node run); and
// `cross`, the ranks with the same index on every node (every index at once, one rank a
// node: the traffic that crosses the network in a hierarchical collective). Nodes are the
// launcher's hosts, or --ranks-per-node consecutive ranks (topology.hpp).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/bench/commands.hpp"
#include "strata/bench/report.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/collectives/mpi_backend.hpp"
#include "strata/collectives/nccl.hpp"
#include "strata/collectives/topology.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"

namespace strata::bench {

namespace {

using Clock = std::chrono::steady_clock;

struct CollectivesOptions {
  std::string backend = "mpi";  // mpi (host buffers) | nccl (device buffers)
  uint64_t min_bytes = 1024;
  uint64_t max_bytes = uint64_t{64} << 20;
  unsigned step_factor = 2;
  unsigned iters = 20;
  unsigned warmup = 5;
  bool reference = true;
  std::vector<std::string> scopes{"world"};  // world | node | cross
  int ranks_per_node = 0;                    // 0: the launcher's
  OutputOptions out;
};

enum class Collective { AllGather, ReduceScatter };
const char* name_of(Collective c) { return c == Collective::AllGather ? "all_gather" : "reduce_scatter"; }

struct Row {
  std::string scope;
  Collective coll;
  uint64_t bytes = 0;   // whole buffer
  uint64_t count = 0;   // elements of the whole buffer
  double time_us = 0;   // slowest rank's mean per operation
  double algbw = 0;     // GB/s
  double busbw = 0;     // GB/s
  uint64_t wrong = 0;   // summed over ranks
  double ref_time_us = -1;  // < 0: no reference; blocking MPI call
  double ref_busbw = 0;
  double nb_time_us = -1;  // non-blocking MPI call + MPI_Wait
  double nb_busbw = 0;
};

// Buffers for one size: host vectors, or device memory with host staging for checks.
class Buffers {
 public:
  Buffers(Device* dev, size_t send_count, size_t recv_count)
      : dev_(dev), send_host_(send_count), recv_host_(recv_count) {
    if (dev_) {
      send_dev_ = dev_->allocate(std::max<size_t>(1, send_count) * sizeof(float));
      recv_dev_ = dev_->allocate(std::max<size_t>(1, recv_count) * sizeof(float));
      stream_ = dev_->create_stream("bench-collectives");
    }
  }
  ~Buffers() {
    if (dev_) {
      dev_->deallocate(send_dev_, std::max<size_t>(1, send_host_.size()) * sizeof(float));
      dev_->deallocate(recv_dev_, std::max<size_t>(1, recv_host_.size()) * sizeof(float));
    }
  }
  std::vector<float>& send_host() { return send_host_; }
  std::vector<float>& recv_host() { return recv_host_; }
  coll::ConstView send() {
    if (!dev_) return send_host_;
    return coll::ConstView::elements(send_dev_, send_host_.size(), coll::DataType::F32);
  }
  coll::MutView recv() {
    if (!dev_) return recv_host_;
    return coll::MutView::elements(recv_dev_, recv_host_.size(), coll::DataType::F32);
  }
  void upload() {
    if (!dev_) return;
    stream_->copy_async(send_dev_, send_host_.data(), send_host_.size() * sizeof(float));
    stream_->copy_async(recv_dev_, recv_host_.data(), recv_host_.size() * sizeof(float));
    stream_->synchronize();
  }
  void download() {
    if (!dev_) return;
    stream_->copy_async(recv_host_.data(), recv_dev_, recv_host_.size() * sizeof(float));
    stream_->synchronize();
  }

 private:
  Device* dev_;
  std::vector<float> send_host_, recv_host_;
  void* send_dev_ = nullptr;
  void* recv_dev_ = nullptr;
  std::unique_ptr<Stream> stream_;
};

Event start(coll::Communicator& comm, Collective c, Buffers& b) {
  return c == Collective::AllGather ? comm.all_gather(b.send(), b.recv())
                                    : comm.reduce_scatter(b.send(), b.recv(), coll::ReduceOp::Sum);
}

// Fills send with values whose sums are exact in float, runs once, counts mismatches.
uint64_t check(coll::Communicator& comm, Collective c, Buffers& b, size_t per_rank) {
  const int n = comm.size(), r = comm.rank();
  auto& s = b.send_host();
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>((i % 1024) + 3 * r);
  std::fill(b.recv_host().begin(), b.recv_host().end(), -1.0f);
  b.upload();
  start(comm, c, b).wait();
  b.download();
  uint64_t wrong = 0;
  const auto& out = b.recv_host();
  for (size_t j = 0; j < out.size(); ++j) {
    float expect;
    if (c == Collective::AllGather) {
      const size_t src = j / per_rank, i = j % per_rank;
      expect = static_cast<float>((i % 1024) + 3 * src);
    } else {
      const size_t i = static_cast<size_t>(r) * per_rank + j;
      expect = static_cast<float>(n * (i % 1024) + 3 * (n * (n - 1) / 2));
    }
    wrong += out[j] != expect;
  }
  return wrong;
}

double max_over_ranks(coll::Communicator& host, double v) {
  std::vector<double> x{v};
  host.all_reduce(x, coll::ReduceOp::Max).wait();
  return x[0];
}

// Mean time of one blocking MPI call, on the MPI thread; the slowest rank's.
double reference_us(coll::Communicator& comm_of_scope, coll::Communicator& world, Collective c, bool nonblocking,
                    Buffers& b, size_t per_rank, unsigned warmup, unsigned iters) {
  double us = 0;
  coll::run_on_mpi_thread(comm_of_scope, [&](MPI_Comm comm) {
    float* send = b.send_host().data();
    float* recv = b.recv_host().data();
    const int n = static_cast<int>(per_rank);
    auto once = [&] {
      int rc;
      if (nonblocking) {
        MPI_Request req;
        rc = c == Collective::AllGather ? MPI_Iallgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm, &req)
                                        : MPI_Ireduce_scatter_block(send, recv, n, MPI_FLOAT, MPI_SUM, comm, &req);
        if (rc == MPI_SUCCESS) rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
      } else {
        rc = c == Collective::AllGather ? MPI_Allgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm)
                                        : MPI_Reduce_scatter_block(send, recv, n, MPI_FLOAT, MPI_SUM, comm);
      }
      if (rc != MPI_SUCCESS) throw Error(std::string("bench collectives: reference ") + name_of(c) + " failed");
    };
    for (unsigned i = 0; i < warmup; ++i) once();
    MPI_Barrier(comm);
    const auto t0 = Clock::now();
    for (unsigned i = 0; i < iters; ++i) once();
    us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
  }).wait();
  return max_over_ranks(world, us);
}

// One size of one collective in one scope: `comm` is this rank's communicator of the
// scope (every group of the scope runs at once), `host` the world's, over which the
// slowest rank's time is taken.
Row measure(const std::string& scope, coll::Communicator& comm, coll::Communicator& host, Device* dev, Collective c,
            uint64_t bytes, const CollectivesOptions& o) {
  const int n = comm.size();
  const size_t per_rank = bytes / sizeof(float) / n;
  const size_t total = per_rank * n;
  Row row{scope, c, total * sizeof(float), total};
  Buffers b(dev, c == Collective::AllGather ? per_rank : total, c == Collective::AllGather ? total : per_rank);

  std::vector<int64_t> wrong{static_cast<int64_t>(check(comm, c, b, per_rank))};
  host.all_reduce(wrong).wait();
  row.wrong = static_cast<uint64_t>(wrong[0]);

  for (unsigned i = 0; i < o.warmup; ++i) start(comm, c, b).wait();
  host.barrier().wait();
  const auto t0 = Clock::now();
  for (unsigned i = 0; i < o.iters; ++i) start(comm, c, b).wait();
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / o.iters;
  row.time_us = max_over_ranks(host, us);
  row.algbw = static_cast<double>(row.bytes) / (row.time_us * 1e3);  // bytes/us = 1e-3 GB/s
  row.busbw = row.algbw * (n - 1) / n;
  if (o.reference && host.backend() == coll::CommBackend::Mpi && dev == nullptr) {
    row.ref_time_us = reference_us(comm, host, c, false, b, per_rank, o.warmup, o.iters);
    row.ref_busbw = static_cast<double>(row.bytes) / (row.ref_time_us * 1e3) * (n - 1) / n;
    row.nb_time_us = reference_us(comm, host, c, true, b, per_rank, o.warmup, o.iters);
    row.nb_busbw = static_cast<double>(row.bytes) / (row.nb_time_us * 1e3) * (n - 1) / n;
  }
  return row;
}

void print_header(std::FILE* out, const coll::Communicator& comm, const CollectivesOptions& o,
                  const std::string& library, bool reference, const coll::Topology& topo) {
  std::fprintf(out, "# strata bench collectives: backend %s, %d rank(s) (%d on this host), float, iters %u, warmup %u\n",
              to_string(comm.backend()), comm.size(), comm.local_size(), o.iters, o.warmup);
  if (!library.empty()) std::fprintf(out, "# MPI: %s\n", library.c_str());
  std::fprintf(out, "# nodes: %s\n", topo.describe().c_str());
  std::fprintf(out, "# time: mean per operation, each waited for, slowest rank; algbw = size/time; "
              "busbw = algbw*(n-1)/n, n the ranks of one collective\n");
  if (reference)
    std::fprintf(out, "# ref: one blocking MPI call; ref-nb: the non-blocking call + MPI_Wait; both on the MPI thread\n");
  if (comm.size() == 1)
    std::fprintf(out, "# one rank: nothing moves between ranks and busbw is 0; run under mpirun -np N\n");
}

void print_table(std::FILE* out, const std::string& scope, const std::string& what, Collective c,
                 const std::vector<Row>& rows, bool reference) {
  std::fprintf(out, "#\n# %s, %s\n", name_of(c), what.c_str());
  std::fprintf(out, "# %12s %12s %6s %6s %10s %8s %8s %7s", "size", "count", "type", "redop", "time", "algbw", "busbw",
              "#wrong");
  if (reference) std::fprintf(out, " %10s %8s %10s %8s", "ref time", "ref bus", "ref-nb", "ref-nb");
  std::fprintf(out, "\n# %12s %12s %6s %6s %10s %8s %8s %7s", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "");
  if (reference) std::fprintf(out, " %10s %8s %10s %8s", "(us)", "(GB/s)", "(us)", "(GB/s)");
  std::fprintf(out, "\n");
  for (const Row& r : rows) {
    if (r.coll != c || r.scope != scope) continue;
    std::fprintf(out, "  %12llu %12llu %6s %6s %10.1f %8.3f %8.3f %7llu", static_cast<unsigned long long>(r.bytes),
                static_cast<unsigned long long>(r.count), "float", c == Collective::AllGather ? "none" : "sum",
                r.time_us, r.algbw, r.busbw, static_cast<unsigned long long>(r.wrong));
    if (reference) std::fprintf(out, " %10.1f %8.3f %10.1f %8.3f", r.ref_time_us, r.ref_busbw, r.nb_time_us, r.nb_busbw);
    std::fprintf(out, "\n");
  }
}

// A scope's communicator on this rank, and what one of its collectives spans.
struct Scope {
  std::string name;
  coll::Communicator* comm;
  std::string what;
};

nlohmann::json row_json(const Row& r) {
  nlohmann::json x{{"scope", r.scope},
                   {"collective", name_of(r.coll)},
                   {"size_bytes", r.bytes},
                   {"count", r.count},
                   {"type", "float"},
                   {"redop", r.coll == Collective::AllGather ? "none" : "sum"},
                   {"time_us", r.time_us},
                   {"algbw_gbps", r.algbw},
                   {"busbw_gbps", r.busbw},
                   {"wrong", r.wrong}};
  if (r.ref_time_us >= 0) {
    x["ref_time_us"] = r.ref_time_us;
    x["ref_busbw_gbps"] = r.ref_busbw;
    x["ref_nb_time_us"] = r.nb_time_us;
    x["ref_nb_busbw_gbps"] = r.nb_busbw;
  }
  return x;
}

void emit_report(const CollectivesOptions& o, const std::string& command, coll::Communicator& comm,
                 const std::string& library, bool reference, const coll::Topology& topo,
                 const std::vector<Scope>& scopes, const std::vector<Row>& rows, uint64_t wrong) {
  Report report;
  report.benchmark = "collectives";
  report.command = command;
  report.title = "strata bench collectives (machine: rank 0's)";
  report.config = {{"backend", to_string(comm.backend())}, {"ranks", comm.size()},
                   {"ranks_per_host", comm.local_size()}, {"ranks_per_node", topo.ranks_per_node},
                   {"nodes", topo.nodes}, {"mpi_library", library}, {"type", "float"},
                   {"iters", o.iters}, {"warmup", o.warmup}, {"reference", reference}};
  report.table.columns = {{"scope", "scope", ""},
                          {"collective", "collective", ""},   {"size_bytes", "size B", ""},
                          {"count", "count", ""},             {"time_us", "time us", "%.1f"},
                          {"algbw_gbps", "algbw GB/s", "%.3f"}, {"busbw_gbps", "busbw GB/s", "%.3f"},
                          {"wrong", "#wrong", ""}};
  if (reference)
    report.table.columns.insert(report.table.columns.end(),
                                {{"ref_time_us", "ref us", "%.1f"}, {"ref_busbw_gbps", "ref busbw", "%.3f"},
                                 {"ref_nb_time_us", "ref-nb us", "%.1f"}, {"ref_nb_busbw_gbps", "ref-nb busbw", "%.3f"}});
  // The same objects as the "results" `strata bench collectives --json` has always had,
  // with the scope added.
  nlohmann::json results = nlohmann::json::array();
  for (const Row& r : rows) {
    results.push_back(row_json(r));
    report.table.rows.push_back(results.back());
  }
  report.extra = {{"backend", to_string(comm.backend())}, {"ranks", comm.size()},
                  {"ranks_per_host", comm.local_size()}, {"ranks_per_node", topo.ranks_per_node},
                  {"nodes", topo.nodes}, {"mpi_library", library},
                  {"type", "float"}, {"iters", o.iters}, {"warmup", o.warmup}, {"results", results}};
  report.print_human = [&](std::FILE* out) {
    print_header(out, comm, o, library, reference, topo);
    for (const Scope& sc : scopes)
      for (Collective c : {Collective::AllGather, Collective::ReduceScatter})
        print_table(out, sc.name, sc.what, c, rows, reference);
    std::fprintf(out, "# wrong elements: %llu\n", static_cast<unsigned long long>(wrong));
  };
  emit(report, o.out);
}

int run_collectives(const CollectivesOptions& o, const std::string& command) {
  check_output_options(o.out);
  if (o.min_bytes == 0 || o.max_bytes < o.min_bytes)
    throw ConfigError("bench collectives: need 0 < --min-bytes <= --max-bytes");
  // MPI starts here, and only here: other benchmarks never touch it.
  auto host = coll::make_host_communicator();
  std::unique_ptr<coll::Communicator> device_comm;
  std::unique_ptr<Device> dev;
  if (o.backend == "nccl") {
    dev = make_device({Backend::Cuda, host->local_rank()});
    device_comm = coll::make_nccl_communicator(*host, host->local_rank());
  } else if (o.backend != "mpi") {
    throw ConfigError("bench collectives: --backend must be mpi or nccl, not '" + o.backend + "'");
  }
  coll::Communicator& comm = device_comm ? *device_comm : *host;
  const bool reference = o.reference && host->backend() == coll::CommBackend::Mpi && !device_comm;
  const std::string library = host->backend() == coll::CommBackend::Mpi ? coll::mpi_info().library : "";

  // The scopes asked for, each with this rank's communicator (split from the host one:
  // sub-communicators are mpi's, so --scope node/cross need --backend mpi).
  if (o.ranks_per_node > 0 && host->size() % o.ranks_per_node != 0)
    throw ConfigError("bench collectives: --ranks-per-node " + std::to_string(o.ranks_per_node) +
                      " does not divide the " + std::to_string(host->size()) +
                      " ranks: give a divisor of the ranks (mpirun -np), or 0 to take the launcher's hosts");
  const coll::Topology topo = coll::resolve_topology(*host, o.ranks_per_node);
  coll::NodeCommunicators split;
  std::vector<Scope> scopes;
  for (const std::string& name : o.scopes) {
    if (name == "world") {
      scopes.push_back({name, &comm, "world: " + std::to_string(comm.size()) + " ranks"});
      continue;
    }
    if (device_comm)
      throw ConfigError("bench collectives: --scope " + name + " needs --backend mpi (the nccl backend cannot split "
                        "into sub-communicators yet)");
    if (!split.node) split = coll::split_by_node(*host, topo);
    coll::Communicator* c = name == "node" ? split.node.get() : split.cross.get();
    const std::string what =
        name == "node" ? "within each node: " + std::to_string(c->size()) + " ranks, " + std::to_string(topo.nodes) +
                             " node(s) at once"
                       : "across nodes: " + std::to_string(c->size()) + " ranks, one a node, " +
                             std::to_string(topo.ranks_per_node) + " such groups at once";
    if (c->size() == 1 && host->size() > 1) {
      if (host->rank() == 0)
        std::fprintf(stderr, "bench collectives: --scope %s has one rank a group here (%s): left out\n", name.c_str(),
                     topo.describe().c_str());
      continue;
    }
    scopes.push_back({name, c, what});
  }

  std::vector<Row> rows;
  std::vector<uint64_t> sizes;
  for (uint64_t s = o.min_bytes; s <= o.max_bytes; s *= std::max(2u, o.step_factor)) sizes.push_back(s);
  std::unique_ptr<Progress> progress;
  if (host->rank() == 0) progress = std::make_unique<Progress>("strata bench collectives");
  for (const Scope& sc : scopes)
    for (Collective c : {Collective::AllGather, Collective::ReduceScatter})
      for (uint64_t s : sizes)
        if (s / sizeof(float) / sc.comm->size() > 0) {
          if (progress) progress->show(sc.name + " " + name_of(c) + " " + std::to_string(s) + " B");
          rows.push_back(measure(sc.name, *sc.comm, *host, dev.get(), c, s, o));
        }
  if (progress) progress->done();

  uint64_t wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  if (host->rank() == 0) emit_report(o, command, comm, library, reference, topo, scopes, rows, wrong);
  return wrong == 0 ? 0 : 1;
}

}  // namespace

void add_collectives(CLI::App& bench, Runner& run) {
  auto opts = std::make_shared<CollectivesOptions>();
  auto* cmd = bench.add_subcommand(
      "collectives", "all_gather and reduce_scatter bus bandwidth against size (run under mpirun -np N)");
  cmd->add_option("--backend", opts->backend, "mpi (host buffers) or nccl (device buffers)")
      ->capture_default_str()
      ->check(CLI::IsMember({"mpi", "nccl"}));
  // parse_byte_count, as every size flag: CLI11's AsSizeValue would read "1KB" as 1024.
  auto bytes = [](const char* flag) {
    return CLI::Validator(
        [flag](std::string& s) {
          s = std::to_string(parse_byte_count(s, flag));
          return std::string();  // no complaint: parse_byte_count throws its own
        },
        "BYTES");
  };
  cmd->add_option("--min-bytes", opts->min_bytes,
                  std::string("smallest whole-buffer size in bytes (") + kByteCountUnits + ")")
      ->capture_default_str()
      ->transform(bytes("--min-bytes"));
  cmd->add_option("--max-bytes", opts->max_bytes, std::string("largest whole-buffer size in bytes (") + kByteCountUnits + ")")
      ->capture_default_str()
      ->transform(bytes("--max-bytes"));
  cmd->add_option("--step-factor", opts->step_factor, "size multiplier between rows")
      ->capture_default_str()
      ->check(CLI::Range(2u, 1024u));
  cmd->add_option("--iters", opts->iters, "timed operations per size")->capture_default_str()->check(CLI::Range(1u, 100000u));
  cmd->add_option("--warmup", opts->warmup, "untimed operations per size")->capture_default_str();
  cmd->add_flag("!--no-reference", opts->reference, "skip the plain-MPI reference columns");
  cmd->add_option("--scope", opts->scopes,
                  "world (all ranks), node (the ranks of each node, every node at once), cross (one rank a node, "
                  "every local index at once); several in one run")
      ->capture_default_str()
      ->check(CLI::IsMember({"world", "node", "cross"}));
  cmd->add_option("--ranks-per-node", opts->ranks_per_node,
                  "ranks a node for --scope node/cross: consecutive ranks (0: the launcher's hosts)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  add_output_options(*cmd, opts->out, "bus bandwidth against size per collective (rank 0 writes)");
  cmd->callback([&run, opts, cmd] {
    run = [opts, c = command_line(*cmd, "strata bench collectives")] { return run_collectives(*opts, c); };
  });
}

}  // namespace strata::bench
