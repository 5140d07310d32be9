// core/output_guard.hpp (no output of a run is one of its inputs, or another output) and
// core/output_file.hpp (outputs written whole or not at all, records appended whole or
// not at all). Every path is in the test's own temporary directory; the full-disk cases
// mount a small tmpfs there (skipped without CAP_SYS_ADMIN).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "temp_dir.hpp"
#include "strata/core/output_file.hpp"
#include "strata/core/output_guard.hpp"

using namespace strata;
namespace fs = std::filesystem;

namespace {

struct TempDir : testing_core::TempDir {
  TempDir() : testing_core::TempDir("output_files") {}
};

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception";
  return "";
}

// A tmpfs of `bytes` at dir (unmounted on destruction), or nothing where mounting is refused.
struct SmallDisk {
  fs::path dir;
  bool mounted = false;
  SmallDisk(const fs::path& d, const char* size) : dir(d) {
    fs::create_directories(dir);
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, size) == 0;
  }
  ~SmallDisk() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
  }
  // Fills the disk but for `pages` pages of 4 KiB.
  void fill(int pages) const {
    const fs::space_info sp = fs::space(dir);
    const uint64_t size = sp.available - static_cast<uint64_t>(pages) * 4096;
    std::ofstream f(dir / "filler", std::ios::binary);
    const std::string block(4096, '\0');
    for (uint64_t n = 0; n < size; n += block.size()) f.write(block.data(), static_cast<std::streamsize>(block.size()));
  }
};

std::vector<std::string> temporaries(const fs::path& dir) {
  std::vector<std::string> t;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) t.push_back(e.path().string());
  return t;
}

}  // namespace

// One file under another spelling, a symbolic link or a hard link is the same file; each
// refusal names the output, the input and where each came from.
TEST(OutputGuard, AnInputUnderAnyNameIsRefused) {
  TempDir dir;
  const std::string data = dir.file("data.txt", "the training text");
  fs::create_directories(dir.path / "sub");
  fs::create_symlink(data, dir.path / "link.txt");
  fs::create_hard_link(data, dir.path / "hard.txt");
  const std::vector<RunPath> inputs = {{dir.file("cfg.json", "{}"), "the config file"}, {data, "strata.data.path"}};
  for (const std::string& out : {data, (dir.path / "sub" / ".." / "data.txt").string(), (dir.path / "link.txt").string(),
                                 (dir.path / "hard.txt").string()}) {
    const std::string msg =
        error_of<ConfigError>([&] { check_outputs_replace_no_input(inputs, {{out, "--metrics"}}); });
    EXPECT_HAS(msg, "--metrics '" + out + "' is the same file as strata.data.path '" + data + "'");
    EXPECT_HAS(msg, "give --metrics a path of its own");
  }
  EXPECT_EQ(read(data), "the training text");
}

// Outputs of their own pass: new names, other files, files inside an input directory.
TEST(OutputGuard, OutputsOfTheirOwnPass) {
  TempDir dir;
  const std::string data = dir.file("data.txt");
  const std::string old = dir.file("old-metrics.jsonl");
  fs::create_directories(dir.path / "swap");
  const std::vector<RunPath> inputs = {{data, "strata.data.path"}, {(dir.path / "swap").string(), "nvme_path"},
                                       {"", "the config file"}, {(dir.path / "missing.json").string(), "--hf"}};
  EXPECT_NO_THROW(check_outputs_replace_no_input(
      inputs, {{old, "--metrics"}, {(dir.path / "t.json").string(), "strata.trace"}, {"", "--json"},
               {(dir.path / "swap" / "t.json").string(), "--csv"}}));
}

// Two outputs given one name (existing or not yet) would replace each other; an output
// named as an input that does not exist yet (a directory the run creates) is that input.
TEST(OutputGuard, TwoOutputsOneNameAndNewNamesOfInputsAreRefused) {
  TempDir dir;
  const std::string fresh = (dir.path / "new.json").string();
  const std::string other_spelling = (dir.path / "." / "new.json").string();
  EXPECT_HAS(error_of<ConfigError>([&] {
               check_outputs_replace_no_input({}, {{fresh, "--metrics"}, {other_spelling, "strata.trace"}});
             }),
             "--metrics '" + fresh + "' and strata.trace '" + other_spelling + "' are the same file");
  const std::string existing = dir.file("r.json");
  EXPECT_THROW(check_outputs_replace_no_input({}, {{existing, "--json"}, {existing, "--csv"}}), ConfigError);
  const std::string swap = (dir.path / "swap").string();
  EXPECT_HAS(error_of<ConfigError>(
                 [&] { check_outputs_replace_no_input({{swap, "nvme_path"}}, {{swap + "/", "strata.trace"}}); }),
             "is the same file as nvme_path");
}

// A descriptor (standard output) counts when it is a regular file: appended to an input
// it is refused, naming where it goes; a pipe or /dev/null replaces nothing.
TEST(OutputGuard, StandardOutputCountsOnlyAsARegularFile) {
  TempDir dir;
  const std::string data = dir.file("data.txt");
  const std::vector<RunPath> inputs = {{data, "--data"}};
  const int fd = ::open(data.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const std::string msg =
      error_of<ConfigError>([&] { check_outputs_replace_no_input(inputs, {{"", "standard output", fd}}); });
  EXPECT_HAS(msg, "standard output (redirected to '" + data + "') is the same file as --data");
  EXPECT_HAS(msg, "redirect standard output to another file");
  ::close(fd);
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  EXPECT_NO_THROW(check_outputs_replace_no_input(inputs, {{"", "standard output", pipefd[1]},
                                                          {"", "standard error", null}, {"/dev/null", "--json"}}));
  ::close(pipefd[0]);
  ::close(pipefd[1]);
  ::close(null);
}

// A checkpoint's files are inputs one by one.
TEST(OutputGuard, FilesInListsTheRegularFilesOfADirectory) {
  TempDir dir;
  dir.file("ck/manifest.json");
  dir.file("ck/rank-0.bin");
  fs::create_directories(dir.path / "ck" / "nested");
  std::vector<std::string> names;
  for (const RunPath& p : files_in((dir.path / "ck").string(), "--checkpoint")) {
    EXPECT_EQ(p.what, "--checkpoint");
    names.push_back(fs::path(p.path).filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"manifest.json", "rank-0.bin"}));
  EXPECT_TRUE(files_in((dir.path / "missing").string(), "x").empty());
}

// ReplacingFile: the path holds the old contents until commit, the new ones after; an
// abandoned write leaves the old file and no temporary file.
TEST(OutputFile, ReplacingFileReplacesOnlyOnCommit) {
  TempDir dir;
  const std::string path = dir.file("trace.json", "earlier");
  {
    ReplacingFile f(path, "the trace file", "free space");
    f.stream() << "half";
    EXPECT_EQ(read(path), "earlier");
  }
  EXPECT_EQ(read(path), "earlier");
  EXPECT_TRUE(temporaries(dir.path).empty());
  write_file_replacing(path, std::string(200000, 'x'), "the trace file", "free space");
  EXPECT_EQ(read(path), std::string(200000, 'x'));
  EXPECT_TRUE(temporaries(dir.path).empty());
  // Through a symbolic link, the link's target is replaced and the link stays.
  fs::create_symlink(path, dir.path / "link.json");
  write_file_replacing((dir.path / "link.json").string(), "new", "the trace file", "free space");
  EXPECT_TRUE(fs::is_symlink(dir.path / "link.json"));
  EXPECT_EQ(read(path), "new");
}

// AppendedLines: whole lines; a file cut part-way through a line gets a newline first.
TEST(OutputFile, AppendedLinesStartOnALineOfTheirOwn) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl", "{\"step\": 1}\n{\"ste");
  {
    AppendedLines m(path, "the metrics file", "free space", OnWriteFailure::Throw);
    EXPECT_TRUE(m.append("{\"step\": 2}"));
    EXPECT_TRUE(m.append("{\"step\": 3}"));
  }
  EXPECT_EQ(read(path), "{\"step\": 1}\n{\"ste\n{\"step\": 2}\n{\"step\": 3}\n");
  AppendedLines closed;
  EXPECT_FALSE(closed.append("x"));
  EXPECT_THROW(AppendedLines((dir.path / "no" / "m.jsonl").string(), "the metrics file", "free space",
                             OnWriteFailure::Throw),
               IoError);
}

// On a full disk (a real tmpfs): ReplacingFile leaves the earlier file and no temporary
// one; AppendedLines leaves whole records only, and throws (Throw) or goes quiet after
// one warning (WarnAndStop). Several sizes, so the failure falls at several offsets.
TEST(OutputFile, FullDiskLosesNothingAndCutsNothing) {
  TempDir dir;
  SmallDisk disk(dir.path / "disk", "size=256k");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno) << "); needs CAP_SYS_ADMIN";
  const std::string earlier(3000, 'e');
  const std::string trace = (disk.dir / "trace.json").string();
  for (int pages : {0, 1, 3}) {
    std::ofstream(trace) << earlier;
    disk.fill(pages);
    const std::string msg = error_of<IoError>(
        [&] { write_file_replacing(trace, std::string(5 * 4096 * (pages + 1), 'n'), "the trace file", "make room"); });
    EXPECT_HAS(msg, "No space left on device");
    EXPECT_HAS(msg, "the disk is full: make room");
    EXPECT_EQ(read(trace), earlier) << pages << " pages free";
    EXPECT_TRUE(temporaries(disk.dir).empty());
    fs::remove(disk.dir / "filler");
  }
  const std::string record(1000, 'r');
  for (int pages : {0, 1, 2}) {
    for (OnWriteFailure mode : {OnWriteFailure::Throw, OnWriteFailure::WarnAndStop}) {
      const fs::path path = disk.dir / "m.jsonl";
      fs::remove(path);
      disk.fill(pages);
      AppendedLines m(path.string(), "the metrics file (--metrics)", "give --metrics room", mode);
      int written = 0;
      bool failed = false;
      for (int i = 0; i < 100 && !failed; ++i) {
        if (mode == OnWriteFailure::Throw) {
          try {
            m.append(record);
            ++written;
          } catch (const IoError& e) {
            EXPECT_HAS(std::string(e.what()), "appending a record to the metrics file (--metrics)");
            EXPECT_HAS(std::string(e.what()), "the disk is full: give --metrics room");
            failed = true;
          }
        } else if (m.append(record)) {
          ++written;
        } else {
          failed = true;
          EXPECT_FALSE(m.is_open());
          EXPECT_FALSE(m.append(record));
        }
      }
      EXPECT_TRUE(failed);
      EXPECT_EQ(fs::file_size(path), static_cast<uint64_t>(written) * (record.size() + 1))
          << pages << " pages free: a cut record is left";
      fs::remove(disk.dir / "filler");
    }
  }
}
