// `strata bench step --peers deepspeed` on a small GPT (2.6M parameters: on a 120K-parameter
// one no byte of ZeRO-Infinity's step reached the disk here) with the Python that has DeepSpeed
// (STRATA_PYTHON, the repository's .venv): DeepSpeed ZeRO-3 with offload_optimizer cpu
// and ZeRO-Infinity (params and optimizer on NVMe, in the bench's --dir) step beside
// Strata's in-memory and NVMe configurations, and each peer's row carries its tokens/s,
// storage I/O, peak host memory and the ratio of Strata's matching configuration. Skipped
// where that Python has no DeepSpeed; ZeRO-Infinity's checks are skipped, with the bench's
// reason, where DeepSpeed's async_io op cannot build (no libaio-dev). Never asserts a
// speed. Label "peers": the time goes to Python (DeepSpeed's import, its first op builds
// take minutes once), so the sanitizer pass leaves it out.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#ifndef STRATA_EXE
#error "STRATA_EXE must name the strata executable"
#endif
#ifndef STRATA_PYTHON
#error "STRATA_PYTHON must name the Python with DeepSpeed"
#endif
#ifndef STRATA_TEST_SCRATCH
#error "STRATA_TEST_SCRATCH must name a directory on a disk"
#endif

using nlohmann::json;
namespace fs = std::filesystem;

TEST(BenchStepPeers, DeepSpeedOffloadAndInfinityBesideStrataOnATinyGpt) {
  if (std::system((std::string(STRATA_PYTHON) + " -c 'import deepspeed' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << STRATA_PYTHON << " cannot import deepspeed (scripts/install-deps.sh installs it in .venv)";
  const fs::path dir = fs::path(STRATA_TEST_SCRATCH) / ("bench-peers-" + std::to_string(getpid()));
  fs::create_directories(dir);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{dir};
  const fs::path out = dir / "step.json";
  const std::string cmd = std::string(STRATA_EXE) +
                          " bench step --layers 2 --d-model 256 --heads 4 --seq 32 --vocab 4096 --micro-batch 2 "
                          "--accum 2 --reps 1 --warmup 1 --lead-in 0 --device-budget 64M --pinned-budget 64M "
                          "--precision bf16 --no-f32 --no-torch --peers deepspeed --python " STRATA_PYTHON " --dir " +
                          dir.string() + " --json " + out.string();
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << cmd;
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  const json doc = json::parse(text.str());
  const json& peers = doc.at("peers");
  ASSERT_FALSE(peers.at("skipped").contains("deepspeed-offload")) << peers.dump();
  const bool infinity = !peers.at("skipped").contains("deepspeed-infinity");
  if (!infinity) {  // only the op's build may keep it out
    EXPECT_NE(peers.at("skipped").at("deepspeed-infinity").get<std::string>().find("async_io"), std::string::npos)
        << peers.dump();
  }
  const json& rows = doc.at("rows");
  ASSERT_EQ(rows.size(), infinity ? 4u : 3u) << rows.dump();
  EXPECT_EQ(rows[2].at("label"), "DeepSpeed ZeRO-Offload (optimizer on cpu), bf16");
  EXPECT_EQ(rows[2].at("strata_configuration"), "in memory, bf16");
  for (size_t i = 2; i < rows.size(); ++i) {
    const json& row = rows[i];
    EXPECT_GT(row.at("tokens_per_s").get<double>(), 0) << row.dump();
    EXPECT_GT(row.at("peak_host_mib").get<double>(), 1) << row.dump();
    // Strata's tokens/s over the peer's: the two medians' ratio, whatever it is.
    const json& strata = rows[row.at("strata_configuration") == rows[0].at("label") ? 0 : 1];
    EXPECT_NEAR(row.at("strata_over_peer").get<double>(),
                row.at("step_median_s").get<double>() / strata.at("step_median_s").get<double>(), 1e-9);
  }
  const json& ran = peers.at("ran").at("deepspeed-offload");
  EXPECT_EQ(ran.at("optimizer"), "DeepSpeedCPUAdam");
  EXPECT_EQ(ran.at("precision"), "bf16");
  if (infinity) {
    const json& row = rows[3];
    EXPECT_EQ(row.at("label"), "DeepSpeed ZeRO-Infinity (params+optimizer on NVMe), bf16");
    EXPECT_EQ(row.at("strata_configuration"), "params+optimizer on NVMe, bf16");
    // Its swap files are written every step (the optimizer states at least) through O_DIRECT aio.
    EXPECT_GT(row.at("nvme_written_mib").get<double>(), 0) << row.dump();
  } else {
    std::printf("ZeRO-Infinity not checked: %s\n", peers.at("skipped").at("deepspeed-infinity").get<std::string>().c_str());
  }
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path(), out) << "left behind: " << e.path();
}
