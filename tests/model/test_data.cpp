// The data loader: text and llm.c token files, deterministic shuffled windows, each
// rank's slice of a global batch, positions that resume exactly, the held-out split,
// and a clear error for every kind of bad file.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/model/data.hpp"

using namespace strata;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("strata-data-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name, const std::string& bytes) const {
    const fs::path p = path / name;
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p.string();
  }
};

std::string some_text(size_t n) {
  const std::string base = "The quick brown fox jumps over the lazy dog; naïve café, 東京. ";
  std::string s;
  while (s.size() < n) s += base;
  // Cut at a character boundary: drop trailing UTF-8 continuation and lead bytes.
  s.resize(n);
  while (!s.empty() && (static_cast<unsigned char>(s.back()) & 0x80)) s.pop_back();
  return s;
}

// llm.c's write_datafile for gpt-2: 256 int32 (magic, version, count), uint16 tokens.
// Exactly n bytes of ASCII text.
std::string ascii_text(size_t n) {
  const std::string base = "It was the best of times, it was the worst of times. ";
  std::string s;
  while (s.size() < n) s += base;
  s.resize(n);
  return s;
}

std::string llmc_file(const std::vector<uint16_t>& toks, int32_t magic = kLlmcMagic, int32_t version = 1,
                      int64_t count = INT64_MIN) {
  std::vector<int32_t> h(256, 0);
  h[0] = magic;
  h[1] = version;
  h[2] = static_cast<int32_t>(count == INT64_MIN ? static_cast<int64_t>(toks.size()) : count);
  std::string s(reinterpret_cast<const char*>(h.data()), h.size() * 4);
  s.append(reinterpret_cast<const char*>(toks.data()), toks.size() * 2);
  return s;
}

template <class F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

}  // namespace

TEST(Data, TextWindowsAreBytesWithTargetsShiftedByOne) {
  TempDir dir;
  const std::string text = some_text(1000);
  const std::string path = dir.file("a.txt", text);
  const int T = 16;
  TokenDataset d(path, DataFormat::Auto, T, 256, 1, 0.1);
  EXPECT_EQ(d.format(), DataFormat::Text);
  EXPECT_EQ(d.tokens(), text.size());
  const uint64_t windows = (text.size() - 1) / T;
  EXPECT_EQ(d.train_windows() + d.heldout_windows(), windows);
  EXPECT_EQ(d.heldout_windows(), windows / 10);
  std::vector<int32_t> x(3 * T), y(3 * T);
  d.batch({}, 0, 1, 3, x.data(), y.data());
  const auto order = d.epoch_order(0);
  for (int r = 0; r < 3; ++r) {
    const uint64_t start = order[r] * T;
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(x[r * T + t], static_cast<unsigned char>(text[start + t]));
      EXPECT_EQ(y[r * T + t], static_cast<unsigned char>(text[start + t + 1]));
    }
  }
  EXPECT_HAS(d.describe(), "text");
}

TEST(Data, ShuffleIsAPermutationFixedBySeedAndEpoch) {
  TempDir dir;
  const std::string path = dir.file("a.txt", some_text(5000));
  TokenDataset a(path, DataFormat::Text, 8, 256, 42, 0.0), b(path, DataFormat::Text, 8, 256, 42, 0.0),
      c(path, DataFormat::Text, 8, 256, 43, 0.0);
  const auto o0 = a.epoch_order(0);
  std::set<uint64_t> seen(o0.begin(), o0.end());
  EXPECT_EQ(seen.size(), a.train_windows());
  EXPECT_EQ(*seen.rbegin(), a.train_windows() - 1);
  EXPECT_EQ(o0, b.epoch_order(0));
  EXPECT_NE(o0, a.epoch_order(1));
  EXPECT_NE(o0, c.epoch_order(0));
  std::vector<uint64_t> identity(o0.size());
  for (size_t i = 0; i < identity.size(); ++i) identity[i] = i;
  EXPECT_NE(o0, identity);
}

TEST(Data, RanksReadDisjointSlicesOfTheGlobalBatch) {
  TempDir dir;
  const std::string path = dir.file("a.txt", some_text(4000));
  const int T = 8, micro = 2, world = 3;
  TokenDataset d(path, DataFormat::Text, T, 256, 5, 0.0);
  DataPosition pos{};
  for (int step = 0; step < 5; ++step) {
    std::vector<int32_t> gx(world * micro * T), gy(gx.size());
    d.batch(pos, 0, 1, world * micro, gx.data(), gy.data());  // the whole global batch on one rank
    for (int r = 0; r < world; ++r) {
      std::vector<int32_t> x(micro * T), y(micro * T);
      d.batch(pos, r, world, micro, x.data(), y.data());
      EXPECT_TRUE(std::equal(x.begin(), x.end(), gx.begin() + r * micro * T)) << "rank " << r;
      EXPECT_TRUE(std::equal(y.begin(), y.end(), gy.begin() + r * micro * T)) << "rank " << r;
    }
    pos = d.advance(pos, world * micro);
  }
  EXPECT_EQ(pos.index, 5u * world * micro);
  EXPECT_EQ(pos.fingerprint, d.fingerprint());
}

TEST(Data, EpochsVisitEveryWindowOnceAndSkipAShortTail) {
  TempDir dir;
  const int T = 4;
  const std::string path = dir.file("a.txt", ascii_text(10 * T + 1));  // 10 windows
  TokenDataset d(path, DataFormat::Text, T, 256, 9, 0.0);
  ASSERT_EQ(d.train_windows(), 10u);
  const int n = 3;  // 3 batches per epoch, window 10 of the order skipped
  DataPosition pos{};
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<std::vector<int32_t>> rows;
    for (int b = 0; b < 3; ++b) {
      std::vector<int32_t> x(n * T), y(n * T);
      d.batch(pos, 0, 1, n, x.data(), y.data());
      for (int r = 0; r < n; ++r) rows.insert(std::vector<int32_t>(x.begin() + r * T, x.begin() + (r + 1) * T));
      pos = d.advance(pos, n);
      EXPECT_EQ(pos.epoch, epoch);
    }
    EXPECT_EQ(rows.size(), 9u) << "a window came twice in epoch " << epoch;
    EXPECT_EQ(pos.index, 9u);
  }
  EXPECT_EQ(d.advance(pos, n).epoch, 3u);
  EXPECT_EQ(d.advance(pos, n).index, 3u);
}

TEST(Data, APositionSavedAndRestoredContinuesExactlyAlsoAtAnotherWorldSize) {
  TempDir dir;
  const std::string path = dir.file("a.txt", some_text(1000));  // ~118 training windows
  const int T = 8;
  auto run = [&](DataPosition pos, int world, int micro, int batches, std::vector<std::vector<int32_t>>* out) {
    TokenDataset d(path, DataFormat::Text, T, 256, 77, 0.05);
    for (int b = 0; b < batches; ++b) {
      std::vector<int32_t> all;
      for (int r = 0; r < world; ++r) {
        std::vector<int32_t> x(micro * T), y(micro * T);
        d.batch(pos, r, world, micro, x.data(), y.data());
        all.insert(all.end(), x.begin(), x.end());
      }
      out->push_back(all);
      pos = d.advance(pos, static_cast<uint64_t>(world) * micro);
    }
    return pos;
  };
  std::vector<std::vector<int32_t>> straight, resumed;
  run({}, 2, 2, 40, &straight);  // crosses an epoch: 29 batches of 4 per epoch
  const DataPosition mid = run({}, 2, 2, 17, &resumed);
  const DataPosition back = DataPosition::from_json(nlohmann::json::parse(mid.to_json().dump()));
  EXPECT_EQ(back, mid);
  run(back, 4, 1, 23, &resumed);  // 4 ranks x 1 take the same windows as 2 x 2
  EXPECT_EQ(resumed, straight);
}

TEST(Data, HeldOutWindowsAreNeverTrainedOn) {
  TempDir dir;
  const int T = 8;
  const std::string text = ascii_text(100 * T + 1);  // 100 windows
  const std::string path = dir.file("a.txt", text);
  TokenDataset d(path, DataFormat::Text, T, 256, 3, 0.05);
  ASSERT_EQ(d.heldout_windows(), 5u);
  ASSERT_EQ(d.train_windows(), 95u);
  for (uint64_t w : d.epoch_order(0)) EXPECT_LT(w, 95u);
  std::vector<int32_t> x(2 * T), y(2 * T);
  ASSERT_TRUE(d.heldout_batch(0, 1, 2, 1, x.data(), y.data()));  // window 95 + 1
  for (int t = 0; t < T; ++t) EXPECT_EQ(x[t], static_cast<unsigned char>(text[96 * T + t]));
  EXPECT_TRUE(d.heldout_batch(1, 0, 2, 1, x.data(), y.data()));
  EXPECT_FALSE(d.heldout_batch(2, 0, 2, 1, x.data(), y.data()));  // windows 99, 100: only 5 held out
  TokenDataset none(path, DataFormat::Text, T, 256, 3, 0.0);
  EXPECT_FALSE(none.heldout_batch(0, 0, 1, 1, x.data(), y.data()));
}

TEST(Data, LlmcTokenFilesAreReadAndDetected) {
  TempDir dir;
  std::mt19937 rng(1);
  std::vector<uint16_t> toks(2000);
  for (auto& t : toks) t = static_cast<uint16_t>(rng() % 50257);
  const std::string path = dir.file("a.bin", llmc_file(toks));
  const int T = 32;
  for (DataFormat f : {DataFormat::Auto, DataFormat::Tokens}) {
    TokenDataset d(path, f, T, 50257, 1, 0.0);
    EXPECT_EQ(d.format(), DataFormat::Tokens);
    EXPECT_EQ(d.tokens(), toks.size());
    std::vector<int32_t> x(T), y(T);
    d.batch({}, 0, 1, 1, x.data(), y.data());
    const uint64_t start = d.epoch_order(0)[0] * T;
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(x[t], toks[start + t]);
      EXPECT_EQ(y[t], toks[start + t + 1]);
    }
  }
}

// llm.c's llama-3 layout (magic 20240801, version 7, uint32 tokens): ids beyond 65536 are
// read exactly, detected by "auto", checked against the vocabulary and the length.
TEST(Data, Uint32TokenFilesAreReadForLargeVocabularies) {
  TempDir dir;
  std::mt19937 rng(2);
  std::vector<uint32_t> toks(3000);
  for (auto& t : toks) t = static_cast<uint32_t>(rng() % 128256);
  toks[5] = 128255;
  std::vector<int32_t> h(256, 0);
  h[0] = 20240801;
  h[1] = 7;
  h[2] = static_cast<int32_t>(toks.size());
  std::string bytes(reinterpret_cast<const char*>(h.data()), h.size() * 4);
  bytes.append(reinterpret_cast<const char*>(toks.data()), toks.size() * 4);
  const std::string path = dir.file("llama.bin", bytes);
  const int T = 16;
  TokenDataset d(path, DataFormat::Auto, T, 128256, 1, 0.0);
  EXPECT_EQ(d.format(), DataFormat::Tokens);
  EXPECT_EQ(d.tokens(), toks.size());
  std::vector<int32_t> x(T), y(T);
  for (uint64_t w : {uint64_t{0}, uint64_t{7}, d.windows() - 1}) {
    d.window(w, x.data(), y.data());
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(x[t], static_cast<int32_t>(toks[w * T + t]));
      EXPECT_EQ(y[t], static_cast<int32_t>(toks[w * T + t + 1]));
    }
  }
  EXPECT_HAS(config_error([&] { TokenDataset(path, DataFormat::Tokens, T, 128000, 1, 0.0); }),
             "has token id 128255 (token 5), not below the model's vocabulary of 128000");
  std::string cut = bytes;
  cut.resize(cut.size() - 2);
  const std::string cut_path = dir.file("cut.bin", cut);
  EXPECT_HAS(config_error([&] { TokenDataset(cut_path, DataFormat::Auto, T, 128256, 1, 0.0); }),
             "but its header promises 3000 tokens, 13024 bytes (truncated)");
}

TEST(Data, BadFilesAreClearConfigErrors) {
  TempDir dir;
  const int T = 8;
  auto open = [&](const std::string& p, DataFormat f = DataFormat::Auto, int vocab = 256) {
    return config_error([&] { TokenDataset d(p, f, T, vocab, 1, 0.0); });
  };
  std::string m = open((dir.path / "missing.txt").string());
  EXPECT_HAS(m, "missing.txt' cannot be opened (No such file or directory)");
  EXPECT_HAS(m, "check strata.data.path");
  EXPECT_HAS(open(dir.file("empty.txt", "")), "empty.txt' is empty");
  EXPECT_HAS(open(dir.path.string()), "is not a regular file");
  m = open(dir.file("short.txt", "abcdefgh"));
  EXPECT_HAS(m, "has 8 tokens; one sample needs seq_len + 1 = 9");
  EXPECT_HAS(m, "smaller strata.model.seq_len");
  m = open(dir.file("nul.txt", some_text(100) + std::string(1, '\0') + some_text(100)));
  EXPECT_HAS(m, "nul.txt' is not text: byte ");
  EXPECT_HAS(m, "is a NUL byte");
  m = open(dir.file("latin1.txt", some_text(50) + "caf\xe9 au lait"));
  EXPECT_HAS(m, "(0xe9) begins a malformed UTF-8 sequence");
  EXPECT_HAS(m, "iconv");
  EXPECT_HAS(open(dir.file("ff.txt", some_text(50) + "\xff")), "(0xff) cannot begin a UTF-8 character");
  EXPECT_HAS(open(dir.file("cut.txt", some_text(50) + "\xe6\x9d")), "begins a UTF-8 character cut off by the end");
  EXPECT_HAS(open(dir.file("overlong.txt", some_text(50) + "\xc0\xaf")), "overlong");
  // A byte vocabulary smaller than the text needs.
  EXPECT_HAS(open(dir.file("a.txt", some_text(100)), DataFormat::Text, 100), "set strata.model.vocab to at least");

  std::vector<uint16_t> toks(100, 7);
  toks[42] = 300;
  const std::string good = dir.file("t.bin", llmc_file(toks));
  m = open(good, DataFormat::Auto, 256);
  EXPECT_HAS(m, "has token id 300 (token 42), not below the model's vocabulary of 256");
  EXPECT_HAS(m, "set strata.model.vocab to at least 301");
  EXPECT_HAS(open(good, DataFormat::Text), "is an llm.c token file (it begins with magic 20240520), not text");
  m = open(dir.file("magic.bin", llmc_file(toks, 12345)), DataFormat::Tokens, 1000);
  EXPECT_HAS(m, "has magic 12345, not llm.c's 20240520");
  EXPECT_HAS(open(dir.file("v2.bin", llmc_file(toks, kLlmcMagic, 2)), DataFormat::Auto, 1000),
             "has version 2; Strata reads version 1 of magic 20240520 (uint16 tokens)");
  EXPECT_HAS(open(dir.file("llama.bin", llmc_file(toks, 20240801, 1)), DataFormat::Auto, 1000),
             "has version 1; Strata reads version 7 of magic 20240801 (uint32 tokens)");
  std::string cut = llmc_file(toks);
  cut.resize(cut.size() - 10);
  m = open(dir.file("cut.bin", cut), DataFormat::Auto, 1000);
  EXPECT_HAS(m, "but its header promises 100 tokens, 1224 bytes (truncated)");
  EXPECT_HAS(open(dir.file("long.bin", llmc_file(toks) + "xx"), DataFormat::Auto, 1000), "(trailing bytes)");
  EXPECT_HAS(open(dir.file("hdr.bin", llmc_file({}).substr(0, 100)), DataFormat::Tokens, 1000),
             "shorter than an llm.c token file's header");
  EXPECT_HAS(open(dir.file("none.bin", llmc_file({})), DataFormat::Auto, 1000), "holds no tokens");
  EXPECT_HAS(open(dir.file("neg.bin", llmc_file(toks, kLlmcMagic, 1, -5)), DataFormat::Auto, 1000), "negative");

  EXPECT_HAS(config_error([] { parse_data_format("csv"); }), "use \"auto\", \"text\" or \"tokens\"");
}

// A FIFO (with no writer) or a device as the data path is refused at once, not waited on
// or read without end; the FIFO is this test's own.
TEST(Data, FifosAndDevicesAreRefusedWithoutBlocking) {
  TempDir dir;
  const std::string fifo = (dir.path / "data.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string m = config_error([&] { TokenDataset d(fifo, DataFormat::Auto, 8, 256, 1, 0.0); });
  EXPECT_HAS(m, "data file '" + fifo + "' is not a regular file (it is a FIFO (named pipe))");
  m = config_error([&] { TokenDataset d("/dev/zero", DataFormat::Auto, 8, 256, 1, 0.0); });
  EXPECT_HAS(m, "data file '/dev/zero' is not a regular file (it is a character device)");
}

// Windows are read from the open file as batches ask for them (not mapped): a file
// truncated while training is an IoError naming the file and the fix, never a SIGBUS.
TEST(Data, TruncatingTheFileWhileTrainingIsAnIoErrorNotACrash) {
  TempDir dir;
  const std::string text = some_text(4000);
  const std::string path = dir.file("a.txt", text);
  const int T = 16;
  TokenDataset d(path, DataFormat::Auto, T, 256, 1, 0.0);
  std::vector<int32_t> x(4 * T), y(4 * T);
  d.batch({}, 0, 1, 4, x.data(), y.data());
  fs::resize_file(path, 0);
  try {
    d.batch({}, 0, 1, 4, x.data(), y.data());
    FAIL() << "a batch of a truncated file was read";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("ended early (it was truncated or replaced"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("resume from the last checkpoint"), std::string::npos) << e.what();
  }
}

// A text file's UTF-8 is checked in chunks of 4 MiB: a character across a chunk's end is
// text, a bad byte past the first chunk is found with its offset.
TEST(Data, Utf8AcrossTheReadChunksIsCheckedWhole) {
  TempDir dir;
  std::string text(4u << 20, 'a');
  text[(4u << 20) - 1] = static_cast<char>(0xC3);  // U+00E9 split over the chunk boundary
  text += static_cast<char>(0xA9);
  text += std::string(100, 'b');
  const std::string good = dir.file("good.txt", text);
  EXPECT_EQ(TokenDataset(good, DataFormat::Text, 16, 256, 1, 0.0).tokens(), text.size());
  std::string bad = text;
  bad[(4u << 20) + 50] = '\0';
  const std::string badp = dir.file("bad.txt", bad);
  EXPECT_HAS(config_error([&] { TokenDataset(badp, DataFormat::Text, 16, 256, 1, 0.0); }),
             "byte " + std::to_string((4u << 20) + 50) + " (0x00) is a NUL byte");
}

TEST(Data, BatchesThatCannotWorkAndForeignPositionsAreRefused) {
  TempDir dir;
  const int T = 8;
  const std::string a = dir.file("a.txt", ascii_text(10 * T + 1)), b = dir.file("b.txt", ascii_text(20 * T + 1));
  TokenDataset d(a, DataFormat::Text, T, 256, 1, 0.0);
  std::vector<int32_t> x(16 * T), y(16 * T);
  EXPECT_HAS(config_error([&] { d.batch({}, 0, 4, 3, x.data(), y.data()); }),
             "has 10 training windows of 9 tokens, but one global batch needs 12 (4 ranks x train_micro_batch_size_per_gpu 3)");
  TokenDataset other(b, DataFormat::Text, T, 256, 1, 0.0);
  const DataPosition foreign = other.advance({}, 2);
  EXPECT_HAS(config_error([&] { d.batch(foreign, 0, 1, 1, x.data(), y.data()); }), "belongs to other data");
  // The same file with another seq_len is other data too.
  TokenDataset shorter(a, DataFormat::Text, T / 2, 256, 1, 0.0);
  EXPECT_HAS(config_error([&] { shorter.batch(d.advance({}, 1), 0, 1, 1, x.data(), y.data()); }),
             "belongs to other data");
  EXPECT_HAS(config_error([] { DataPosition::from_json({{"epoch", 1}}); }), "'index' is missing");
  EXPECT_HAS(config_error([] { DataPosition::from_json({{"epoch", 1}, {"index", 2}, {"fingerprint", "xyz"}}); }),
             "not 16 hex digits");
  EXPECT_EQ(DataPosition::from_json({{"epoch", 1}, {"index", 2}}), (DataPosition{1, 2, 0}));
}
