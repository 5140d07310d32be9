// The Communicator's typed views and argument checks, on the self backend.
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <string>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/collectives/sim_communicator.hpp"
#include "strata/collectives/topology.hpp"
#include "strata/core/error.hpp"

using namespace strata;
using namespace strata::coll;

// Views: spans and lvalue containers convert, temporaries and const data (for
// writing) do not, and raw 16-bit storage has no datatype.
static_assert(std::is_convertible_v<std::vector<float>&, ConstView>);
static_assert(std::is_convertible_v<const std::vector<float>&, ConstView>);
static_assert(std::is_convertible_v<std::span<const double>, ConstView>);
static_assert(std::is_convertible_v<std::vector<float>&, MutView>);
static_assert(std::is_convertible_v<std::span<int64_t>, MutView>);
static_assert(!std::is_convertible_v<std::vector<float>&&, ConstView>);
static_assert(!std::is_convertible_v<std::vector<float>&&, MutView>);
static_assert(!std::is_convertible_v<const std::vector<float>&, MutView>);
static_assert(!std::is_convertible_v<std::span<const float>, MutView>);
static_assert(!std::is_convertible_v<std::vector<uint16_t>&, ConstView>);
static_assert(std::is_convertible_v<MutView, ConstView>);

namespace {
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CollectiveUsageError& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

// Unsets the launcher variables for one test and restores them after.
class NoLauncherEnv {
 public:
  NoLauncherEnv() {
    for (const char* v : kVars)
      if (const char* old = std::getenv(v)) saved_.emplace_back(v, old);
    for (const char* v : kVars) unsetenv(v);
  }
  ~NoLauncherEnv() {
    for (const char* v : kVars) unsetenv(v);
    for (auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  static constexpr std::array<const char*, 3> kVars{"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
  std::vector<std::pair<std::string, std::string>> saved_;
};
}  // namespace

TEST(ConstView, CountsElementsNotBytes) {
  std::vector<double> v(10);
  ConstView c = v;
  EXPECT_EQ(c.count(), 10u);
  EXPECT_EQ(c.bytes(), 80u);
  EXPECT_EQ(c.dtype(), DataType::F64);
  EXPECT_EQ(c.data(), v.data());
  std::vector<Bf16> h(6);
  MutView m = h;
  EXPECT_EQ(m.count(), 6u);
  EXPECT_EQ(m.bytes(), 12u);
  EXPECT_EQ(m.dtype(), DataType::BF16);
  ConstView r = ConstView::elements(v.data(), 3, DataType::I32);
  EXPECT_EQ(r.bytes(), 12u);
}

TEST(LauncherDetection, ReadsTheLaunchersVariables) {
  NoLauncherEnv clean;
  EXPECT_EQ(detect_launcher(), "");
  setenv("PMI_SIZE", "4", 1);
  EXPECT_EQ(detect_launcher(), "PMI_SIZE");
  unsetenv("PMI_SIZE");
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_EQ(detect_launcher(), "OMPI_COMM_WORLD_SIZE");
  setenv("OMPI_COMM_WORLD_SIZE", "", 1);  // set but empty: not a launcher
  EXPECT_EQ(detect_launcher(), "");
}

TEST(SelfCommunicator, ChosenWithoutLauncherAndHasWorldOne) {
  NoLauncherEnv clean;
  auto comm = make_host_communicator();
  EXPECT_EQ(comm->backend(), CommBackend::Self);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->local_rank(), 0);
  EXPECT_EQ(comm->local_size(), 1);
}

TEST(SelfCommunicator, CollectivesCopy) {
  auto comm = make_host_communicator(HostBackend::Self);
  std::vector<float> send{1.5f, -2.0f, 3.25f}, recv(3, 0.0f);
  comm->all_gather(send, recv).wait();
  EXPECT_EQ(recv, send);
  std::fill(recv.begin(), recv.end(), 0.0f);
  comm->reduce_scatter(send, recv).wait();
  EXPECT_EQ(recv, send);
  std::vector<int64_t> a{1LL << 40, -7}, b(2);
  comm->all_reduce(a, b, ReduceOp::Max).wait();
  EXPECT_EQ(b, a);
  comm->all_reduce(b).wait();  // in place
  EXPECT_EQ(b, a);
  comm->broadcast(b, 0).wait();
  EXPECT_EQ(b, a);
  comm->barrier().wait();
  std::vector<float> parts(3, 0.0f);
  comm->all_to_all(send, parts).wait();
  EXPECT_EQ(parts, send);
  // In-place all_gather: send is recv's own slice.
  std::vector<double> full{4.0, 5.0};
  comm->all_gather(std::span<const double>(full), full).wait();
  EXPECT_EQ(full, (std::vector<double>{4.0, 5.0}));
}

TEST(SelfCommunicator, FailedDependencyFailsTheEventButTheCopyHappens) {
  auto comm = make_host_communicator(HostBackend::Self);
  auto [gate, host] = HostEvent::make();
  host->complete(std::make_exception_ptr(IoError("read", "/nvme/shard", 0, 4096, EIO)));
  std::vector<float> send{1, 2}, recv(2, 0);
  Event e = comm->all_reduce(send, recv, ReduceOp::Sum, gate);
  EXPECT_TRUE(e.ready());
  EXPECT_THROW(e.wait(), IoError);
  EXPECT_EQ(recv, send);
}

TEST(CommunicatorChecks, SizeMismatchesThrowWithTheNumbers) {
  auto comm = make_host_communicator(HostBackend::Self);
  std::vector<float> f3(3), f4(4);
  std::vector<double> d3(3);
  EXPECT_EQ(message_of([&] { comm->all_gather(f3, f4); }),
            "all_gather on rank 0 of 1 (self): recv holds 4 float, expected send (3 float) x world size 1 = 3 "
            "float");
  EXPECT_EQ(message_of([&] { comm->reduce_scatter(f4, f3); }),
            "reduce_scatter on rank 0 of 1 (self): send holds 4 float, expected recv (3 float) x world size 1 = "
            "3 float");
  EXPECT_EQ(message_of([&] { comm->all_reduce(f3, f4); }),
            "all_reduce on rank 0 of 1 (self): send holds 3 float but recv holds 4 float; they must match");
  EXPECT_EQ(message_of([&] { comm->all_reduce(f3, d3); }),
            "all_reduce on rank 0 of 1 (self): send holds float but recv holds double; both must have one type");
  EXPECT_EQ(message_of([&] { comm->all_to_all(f3, f4); }),
            "all_to_all on rank 0 of 1 (self): send holds 3 float but recv holds 4 float; they must match");
  EXPECT_EQ(message_of([&] { comm->broadcast(f3, 1); }),
            "broadcast on rank 0 of 1 (self): root 1 is not a rank (0..0)");
  EXPECT_EQ(message_of([&] { comm->broadcast(f3, -1); }),
            "broadcast on rank 0 of 1 (self): root -1 is not a rank (0..0)");
  EXPECT_NE(message_of([&] { comm->all_reduce(ConstView::elements(nullptr, 2, DataType::F32), f3); })
                .find("send is null but holds 2 elements"),
            std::string::npos);
}

TEST(CommunicatorChecks, OverlapsThrowUnlessInPlace) {
  auto comm = make_host_communicator(HostBackend::Self);
  std::vector<float> buf(8);
  std::span<float> all(buf);
  EXPECT_NE(message_of([&] { comm->reduce_scatter(all, all); }).find("overlap"), std::string::npos);
  EXPECT_NE(message_of([&] { comm->all_to_all(all.subspan(0, 4), all.subspan(3, 4)); }).find("overlap"),
            std::string::npos);
  // all_reduce: the same buffer is in place; a shifted one overlaps.
  EXPECT_NO_THROW(comm->all_reduce(all, all).wait());
  EXPECT_NE(message_of([&] { comm->all_reduce(all.subspan(0, 4), all.subspan(2, 4)); }).find("overlap"),
            std::string::npos);
  // all_gather: only recv's own slice is in place.
  EXPECT_NE(message_of([&] { comm->all_gather(all.subspan(1, 4), all.subspan(0, 4)); }).find("in place means"),
            std::string::npos);
}

TEST(SelfCommunicator, SplitsIntoOneRankAndIsOneNodeOfOne) {
  auto self = make_host_communicator(HostBackend::Self);
  auto sub = split(*self, 3, 7);
  EXPECT_EQ(sub->backend(), CommBackend::Self);
  EXPECT_EQ(sub->size(), 1);
  const Topology t = resolve_topology(*self);
  EXPECT_EQ(t.nodes, 1);
  EXPECT_EQ(t.ranks_per_node, 1);
  EXPECT_EQ(t.describe(), "1 rank: 1 node of 1 (from the launcher)");
  NodeCommunicators c = split_by_node(*self, t);
  EXPECT_EQ(c.node->size(), 1);
  EXPECT_EQ(c.cross->size(), 1);
  EXPECT_THROW(resolve_topology(*self, 2), ConfigError);
}

TEST(SimCommunicator, CannotBeSplitAndSaysWhatToDoInstead) {
  SimCostModel cost;
  auto sim = make_sim_communicator(0, 4, cost);
  try {
    split(*sim, 0, 0);
    ADD_FAILURE() << "a sim communicator was split";
  } catch (const Unavailable& e) {
    EXPECT_NE(std::string(e.what()).find("make a sim communicator of the sub-group's size"), std::string::npos);
  }
}
