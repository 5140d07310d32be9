// Sharded checkpoints across ranks (under mpirun at 2 and 4 ranks): resume at the same
// world size is bitwise the uninterrupted run; resume at another world size (W -> 1,
// 1 -> W, and 2 -> 4 through a checkpoint handed from the np2 run to the np4 run) matches
// it to float rounding; a failure on one rank fails the save on every rank and leaves
// nothing behind.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>

#include "test_checkpoint_harness.hpp"

using namespace strata;
using namespace strata::testing_checkpoint;
namespace fs = std::filesystem;

namespace {

// As in test_engine_mpi.cpp: another world size adds the gradient sums in another order.
constexpr double kLossRtol = 1e-5;
constexpr double kWeightAtol = 1e-5;
constexpr int kTotal = 12, kAt = 6;

coll::Communicator& world() {
  static auto comm = coll::make_host_communicator(coll::HostBackend::Mpi);
  return *comm;
}
coll::Communicator& self() {
  static auto comm = coll::make_host_communicator(coll::HostBackend::Self);
  return *comm;
}

const nlohmann::json kConfig = {{"note", "mpi test"}};

// A directory every rank sees: named by rank 0's pid; removed by rank 0 at the end.
struct SharedDir {
  fs::path path;
  explicit SharedDir(const std::string& tag) {
    int64_t pid = ::getpid();
    world().broadcast(std::span<int64_t>(&pid, 1), 0).wait();
    path = fs::temp_directory_path() / ("strata-" + tag + "-" + std::to_string(pid));
    if (world().rank() == 0) fs::create_directories(path);
    world().barrier().wait();
  }
  ~SharedDir() {
    world().barrier().wait();
    std::error_code ec;
    if (world().rank() == 0) fs::remove_all(path, ec);
  }
};

struct Reference {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
};
Reference reference(coll::Communicator& comm, const RunSpec& spec, const std::string& nvme) {
  Trainer t(comm, spec, nvme);
  Reference r;
  for (int s = 0; s < kTotal; ++s) r.losses.push_back(t.step());
  r.weights = t.weights();
  return r;
}

// Loads ck into a fresh run on comm (another seed, so only a real load can match) and
// trains to kTotal; returns the worst relative loss difference against ref.
double resume_and_compare(coll::Communicator& comm, const RunSpec& spec, const std::string& nvme,
                          const std::string& ck, const Reference& ref, double* worst_w) {
  Trainer t(comm, spec, nvme, /*seed=*/7);
  CheckpointInfo info = load_checkpoint(*t.engine, comm, ck);
  EXPECT_EQ(info.step, kAt);
  double worst = 0;
  for (int s = kAt; s < kTotal; ++s)
    worst = std::max(worst, std::abs(t.step() - ref.losses[s]) / std::abs(ref.losses[s]));
  *worst_w = max_abs_diff(t.weights(), ref.weights);
  return worst;
}

std::vector<RunSpec> specs() {
  return {{.stage = 3, .param = OffloadDevice::Nvme, .optimizer = OffloadDevice::Nvme, .sub_group = 512},
          {.stage = 2, .optimizer = OffloadDevice::Cpu},
          {.stage = 1}};
}

}  // namespace

TEST(CheckpointMpi, ResumeAtTheSameAndAtOtherWorldSizes) {
  coll::Communicator& comm = world();
  const int W = comm.size(), rank = comm.rank();
  ASSERT_GT(W, 1) << "run this under mpirun with at least 2 ranks";
  SharedDir dir("ckpt-mpi");
  const std::string nvme = (dir.path / ("nvme-" + std::to_string(rank))).string();
  fs::create_directories(nvme);
  int i = 0;
  for (const RunSpec& spec : specs()) {
    SCOPED_TRACE(spec.label());
    const fs::path root = dir.path / ("spec" + std::to_string(i++));
    const Reference ref_w = reference(comm, spec, nvme);
    const Reference ref_1 = reference(self(), spec, nvme);

    // Save at kAt with W ranks.
    std::string ck;
    {
      Trainer t(comm, spec, nvme);
      for (int s = 0; s < kAt; ++s) t.step();
      ck = save_checkpoint(*t.engine, comm, (root / "w").string(), kConfig, {{"ranks", W}}, t.names());
    }
    EXPECT_EQ(read_checkpoint_info(ck).world_size, W);
    // Same world size: bitwise the same run.
    {
      Trainer t(comm, spec, nvme, 7);
      load_checkpoint(*t.engine, comm, ck);
      for (int s = kAt; s < kTotal; ++s) EXPECT_EQ(t.step(), ref_w.losses[s]) << "step " << s;
      EXPECT_EQ(max_abs_diff(t.weights(), ref_w.weights), 0.0);
    }
    // W -> 1: every rank on its own reads all W files.
    double ww = 0;
    EXPECT_LE(resume_and_compare(self(), spec, nvme, ck, ref_1, &ww), kLossRtol) << W << " -> 1";
    EXPECT_LE(ww, kWeightAtol) << W << " -> 1";

    // 1 -> W: rank 0 saves alone, all ranks load.
    std::string ck1;
    if (rank == 0) {
      Trainer t(self(), spec, nvme);
      for (int s = 0; s < kAt; ++s) t.step();
      ck1 = save_checkpoint(*t.engine, self(), (root / "one").string(), kConfig, {}, t.names());
    }
    comm.barrier().wait();
    ck1 = (root / "one" / "step-00000006").string();
    EXPECT_LE(resume_and_compare(comm, spec, nvme, ck1, ref_1, &ww), kLossRtol) << "1 -> " << W;
    EXPECT_LE(ww, kWeightAtol) << "1 -> " << W;
  }
}

// One rank cannot write (its files are limited to 40 KiB: EFBIG): every rank throws,
// the .tmp directory is gone and the earlier checkpoint is byte for byte as it was.
// A corrupt byte in one rank's file fails the load on every rank.
TEST(CheckpointMpi, OneRankFailingFailsEveryRankAndTouchesNothing) {
  coll::Communicator& comm = world();
  const int W = comm.size(), rank = comm.rank();
  SharedDir dir("ckpt-mpi-fault");
  Trainer t(comm, {}, "");
  t.step();
  const std::string first = save_checkpoint(*t.engine, comm, dir.path.string(), kConfig, {}, t.names());
  comm.barrier().wait();
  const auto before = snapshot(dir.path);
  t.step();
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  if (rank == W - 1) {
    rlimit small = old;
    small.rlim_cur = 1024;  // a rank file is 48 KiB here
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  }
  std::string msg = "no exception";
  try {
    save_checkpoint(*t.engine, comm, dir.path.string(), kConfig, {}, t.names());
  } catch (const IoError& e) {
    msg = e.what();
  } catch (const std::exception& e) {
    msg = std::string("wrong exception: ") + e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  const std::string failing = "rank-" + std::to_string(W - 1) + ".bin";
  EXPECT_NE(msg.find(failing), std::string::npos) << msg;
  if (rank != W - 1) {
    EXPECT_NE(msg.find("on rank " + std::to_string(W - 1)), std::string::npos) << msg;
  }
  comm.barrier().wait();
  EXPECT_EQ(snapshot(dir.path), before);
  EXPECT_EQ(latest_checkpoint(dir.path.string()), first);

  // A corrupt byte in rank 0's file (in block.0's master weights: data, not padding):
  // at the same world size only rank 0 reads it, and every rank throws.
  comm.barrier().wait();
  if (rank == 0) {
    const fs::path victim = fs::path(first) / "rank-0.bin";
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(12);
    const char c = static_cast<char>(f.get() ^ 0x20);
    f.seekp(12);
    f.put(c);
  }
  comm.barrier().wait();
  Trainer u(comm, {}, "", 7);
  msg = "no exception";
  try {
    load_checkpoint(*u.engine, comm, first);
  } catch (const CorruptionError& e) {
    msg = e.what();
  } catch (const std::exception& e) {
    msg = std::string("wrong exception: ") + e.what();
  }
  EXPECT_NE(msg.find("rank-0.bin' is corrupt"), std::string::npos) << msg;
}

// 2 -> 4 across two mpirun runs: the np2 run leaves a checkpoint in
// $STRATA_CKPT_HANDOFF; the np4 run ($STRATA_CKPT_RESUME_FROM) resumes from it.
TEST(CheckpointMpi, HandOffToAnotherLaunch) {
  coll::Communicator& comm = world();
  const char* out = std::getenv("STRATA_CKPT_HANDOFF");
  const char* in = std::getenv("STRATA_CKPT_RESUME_FROM");
  if (!out && !in) GTEST_SKIP() << "neither STRATA_CKPT_HANDOFF nor STRATA_CKPT_RESUME_FROM is set (CTest sets them)";
  const RunSpec spec{.stage = 3, .param = OffloadDevice::Cpu, .optimizer = OffloadDevice::Cpu};
  const std::string nvme;
  if (out) {
    if (comm.rank() == 0) fs::remove_all(out);
    comm.barrier().wait();
    Trainer t(comm, spec, nvme);
    for (int s = 0; s < kAt; ++s) t.step();
    save_checkpoint(*t.engine, comm, out, kConfig, {{"ranks", comm.size()}}, t.names());
  }
  if (in) {
    const auto ck = latest_checkpoint(in);
    ASSERT_TRUE(ck.has_value()) << "no checkpoint in " << in << ": run the np2 test first";
    const CheckpointInfo info = read_checkpoint_info(*ck);
    EXPECT_NE(info.world_size, comm.size()) << "the hand-off is meant to change the world size";
    const Reference ref_1 = reference(self(), spec, nvme);
    double ww = 0;
    EXPECT_LE(resume_and_compare(comm, spec, nvme, *ck, ref_1, &ww), kLossRtol)
        << info.world_size << " -> " << comm.size();
    EXPECT_LE(ww, kWeightAtol);
    if (comm.rank() == 0)
      std::printf("resumed a checkpoint of %d ranks on %d ranks\n", info.world_size, comm.size());
  }
}
