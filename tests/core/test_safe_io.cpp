// core/safe_io.hpp: which outputs may be written, inputs opened without blocking, JSON
// bounded in nesting. Every path here is in the test's own temporary directory, except
// /dev/null and /dev/zero, which are only stat()ed and opened for reading.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "strata/core/error.hpp"
#include "temp_dir.hpp"
#include "strata/core/safe_io.hpp"

using namespace strata;
namespace fs = std::filesystem;

namespace {

struct TempDir : testing_core::TempDir {
  TempDir() : testing_core::TempDir("safe_io") {}
};

std::string refusal(const std::string& path, const std::string& what = "--out") {
  try {
    check_output_path(path, what);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(SafeIo, OutputsAreRegularFilesOrNewNames) {
  TempDir dir;
  EXPECT_EQ(refusal((dir.path / "new.safetensors").string()), "");
  EXPECT_EQ(refusal(dir.file("old.safetensors")), "");
  EXPECT_HAS(refusal("/dev/null"), "--out '/dev/null' is a character device, not a regular file");
  EXPECT_HAS(refusal(dir.path.string()), "is a directory, not a regular file");
  const std::string fifo = (dir.path / "f.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_HAS(refusal(fifo, "--metrics"), "--metrics '" + fifo + "' is a FIFO (named pipe), not a regular file");
  // A symbolic link is followed: one to /dev/null is refused.
  fs::create_symlink("/dev/null", dir.path / "null-link");
  EXPECT_HAS(refusal((dir.path / "null-link").string()), "is a character device");
  EXPECT_HAS(refusal(""), "--out is empty");
  // A hard link to a checkpoint's shard, outside the checkpoint: appending metrics to it
  // would have corrupted the shard.
  const fs::path ck = dir.path / "run" / "step-00000004";
  fs::create_directories(ck);
  const std::string shard = dir.file("run/step-00000004/rank-0.bin");
  fs::create_hard_link(shard, dir.path / "metrics.jsonl");
  EXPECT_HAS(refusal((dir.path / "metrics.jsonl").string(), "--metrics"),
             "--metrics '" + (dir.path / "metrics.jsonl").string() + "' has 2 hard links");
}

// check_output_writable: a missing directory or an unwritable file is refused; nothing
// is created or changed by the check.
TEST(SafeIo, OutputsThatCannotBeWrittenAreRefusedLeavingNothing) {
  TempDir dir;
  const std::string fresh = (dir.path / "trace.json").string();
  EXPECT_NO_THROW(check_output_writable(fresh, "strata.trace"));
  EXPECT_FALSE(fs::exists(fresh));
  const std::string old = dir.file("old.json");
  const auto size = fs::file_size(old);
  EXPECT_NO_THROW(check_output_writable(old, "strata.trace"));
  EXPECT_EQ(fs::file_size(old), size);
  std::string m;
  try {
    check_output_writable((dir.path / "no" / "t.json").string(), "strata.trace");
  } catch (const ConfigError& e) {
    m = e.what();
  }
  EXPECT_HAS(m, "cannot be written (No such file or directory): give a file in an existing, writable directory");
}

TEST(SafeIo, NothingIsWrittenInsideACheckpoint) {
  TempDir dir;
  // A checkpoint as runtime/src/formats/checkpoint.cpp lays it out: root/step-<8 digits>/{manifest.json, rank-0.bin}.
  const fs::path step = dir.path / "ckpt" / "step-00000010";
  dir.file(step / "manifest.json", "{}");
  dir.file(step / "rank-0.bin");
  std::string m = refusal((step / "model.safetensors").string());
  EXPECT_HAS(m, "lies inside checkpoint directory '" + step.string() + "'");
  EXPECT_HAS(refusal((step / "rank-0.bin").string()), "lies inside checkpoint directory");
  EXPECT_HAS(refusal((step / "sub" / "x").string()), "lies inside checkpoint directory");
  // Through .. and through a symbolic link to it as well.
  EXPECT_HAS(refusal((dir.path / "ckpt" / "other" / ".." / "step-00000010" / "x").string()), "lies inside checkpoint");
  fs::create_directory_symlink(step, dir.path / "link");
  EXPECT_HAS(refusal((dir.path / "link" / "x").string()), "lies inside checkpoint directory");
  // A save in progress, and a copy renamed but still holding a manifest and rank files.
  fs::create_directory(dir.path / "ckpt" / ".step-00000020.tmp");
  EXPECT_HAS(refusal((dir.path / "ckpt" / ".step-00000020.tmp" / "x").string()), "lies inside checkpoint");
  dir.file(dir.path / "copy" / "manifest.json", "{}");
  dir.file(dir.path / "copy" / "rank-0.bin");
  EXPECT_HAS(refusal((dir.path / "copy" / "x").string()), "lies inside checkpoint directory");
  // Beside the checkpoints is fine, unless the name is one a checkpoint takes.
  EXPECT_EQ(refusal((dir.path / "ckpt" / "model.safetensors").string()), "");
  EXPECT_HAS(refusal((dir.path / "ckpt" / "step-00000030").string()), "takes the name of a checkpoint");
  // A manifest.json alone (some other tool's) is not a checkpoint; nor is step-1.
  dir.file(dir.path / "web" / "manifest.json", "{}");
  EXPECT_EQ(refusal((dir.path / "web" / "x").string()), "");
  EXPECT_EQ(refusal((dir.path / "step-1" / "x").string()), "");
}

TEST(SafeIo, InputsMustBeRegularFilesAndAreBounded) {
  TempDir dir;
  const auto read_error = [](const std::string& p, uint64_t max) {
    try {
      read_input_file(p, "config file", max);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(read_input_file(dir.file("a.json", "{\"a\": 1}"), "config file", 100), "{\"a\": 1}");
  const std::string fifo = (dir.path / "in.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_HAS(read_error(fifo, 100), "is not a regular file (it is a FIFO (named pipe)): give a regular file");
  EXPECT_HAS(read_error("/dev/zero", 100), "is not a regular file (it is a character device)");
  EXPECT_HAS(read_error(dir.file("big.json", std::string(101, ' ')), 100), "is 101 B, more than the 100 B a config file may be");
  EXPECT_HAS(read_error((dir.path / "missing.json").string(), 100), "cannot be opened (No such file or directory)");
}

TEST(SafeIo, JsonNestingIsBoundedBeforeParsing) {
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": "]]]}}}"}]})", 64), 3u);
  size_t at = 0;
  EXPECT_EQ(json_nesting_depth(std::string(100000, '['), 64, &at), 65u);
  EXPECT_EQ(at, 64u);
  EXPECT_TRUE(parse_untrusted_json(std::string(100000, '[') + std::string(100000, ']')).is_discarded());
  EXPECT_TRUE(parse_untrusted_json(R"({"x": 1e400})").is_discarded());
  EXPECT_TRUE(parse_untrusted_json("{").is_discarded());
  EXPECT_EQ(parse_untrusted_json(R"({"x": [1, 2]})")["x"][1], 2);
}

}  // namespace
