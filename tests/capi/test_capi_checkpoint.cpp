// Checkpoints through the C API (runtime/src/formats/checkpoint.cpp does the work): save, load
// into a fresh runtime and resume gives the weights of an uninterrupted run.
#include <gtest/gtest.h>

#include "capi_harness.hpp"

using namespace capi_test;

namespace {
void train_steps(strata_runtime rt, const std::vector<ToyGroup>& gs, int from, int to) {
  for (int s = from; s < to; ++s) {
    toy_micro_step(rt, gs, forward_backward(static_cast<int>(gs.size())), s, 0, 0);
    EXPECT_STRATA_OK(strata_step(rt, nullptr));
  }
}
}  // namespace

TEST(CApiCheckpoint, SaveLoadAndResumeMatchesAnUninterruptedRun) {
  TempDir nvme("ckpt-nvme"), root("ckpt-root");
  const std::string json = config_json({.offload = "nvme", .nvme_dir = nvme.path.string()});
  auto gs = toy_groups(3);
  std::vector<std::vector<float>> straight;
  {
    RuntimeHandle h(json);
    register_toy(h.rt, gs);
    train_steps(h.rt, gs, 0, 6);
    straight = read_all(h.rt, gs);
  }
  char dir[4096] = {};
  {
    RuntimeHandle h(json);
    register_toy(h.rt, gs);
    train_steps(h.rt, gs, 0, 3);
    char tiny[4];
    EXPECT_STRATA_FAILS(strata_save_checkpoint(h.rt, root.path.c_str(), "{", dir, sizeof dir),
                        STRATA_ERR_INVALID_ARGUMENT, "extra_json is not valid JSON");
    ASSERT_STRATA_OK(strata_save_checkpoint(h.rt, root.path.c_str(), "{\"data_position\": 3}", dir, sizeof dir));
    EXPECT_NE(std::string(dir).find("step-00000003"), std::string::npos) << dir;
    EXPECT_STRATA_FAILS(strata_save_checkpoint(h.rt, root.path.c_str(), nullptr, nullptr, 0), STRATA_ERR_CONFIG,
                        "step-00000003");  // a checkpoint is never overwritten
    train_steps(h.rt, gs, 3, 4);
    EXPECT_STRATA_FAILS(strata_save_checkpoint(h.rt, root.path.c_str(), nullptr, tiny, sizeof tiny),
                        STRATA_ERR_BUFFER_TOO_SMALL, "the buffer has 4");
    ASSERT_STRATA_OK(strata_save_checkpoint(h.rt, root.path.c_str(), nullptr, nullptr, 0));
  }
  char latest[4096] = {};
  ASSERT_STRATA_OK(strata_latest_checkpoint(root.path.c_str(), latest, sizeof latest));
  EXPECT_NE(std::string(latest).find("step-00000004"), std::string::npos) << latest;
  {
    RuntimeHandle h(json);
    register_toy(h.rt, gs);
    char extra[256] = {};
    ASSERT_STRATA_OK(strata_load_checkpoint(h.rt, dir, extra, sizeof extra));
    EXPECT_EQ(std::string(extra), "{\"data_position\":3}");
    strata_stats st{};
    st.struct_size = sizeof st;
    ASSERT_STRATA_OK(strata_get_stats(h.rt, &st));
    EXPECT_EQ(st.optimizer_steps, 3);
    train_steps(h.rt, gs, 3, 6);
    EXPECT_EQ(read_all(h.rt, gs), straight) << "resuming from the checkpoint changed the run";
  }
  {
    // A root instead of a step directory loads its latest.
    RuntimeHandle h(json);
    register_toy(h.rt, gs);
    ASSERT_STRATA_OK(strata_load_checkpoint(h.rt, root.path.c_str(), nullptr, 0));
    strata_stats st{};
    st.struct_size = sizeof st;
    ASSERT_STRATA_OK(strata_get_stats(h.rt, &st));
    EXPECT_EQ(st.optimizer_steps, 4);
  }
}

// STRATA_ERR_BUFFER_TOO_SMALL says the call did nothing: the buffer is checked before a
// save writes anything and before a load replaces the parameters.
TEST(CApiCheckpoint, ABufferTooSmallIsRefusedBeforeAnythingIsSavedOrLoaded) {
  namespace fs = std::filesystem;
  TempDir root("ckpt-room");
  auto gs = toy_groups(2);
  RuntimeHandle h(config_json({}));
  register_toy(h.rt, gs);
  train_steps(h.rt, gs, 0, 1);
  const std::string expected = (root.path / "step-00000001").string();
  const char* extra_json = R"({"data_position": 12345, "rng": "pcg64 0x5eed"})";
  for (size_t cap : {size_t{0}, size_t{1}, size_t{8}, expected.size()}) {
    std::vector<char> out(cap + 1, 'x');
    EXPECT_STRATA_FAILS(strata_save_checkpoint(h.rt, root.path.c_str(), extra_json, out.data(), cap),
                        STRATA_ERR_BUFFER_TOO_SMALL, "nothing was saved");
    EXPECT_EQ(std::string(out.begin(), out.end()), std::string(cap + 1, 'x')) << "a refused save wrote its buffer";
    EXPECT_TRUE(fs::is_empty(root.path)) << "a refused save (capacity " << cap << ") left files in the root";
  }
  std::vector<char> dir(expected.size() + 1);
  ASSERT_STRATA_OK(strata_save_checkpoint(h.rt, root.path.c_str(), extra_json, dir.data(), dir.size()));
  EXPECT_EQ(std::string(dir.data()), expected);
  const auto saved = read_all(h.rt, gs);

  train_steps(h.rt, gs, 1, 2);
  const auto moved = read_all(h.rt, gs);
  ASSERT_NE(moved, saved);
  const std::string stored = R"({"data_position":12345,"rng":"pcg64 0x5eed"})";
  for (const char* target : {static_cast<const char*>(dir.data()), root.path.c_str()}) {
    for (size_t cap : {size_t{0}, size_t{1}, size_t{16}, stored.size()}) {
      std::vector<char> out(cap + 1, 'x');
      EXPECT_STRATA_FAILS(strata_load_checkpoint(h.rt, target, out.data(), cap), STRATA_ERR_BUFFER_TOO_SMALL,
                          "nothing was loaded");
      EXPECT_EQ(std::string(out.begin(), out.end()), std::string(cap + 1, 'x')) << "a refused load wrote its buffer";
      EXPECT_EQ(read_all(h.rt, gs), moved) << "a refused load (capacity " << cap << ") replaced the parameters";
      strata_stats st{};
      st.struct_size = sizeof st;
      ASSERT_STRATA_OK(strata_get_stats(h.rt, &st));
      EXPECT_EQ(st.optimizer_steps, 2) << "a refused load set the step back";
    }
  }
  std::vector<char> extra(stored.size() + 1);
  ASSERT_STRATA_OK(strata_load_checkpoint(h.rt, dir.data(), extra.data(), extra.size()));
  EXPECT_EQ(std::string(extra.data()), stored);
  EXPECT_EQ(read_all(h.rt, gs), saved);
}

TEST(CApiCheckpoint, Misuse) {
  TempDir root("ckpt-misuse"), empty("ckpt-empty");
  auto gs = toy_groups(2);
  char buf[4096];
  EXPECT_STRATA_FAILS(strata_latest_checkpoint(empty.path.c_str(), buf, sizeof buf), STRATA_ERR_NOT_FOUND,
                      "no complete checkpoint");
  EXPECT_STRATA_FAILS(strata_latest_checkpoint(nullptr, buf, sizeof buf), STRATA_ERR_INVALID_ARGUMENT, "root is null");
  {
    RuntimeHandle h(config_json({}));
    register_toy(h.rt, gs);
    EXPECT_STRATA_FAILS(strata_load_checkpoint(h.rt, empty.path.c_str(), nullptr, 0), STRATA_ERR_NOT_FOUND,
                        "neither a checkpoint");
    ASSERT_STRATA_OK(strata_save_checkpoint(h.rt, root.path.c_str(), nullptr, buf, sizeof buf));
  }
  RuntimeHandle other(config_json({}));
  register_toy(other.rt, toy_groups(3));  // another model
  strata_status s = strata_load_checkpoint(other.rt, buf, nullptr, 0);
  EXPECT_TRUE(s == STRATA_ERR_CONFIG || s == STRATA_ERR_CORRUPT) << strata_status_name(s);
  EXPECT_NE(std::string(strata_last_error()).find("strata_load_checkpoint"), std::string::npos) << strata_last_error();
}
