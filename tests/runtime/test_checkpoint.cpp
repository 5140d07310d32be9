// Sharded checkpoints on one process: save then resume gives the same run as never
// stopping, for every stage and offload; and every fault (a corrupt byte, a truncated
// file, another model shape, a crash mid-save, a full disk) gives a clear error and
// leaves what was saved before untouched.
#include <gtest/gtest.h>

#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <functional>

#include "strata/runtime/formats/export.hpp"

#include "config_errors.hpp"
#include "test_checkpoint_harness.hpp"

using namespace strata;
using namespace strata::testing_checkpoint;
using testing_engine::TempDir;
namespace fs = std::filesystem;

namespace {

coll::Communicator& self() {
  static auto c = coll::make_host_communicator(coll::HostBackend::Self);
  return *c;
}

const nlohmann::json kConfig = {{"note", "test config"}, {"strata", {{"seed", 42}}}};

// Saves a 4-block run at `steps` steps under root and returns the checkpoint dir.
std::string save_run(const fs::path& root, int steps, const std::string& nvme, const RunSpec& spec = {}) {
  Trainer t(self(), spec, nvme);
  for (int s = 0; s < steps; ++s) t.step();
  return save_checkpoint(*t.engine, self(), root.string(), kConfig, {{"at", steps}}, t.names());
}

void flip_byte(const fs::path& p, uint64_t offset) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

using strata::test::error_of;

}  // namespace

TEST(Checkpoint, ResumeGivesTheSameLossesAndWeightsAsAnUninterruptedRun) {
  TempDir dir("ckpt-resume");
  const int total = 12, at = 6;
  std::vector<RunSpec> specs = {
      {.stage = 3},
      {.stage = 3, .param = OffloadDevice::Nvme, .optimizer = OffloadDevice::Nvme, .sub_group = 512},
      {.stage = 2, .optimizer = OffloadDevice::Cpu},
      {.stage = 1, .optimizer = OffloadDevice::Nvme},
  };
  int i = 0;
  for (const RunSpec& spec : specs) {
    SCOPED_TRACE(spec.label());
    const fs::path root = dir.path / ("run" + std::to_string(i++));
    const std::string nvme = (dir.path / "nvme").string();
    fs::create_directories(nvme);
    std::vector<double> ref;
    std::vector<std::vector<float>> ref_w, saved_w;
    {
      Trainer t(self(), spec, nvme);
      for (int s = 0; s < total; ++s) ref.push_back(t.step());
      ref_w = t.weights();
    }
    std::string ck;
    {
      Trainer t(self(), spec, nvme);
      for (int s = 0; s < at; ++s) EXPECT_EQ(t.step(), ref[s]);
      saved_w = t.weights();
      ck = save_checkpoint(*t.engine, self(), root.string(), kConfig, {{"data", {{"epoch", 0}, {"index", 48}}}},
                           t.names());
    }
    EXPECT_EQ(ck, (root / "step-00000006").string());
    EXPECT_EQ(latest_checkpoint(root.string()), ck);
    // Another seed: without a real load, nothing below would match.
    Trainer t(self(), spec, nvme, /*seed=*/7);
    ASSERT_GT(max_abs_diff(t.weights(), saved_w), 1e-3);
    CheckpointInfo info = load_checkpoint(*t.engine, self(), ck);
    EXPECT_EQ(info.step, at);
    EXPECT_EQ(info.world_size, 1);
    EXPECT_EQ(info.config, kConfig);
    EXPECT_EQ(info.extra["data"]["index"], 48);
    EXPECT_EQ(t.engine->optimizer_steps(), at);
    EXPECT_EQ(max_abs_diff(t.weights(), saved_w), 0.0);
    // Same world size and settings: the arithmetic is the same, so the run is bitwise equal.
    for (int s = at; s < total; ++s) EXPECT_EQ(t.step(), ref[s]) << "step " << s;
    EXPECT_EQ(max_abs_diff(t.weights(), ref_w), 0.0);
  }
}

TEST(Checkpoint, LatestPicksTheHighestCompleteStep) {
  TempDir dir("ckpt-latest");
  EXPECT_EQ(latest_checkpoint((dir.path / "none").string()), std::nullopt);
  EXPECT_EQ(latest_checkpoint(dir.path.string()), std::nullopt);
  Trainer t(self(), {}, "");
  std::vector<std::string> saved;
  for (int s = 0; s < 3; ++s) {
    t.step();
    saved.push_back(save_checkpoint(*t.engine, self(), dir.path.string(), kConfig, {}, t.names()));
  }
  EXPECT_EQ(latest_checkpoint(dir.path.string()), saved[2]);
  // A garbled manifest in the newest: skipped, with a warning.
  flip_byte(fs::path(saved[2]) / "manifest.json", 40);
  EXPECT_EQ(latest_checkpoint(dir.path.string()), saved[1]);
  EXPECT_NE(error_of<CorruptionError>([&] { read_checkpoint_info(saved[2]); }).find("manifest"), std::string::npos);
  // A missing rank file in the next: skipped too.
  fs::remove(fs::path(saved[1]) / "rank-0.bin");
  EXPECT_EQ(latest_checkpoint(dir.path.string()), saved[0]);
  EXPECT_NE(error_of<CorruptionError>([&] { read_checkpoint_info(saved[1]); }).find("rank-0.bin' is missing"),
            std::string::npos);
  // Saving a step that exists is refused; the existing one stays as it was.
  Trainer u(self(), {}, "");
  u.step();
  const auto before = snapshot(dir.path);
  const std::string msg =
      error_of<ConfigError>([&] { save_checkpoint(*u.engine, self(), dir.path.string(), kConfig, {}, u.names()); });
  EXPECT_NE(msg.find("exists already"), std::string::npos) << msg;
  EXPECT_EQ(snapshot(dir.path), before);
}

TEST(Checkpoint, CorruptByteIsFoundByItsChecksum) {
  TempDir dir("ckpt-corrupt");
  const std::string ck = save_run(dir.path, 2, "");
  const fs::path rank0 = fs::path(ck) / "rank-0.bin";
  CheckpointInfo info = read_checkpoint_info(ck);
  // A byte in the exp_avg_sq of block.2: found on load (which reads every state) ...
  const uint64_t seg = info.groups[0].shard * 4;
  flip_byte(rank0, 2 * 3 * seg + 2 * seg + 100);
  Trainer t(self(), {}, "");
  const std::string msg = error_of<CorruptionError>([&] { load_checkpoint(*t.engine, self(), ck); });
  EXPECT_NE(msg.find(rank0.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("exp_avg_sq of group 'block.2'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the manifest expects"), std::string::npos) << msg;
  // ... but not by export, which reads master weights only.
  EXPECT_NO_THROW(read_checkpoint_group(info, 2));
  // A byte in the master weights of block.1: export finds it too.
  flip_byte(rank0, 1 * 3 * seg + 7);
  EXPECT_NE(error_of<CorruptionError>([&] { read_checkpoint_group(info, 1); }).find("master of group 'block.1'"),
            std::string::npos);
}

TEST(Checkpoint, TruncatedFileIsRefusedBeforeAnythingIsRead) {
  TempDir dir("ckpt-trunc");
  const std::string ck = save_run(dir.path, 1, "");
  const fs::path rank0 = fs::path(ck) / "rank-0.bin";
  const auto size = fs::file_size(rank0);
  fs::resize_file(rank0, size - 4096);
  const std::string msg = error_of<CorruptionError>([&] { read_checkpoint_info(ck); });
  EXPECT_NE(msg.find(rank0.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(size - 4096) + " bytes, the manifest says " + std::to_string(size) + " (truncated)"),
            std::string::npos)
      << msg;
  Trainer t(self(), {}, "");
  const auto before = t.weights();
  EXPECT_THROW(load_checkpoint(*t.engine, self(), ck), CorruptionError);
  EXPECT_EQ(max_abs_diff(t.weights(), before), 0.0) << "a refused load must not change the engine";
  EXPECT_EQ(latest_checkpoint(dir.path.string()), std::nullopt);
  fs::remove(fs::path(ck) / "manifest.json");
  EXPECT_NE(error_of<CorruptionError>([&] { read_checkpoint_info(ck); }).find("has no manifest.json"),
            std::string::npos);
  EXPECT_NE(error_of<ConfigError>([&] { read_checkpoint_info((dir.path / "nowhere").string()); })
                .find("is not a directory"),
            std::string::npos);
}

TEST(Checkpoint, AnotherModelShapeIsAClearConfigError) {
  TempDir dir("ckpt-shape");
  const std::string ck = save_run(dir.path, 1, "");
  {
    Trainer wider(self(), {}, "", 42, kLayers, kWidth + 8);
    const std::string msg = error_of<ConfigError>([&] { load_checkpoint(*wider.engine, self(), ck); });
    const uint64_t here = (kWidth + 8) * (kWidth + 8) + kWidth + 8, there = kWidth * kWidth + kWidth;
    EXPECT_NE(msg.find("checkpoint is of another model shape: group 'block.0' has " + std::to_string(here) +
                       " elements here, " + std::to_string(there) + " in the checkpoint"),
              std::string::npos)
        << msg;
  }
  Trainer shallower(self(), {}, "", 42, kLayers - 1);
  const std::string msg = error_of<ConfigError>([&] { load_checkpoint(*shallower.engine, self(), ck); });
  EXPECT_NE(msg.find("3 parameter groups, the checkpoint"), std::string::npos) << msg;
}

// A process killed mid-save (SIGKILL from the test hook, after its rank file is written
// and fsync'd, before the manifest or before the rename) leaves only a .tmp directory:
// latest_checkpoint ignores it, and the next save of that step replaces it.
TEST(Checkpoint, ProcessKilledMidSaveLeavesNoCheckpointThatLooksWhole) {
  for (const char* point : {"before-manifest", "before-rename"}) {
    SCOPED_TRACE(point);
    TempDir dir(std::string("ckpt-kill-") + point);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        Trainer t(self(), {}, "");
        t.step();
        save_checkpoint(*t.engine, self(), dir.path.string(), kConfig, {}, t.names());
        t.step();
        ::setenv("STRATA_CHECKPOINT_KILL", point, 1);
        save_checkpoint(*t.engine, self(), dir.path.string(), kConfig, {}, t.names());
        code = 3;  // not killed
      } catch (...) {
        code = 4;
      }
      ::_exit(code);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
    const fs::path tmp = dir.path / ".step-00000002.tmp";
    ASSERT_TRUE(fs::exists(tmp / "rank-0.bin"));
    EXPECT_EQ(fs::exists(tmp / "manifest.json"), std::string(point) == "before-rename");
    EXPECT_FALSE(fs::exists(dir.path / "step-00000002"));
    const std::string first = (dir.path / "step-00000001").string();
    EXPECT_EQ(latest_checkpoint(dir.path.string()), first);
    const auto first_files = snapshot(first);
    // Resume from step 1 and save step 2 again: the leftover is replaced.
    Trainer t(self(), {}, "");
    load_checkpoint(*t.engine, self(), first);
    t.step();
    const std::string second = save_checkpoint(*t.engine, self(), dir.path.string(), kConfig, {}, t.names());
    EXPECT_FALSE(fs::exists(tmp));
    EXPECT_EQ(latest_checkpoint(dir.path.string()), second);
    EXPECT_NO_THROW(read_checkpoint_group(read_checkpoint_info(second), 0));
    EXPECT_EQ(snapshot(first), first_files);
  }
}

// A save that fails with a write error (files limited by RLIMIT_FSIZE: EFBIG) removes its
// own .tmp directory, throws IoError naming the file, and changes no existing byte.
TEST(Checkpoint, FailedWriteLeavesExistingCheckpointsUntouched) {
  TempDir dir("ckpt-efbig");
  Trainer t(self(), {}, "");
  t.step();
  const std::string first = save_checkpoint(*t.engine, self(), dir.path.string(), kConfig, {}, t.names());
  const auto before = snapshot(dir.path);
  t.step();
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 40 << 10;  // a rank file is 96 KiB
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg;
  try {
    save_checkpoint(*t.engine, self(), dir.path.string(), kConfig, {}, t.names());
    msg = "no exception";
  } catch (const IoError& e) {
    msg = e.what();
    EXPECT_EQ(e.error_code(), EFBIG);
  } catch (const std::exception& e) {
    msg = std::string("wrong exception: ") + e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find(".step-00000002.tmp/rank-0.bin"), std::string::npos) << msg;
  EXPECT_EQ(snapshot(dir.path), before) << "the failed save left something behind or changed a byte";
  EXPECT_EQ(latest_checkpoint(dir.path.string()), first);
  // The same step saves once the fault is gone.
  EXPECT_EQ(save_checkpoint(*t.engine, self(), dir.path.string(), kConfig, {}, t.names()),
            (dir.path / "step-00000002").string());
}

// A real full disk: a 160 KiB tmpfs (one checkpoint is 100 KiB) (needs CAP_SYS_ADMIN; skipped without it).
TEST(Checkpoint, FullDiskLeavesExistingCheckpointsUntouched) {
  TempDir dir("ckpt-enospc");
  const fs::path mnt = dir.path / "disk";
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=160k") != 0)
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno) << "); needs CAP_SYS_ADMIN";
  struct Unmount {
    fs::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  Trainer t(self(), {}, "");
  t.step();
  const std::string first = save_checkpoint(*t.engine, self(), mnt.string(), kConfig, {}, t.names());
  const auto before = snapshot(mnt);
  t.step();
  std::string msg = error_of<IoError>([&] { save_checkpoint(*t.engine, self(), mnt.string(), kConfig, {}, t.names()); });
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  // The fix is the checkpoint directory's, not the swap files' (#16 class 8).
  EXPECT_NE(msg.find("the disk is full: free space on it or set strata.checkpoint_dir to a disk with room; the "
                     "checkpoints saved before are intact"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("nvme_path"), std::string::npos) << msg;
  std::printf("full disk: %s\n", msg.c_str());
  EXPECT_EQ(snapshot(mnt), before);
  EXPECT_EQ(latest_checkpoint(mnt.string()), first);
  Trainer u(self(), {}, "", 7);
  load_checkpoint(*u.engine, self(), first);  // still whole
}

// Export reads GPT checkpoints only: the residual MLP's (no strata.model in its config,
// or a shape its groups do not fit) is refused, and nothing is written.
TEST(Checkpoint, ExportRefusesACheckpointThatIsNotAGpt) {
  TempDir dir("ckpt-export");
  const std::string ck = save_run(dir.path, 1, "");
  const std::string out = (dir.path / "m.safetensors").string();
  EXPECT_NE(error_of<ConfigError>([&] { export_safetensors(ck, out, false); }).find("has no strata.model section"),
            std::string::npos);
  Trainer t(self(), {}, "");
  const nlohmann::json gpt = {{"strata", {{"model", {{"layers", 2}, {"d_model", 32}, {"heads", 2}}}}}};
  const std::string ck2 = save_checkpoint(*t.engine, self(), (dir.path / "gpt").string(), gpt, {}, t.names());
  const std::string msg = error_of<ConfigError>([&] { export_safetensors(ck2, out, false); });
  EXPECT_NE(msg.find("is not of the model its configuration describes"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out));
}

// The manifest's fields are read with their types and ranges checked, and its sizes are
// added and multiplied without wrapping around (tests/fuzz/fuzz_manifest.cpp fuzzes the
// same function). Each damaged field is a CorruptionError naming it.
TEST(CheckpointManifest, EveryFieldIsCheckedForTypeRangeAndOverflow) {
  const nlohmann::json good = {
      {"format", "strata-checkpoint"}, {"version", 1}, {"step", 2}, {"optimizer_steps", 2}, {"precision", "fp16"},
      {"loss_scaler", {{"scale", 256.0}, {"iter", 2}, {"last_overflow_iter", -1}, {"hysteresis", 2}}},
      {"world_size", 2}, {"config", nlohmann::json::object()}, {"extra", nlohmann::json::object()},
      {"groups", {{{"name", "wte"}, {"numel", 5}, {"padded", 6}, {"shard", 3}}}},
      {"files", {{{"name", "rank-0.bin"}, {"bytes", 36}, {"xxh3", {"0123456789abcdef", "0", "0"}}},
                 {{"name", "rank-1.bin"}, {"bytes", 36}, {"xxh3", {"0", "0", "0"}}}}}};
  auto fixed = [](nlohmann::json j) {  // well-formed checksum strings
    for (auto& f : j["files"])
      for (auto& h : f["xxh3"]) h = std::string(16 - h.get<std::string>().size(), '0') + h.get<std::string>();
    return j;
  };
  const CheckpointInfo info = parse_checkpoint_manifest("/x/step-2", seal_checkpoint_manifest(fixed(good)));
  EXPECT_EQ(info.world_size, 2);
  ASSERT_TRUE(info.loss_scaler.has_value());
  EXPECT_EQ(info.loss_scaler->last_overflow_iter, -1);
  EXPECT_EQ(info.files[0].segments[0], 0x0123456789abcdefull);

  auto damaged = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = fixed(good);
    change(j);
    return test::error_of<CorruptionError>([&] { parse_checkpoint_manifest("/x/step-2", seal_checkpoint_manifest(j)); });
  };
  EXPECT_NE(damaged([](auto& j) { j["version"] = 1.5; }).find("'version' = 1.5, not an integer"), std::string::npos);
  EXPECT_NE(damaged([](auto& j) { j["version"] = 1e300; }).find("'version' = 1e+300, not an integer"), std::string::npos);
  EXPECT_NE(damaged([](auto& j) { j["step"] = -1; }).find("'step' = -1, not an integer from 0"), std::string::npos);
  EXPECT_NE(damaged([](auto& j) { j["world_size"] = 0; }).find("'world_size' = 0"), std::string::npos);
  EXPECT_NE(damaged([](auto& j) { j["world_size"] = 4294967298.0; }).find("'world_size'"), std::string::npos);
  EXPECT_NE(damaged([](auto& j) { j["loss_scaler"]["hysteresis"] = 1e20; }).find("'hysteresis'"), std::string::npos);
  EXPECT_NE(damaged([](auto& j) { j["loss_scaler"]["scale"] = -2.0; }).find("loss scale -2.0"), std::string::npos);
  EXPECT_NE(damaged([](auto& j) { j["precision"] = "f8"; }).find("precision 'f8'"), std::string::npos);
  // shard x world_size wraps to padded: 2^63 x 2 = 0 (mod 2^64).
  EXPECT_NE(damaged([](auto& j) {
              j["groups"][0]["shard"] = uint64_t{1} << 63;
              j["groups"][0]["padded"] = 0;
            }).find("'padded' = 0"),
            std::string::npos);
  EXPECT_NE(damaged([](auto& j) {
              j["groups"][0]["shard"] = uint64_t{1} << 63;
              j["groups"][0]["padded"] = uint64_t{1} << 63;
            }).find("group 'wte' has numel 5"),
            std::string::npos);
  // 12 bytes a shard element: 3 x 2^62 x 12 wraps; the rank files' bytes cannot match.
  EXPECT_NE(damaged([](auto& j) {
              j["groups"][0]["shard"] = 3 * (uint64_t{1} << 61);
              j["groups"][0]["padded"] = 3 * (uint64_t{1} << 62);
            }).find("inconsistent: group 'wte'"),
            std::string::npos);
  EXPECT_NE(damaged([](auto& j) { j["files"][1]["xxh3"][0] = "+000000000000001"; }).find("malformed checksum"),
            std::string::npos);
  EXPECT_NE(damaged([](auto& j) { j["files"][1]["xxh3"][0] = 7; }).find("wrong type"), std::string::npos);

  // A group saved in parts (strata.tile_factor, stage3_prefetch_bucket_size: 'block.0',
  // 'block.0@4', ...) is read as the model's group; parts that do not follow each other
  // are refused, naming the part and where the ones before it end.
  auto parts = [&](const std::string& second) {
    nlohmann::json j = fixed(good);
    j["groups"] = {{{"name", "block.0"}, {"numel", 4}, {"padded", 4}, {"shard", 2}},
                   {{"name", second}, {"numel", 4}, {"padded", 4}, {"shard", 2}}};
    for (auto& f : j["files"]) {
      f["bytes"] = 48;  // (2 + 2) shard elements x 12 bytes, a checksum per group and state
      f["xxh3"] = std::vector<std::string>(6, std::string(16, '0'));
    }
    return parse_checkpoint_manifest("/x/step-2", seal_checkpoint_manifest(j));
  };
  const std::vector<CheckpointGroup> merged = checkpoint_model_groups(parts("block.0@4"));
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0].name, "block.0");
  EXPECT_EQ(merged[0].numel, 8u);
  const CheckpointInfo gap = parts("block.0@6");
  const std::string m = test::error_of<CorruptionError>([&] { checkpoint_model_groups(gap); });
  EXPECT_NE(m.find("group 'block.0@6' starts at element 6 of 'block.0', whose parts before it end at 4"),
            std::string::npos)
      << m;
  EXPECT_THROW(read_checkpoint_group(gap, 0), CorruptionError);
}
