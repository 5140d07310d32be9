#include "strata/model/data.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/safe_io.hpp"

namespace strata {

namespace {

constexpr int32_t kLlama3Magic = 20240801;  // llm.c's uint32 token files (llama-3 layout)
constexpr int32_t kLlama3Version = 7;

uint64_t splitmix(uint64_t& state) {
  uint64_t x = (state += 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string human(uint64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1 << 30) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
  else if (b >= 1 << 20) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
  else if (b >= 1 << 10) std::snprintf(buf, sizeof buf, "%.1f KiB", b / (1 << 10));
  else std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  return buf;
}

}  // namespace

const char* to_string(DataFormat f) {
  switch (f) {
    case DataFormat::Auto: return "auto";
    case DataFormat::Text: return "text";
    case DataFormat::Tokens: return "tokens";
  }
  return "?";
}

DataFormat parse_data_format(const std::string& s) {
  if (s == "auto") return DataFormat::Auto;
  if (s == "text") return DataFormat::Text;
  if (s == "tokens") return DataFormat::Tokens;
  throw ConfigError("strata.data.format '" + s + "' is not a data format: use \"auto\", \"text\" or \"tokens\"");
}

nlohmann::json DataPosition::to_json() const {
  return {{"epoch", epoch}, {"index", index}, {"fingerprint", hex64(fingerprint)}};
}

DataPosition DataPosition::from_json(const nlohmann::json& j) {
  const std::string fix = " in the checkpoint's data position (extra.data): it was not written by strata train, or "
                          "is damaged; resume from another checkpoint";
  if (!j.is_object()) throw ConfigError("the data position is not an object" + fix);
  DataPosition p;
  for (const char* k : {"epoch", "index"}) {
    if (!j.contains(k) || !j[k].is_number_integer() || j[k].get<int64_t>() < 0) throw ConfigError(std::string("'") + k + "' is missing or not a count" + fix);
  }
  p.epoch = j["epoch"].get<uint64_t>();
  p.index = j["index"].get<uint64_t>();
  if (j.contains("fingerprint")) {
    const auto& f = j["fingerprint"];
    if (!f.is_string() || f.get<std::string>().size() != 16 ||
        f.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
      throw ConfigError("'fingerprint' is not 16 hex digits" + fix);
    p.fingerprint = std::stoull(f.get<std::string>(), nullptr, 16);
  }
  return p;
}

struct TokenDataset::Impl {
  std::string path;
  DataFormat format = DataFormat::Text;
  int seq_len = 0;
  uint64_t seed = 0;
  // The file stays open and windows are read from it as batches ask for them (pread): not
  // read whole, so a data file may be far larger than memory, and not mapped, so a file
  // truncated while training is a clear error rather than a SIGBUS.
  int fd = -1;
  uint64_t file_bytes = 0;
  uint64_t data_offset = 0;        // where the tokens start (after an llm.c header)
  int elem = 1;                    // bytes per token: 1 text, 2 llm.c uint16, 4 llm.c uint32
  uint64_t count = 0;              // tokens
  uint64_t train = 0, heldout = 0; // windows
  uint64_t fingerprint = 0;
  // The order of the last epoch asked for (batch() is called once per micro-step).
  mutable uint64_t cached_epoch = UINT64_MAX;
  mutable std::vector<uint64_t> order;

  ~Impl() {
    if (fd >= 0) ::close(fd);
  }
  // bytes [offset, offset + n) of the file into buf; a short read means the file changed.
  void read_at(void* buf, uint64_t n, uint64_t offset) const {
    auto* p = static_cast<char*>(buf);
    uint64_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw IoError("data file '" + path + "': " +
                          (got == 0 ? "ended early (it was truncated or replaced after strata opened it)"
                                    : std::string("read failed")) +
                          "; restore the file the run started with and resume from the last checkpoint",
                      path, offset + done, n - done, got == 0 ? EIO : errno);
      done += static_cast<uint64_t>(got);
    }
  }
  void window(uint64_t w, int32_t* x, int32_t* y) const {
    const uint64_t s = w * static_cast<uint64_t>(seq_len), n = static_cast<uint64_t>(seq_len) + 1;
    std::vector<unsigned char> buf(n * static_cast<uint64_t>(elem));
    read_at(buf.data(), buf.size(), data_offset + s * static_cast<uint64_t>(elem));
    // Ids are below the vocabulary (checked at open, <= 2^24): they fit an int32.
    auto token = [&](uint64_t i) -> int32_t {
      if (elem == 1) return buf[i];
      if (elem == 2) {
        uint16_t v;
        std::memcpy(&v, buf.data() + 2 * i, 2);
        return v;
      }
      uint32_t v;
      std::memcpy(&v, buf.data() + 4 * i, 4);
      return static_cast<int32_t>(v);
    };
    for (int t = 0; t < seq_len; ++t) {
      x[t] = token(static_cast<uint64_t>(t));
      y[t] = token(static_cast<uint64_t>(t) + 1);
    }
  }
  // Calls f(chunk, bytes, first token index) over the tokens in chunks of whole tokens.
  template <typename F>
  void scan(F&& f) const {
    constexpr uint64_t kChunk = 4u << 20;
    std::vector<unsigned char> buf(kChunk);
    const uint64_t total = count * static_cast<uint64_t>(elem);
    for (uint64_t off = 0; off < total; off += kChunk) {
      const uint64_t n = std::min<uint64_t>(kChunk, total - off);
      read_at(buf.data(), n, data_offset + off);
      f(buf.data(), n, off / static_cast<uint64_t>(elem));
    }
  }
  [[noreturn]] void fail(const std::string& what, const std::string& fix) const {
    throw ConfigError("data file '" + path + "' " + what + ": " + fix);
  }
  // The constructor's checks of the file, and what they learn of it.
  void check_text(bool llmc, int32_t first);
  void read_llmc_header(const unsigned char* raw);
  void scan_ids(int vocab);
};

// A text file: UTF-8 throughout. llmc: it begins with an llm.c magic number (first).
void TokenDataset::Impl::check_text(bool llmc, int32_t first) {
  elem = 1;
  count = file_bytes;
  // UTF-8 checked chunk by chunk; a character cut by a chunk's end is checked with the next.
  const char* why = "";
  uint64_t bad = file_bytes;
  unsigned char bad_byte = 0;
  std::vector<unsigned char> buf(4u << 20);
  for (uint64_t off = 0; off < file_bytes && bad == file_bytes;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), file_bytes - off);
    read_at(buf.data(), n, off);
    const uint64_t at = first_non_text(buf.data(), n, &why);
    const bool cut = at != n && off + n < file_bytes && at + 4 > n;  // maybe whole in the next chunk
    if (at != n && !cut) bad = off + at, bad_byte = buf[at];
    off += cut ? at : n;
  }
  if (bad != file_bytes) {
    if (llmc)
      fail("is an llm.c token file (it begins with magic " + std::to_string(first) + "), not text",
           "set strata.data.format to \"tokens\" or \"auto\"");
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", bad_byte);
    fail("is not text: byte " + std::to_string(bad) + " (" + byte + ") " + why,
         "byte-level training reads UTF-8 text; convert the file to UTF-8 (iconv -t UTF-8), or give token "
         "data as an llm.c token file with strata.data.format \"tokens\"");
  }
}

// An llm.c token file: its header (raw, the file's first bytes) checked against the file.
void TokenDataset::Impl::read_llmc_header(const unsigned char* raw) {
  const uint64_t header = kLlmcHeaderInts * 4;
  if (file_bytes < header)
    fail("is " + std::to_string(file_bytes) + " bytes, shorter than an llm.c token file's header (" +
             std::to_string(header) + " bytes)",
         "write it with llm.c's write_datafile, or use strata.data.format \"text\" for a text file");
  int32_t h[3];
  std::memcpy(h, raw, sizeof h);
  // Two layouts (llm.c's dev/data/data_common.py): gpt-2, uint16 tokens; llama-3,
  // uint32 tokens for vocabularies beyond 65536.
  if (h[0] != kLlmcMagic && h[0] != kLlama3Magic)
    fail("has magic " + std::to_string(h[0]) + ", not llm.c's " + std::to_string(kLlmcMagic) + " (gpt-2) or " +
             std::to_string(kLlama3Magic) + " (llama-3)",
         "it is not an llm.c token file: write it with llm.c's write_datafile, or use strata.data.format "
         "\"text\" (or \"auto\") for a text file");
  const bool wide = h[0] == kLlama3Magic;
  const int32_t want_version = wide ? kLlama3Version : kLlmcVersion;
  if (h[1] != want_version)
    fail("has version " + std::to_string(h[1]) + "; Strata reads version " + std::to_string(want_version) +
             " of magic " + std::to_string(h[0]) + (wide ? " (uint32 tokens)" : " (uint16 tokens)"),
         std::string("write it with llm.c's write_datafile for ") + (wide ? "llama-3" : "gpt-2"));
  if (h[2] < 0) fail("has a negative token count " + std::to_string(h[2]), "the header is damaged; write the file again");
  const int width = wide ? 4 : 2;
  const uint64_t n = static_cast<uint64_t>(h[2]), want = header + static_cast<uint64_t>(width) * n;
  if (file_bytes != want)
    fail("is " + std::to_string(file_bytes) + " bytes but its header promises " + std::to_string(n) +
             " tokens, " + std::to_string(want) + " bytes" + (file_bytes < want ? " (truncated)" : " (trailing bytes)"),
         "the file is damaged or incomplete; write it again");
  if (n == 0) fail("holds no tokens", "give a file with at least seq_len + 1 = " + std::to_string(seq_len + 1) + " tokens");
  elem = width;
  data_offset = header;
  count = n;
}

// One pass over the tokens for the largest id, which must be below vocab (every id must
// have an embedding row), and the fingerprint.
void TokenDataset::Impl::scan_ids(int vocab) {
  uint32_t max_id = 0;
  uint64_t max_at = 0;
  XXH3_state_t* hs = XXH3_createState();
  XXH3_64bits_reset(hs);
  const int32_t tag[2] = {seq_len, static_cast<int32_t>(format)};
  XXH3_64bits_update(hs, tag, sizeof tag);
  try {
    scan([&](const unsigned char* p, uint64_t n, uint64_t first_token) {
      XXH3_64bits_update(hs, p, n);
      for (uint64_t i = 0; i < n / static_cast<uint64_t>(elem); ++i) {
        uint32_t t = p[i];
        if (elem == 2) {
          uint16_t v;
          std::memcpy(&v, p + 2 * i, 2);
          t = v;
        } else if (elem == 4) {
          std::memcpy(&t, p + 4 * i, 4);
        }
        if (t > max_id) max_id = t, max_at = first_token + i;
      }
    });
  } catch (...) {
    XXH3_freeState(hs);
    throw;
  }
  fingerprint = XXH3_64bits_digest(hs);
  XXH3_freeState(hs);
  if (fingerprint == 0) fingerprint = 1;  // 0 means "no data" in a DataPosition
  if (max_id >= static_cast<uint32_t>(vocab))
    fail("has token id " + std::to_string(max_id) + " (token " + std::to_string(max_at) +
             "), not below the model's vocabulary of " + std::to_string(vocab),
         "set strata.model.vocab to at least " + std::to_string(max_id + 1) +
             (format == DataFormat::Text ? " (256 covers every byte)"
                                          : " (GPT-2's tokenizer needs 50257, Llama 3's 128256)"));
}

TokenDataset::TokenDataset(const std::string& path, DataFormat format, int seq_len, int vocab, uint64_t seed,
                           double heldout_fraction)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.path = path;
  d.seq_len = seq_len;
  d.seed = seed;
  if (seq_len < 1) throw ConfigError("the sequence length must be at least 1, not " + std::to_string(seq_len));
  if (vocab < 1) throw ConfigError("the vocabulary must have at least 1 token, not " + std::to_string(vocab));
  if (!(heldout_fraction >= 0.0 && heldout_fraction < 1.0))
    throw ConfigError("the held-out fraction must be in [0, 1), not " + std::to_string(heldout_fraction));
  if (path.empty()) throw ConfigError("no data file given: set strata.data.path to a text file or an llm.c token file");

  // A FIFO or a device is refused before a byte is read (core/safe_io.hpp).
  struct stat st {};
  d.fd = open_input_file(path, "data file", &st, "strata.data.path");
  d.file_bytes = static_cast<uint64_t>(st.st_size);
  if (d.file_bytes == 0)
    d.fail("is empty", "give a file with at least seq_len + 1 = " + std::to_string(seq_len + 1) + " tokens");
  unsigned char head[kLlmcHeaderInts * 4] = {};
  d.read_at(head, std::min<uint64_t>(sizeof head, d.file_bytes), 0);
  const unsigned char* raw = head;
  int32_t first = 0;
  if (d.file_bytes >= 4) std::memcpy(&first, raw, 4);
  const bool llmc = first == kLlmcMagic || first == kLlama3Magic;

  if (format == DataFormat::Auto) format = llmc ? DataFormat::Tokens : DataFormat::Text;
  d.format = format;
  if (format == DataFormat::Text)
    d.check_text(llmc, first);
  else
    d.read_llmc_header(raw);
  d.scan_ids(vocab);

  if (d.count < static_cast<uint64_t>(seq_len) + 1)
    d.fail("has " + std::to_string(d.count) + " tokens; one sample needs seq_len + 1 = " + std::to_string(seq_len + 1),
           "use a longer file or a smaller strata.model.seq_len");
  const uint64_t windows = (d.count - 1) / static_cast<uint64_t>(seq_len);
  d.heldout = static_cast<uint64_t>(static_cast<double>(windows) * heldout_fraction);
  d.train = windows - d.heldout;  // >= 1: the fraction is below 1 and rounds down
}

TokenDataset::~TokenDataset() = default;
TokenDataset::TokenDataset(TokenDataset&&) noexcept = default;
TokenDataset& TokenDataset::operator=(TokenDataset&&) noexcept = default;

std::vector<uint64_t> TokenDataset::epoch_order(uint64_t epoch) const {
  const Impl& d = *impl_;
  std::vector<uint64_t> order(d.train);
  for (uint64_t i = 0; i < d.train; ++i) order[i] = i;
  // Fisher-Yates with our own generator: std::shuffle's algorithm differs between
  // standard libraries, and the order must be the same everywhere.
  uint64_t state = d.seed ^ (0xd1b54a32d192ed03ull * (epoch + 1));
  for (uint64_t i = d.train; i > 1; --i) {
    const uint64_t j = static_cast<uint64_t>((static_cast<unsigned __int128>(splitmix(state)) * i) >> 64);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

namespace {
DataPosition normalized(const DataPosition& pos, uint64_t n, uint64_t train) {
  if (pos.index + n > train) return {pos.epoch + 1, 0, pos.fingerprint};
  return pos;
}
}  // namespace

void TokenDataset::batch(const DataPosition& pos, int rank, int world, int micro_batch, int32_t* x, int32_t* y) const {
  const Impl& d = *impl_;
  if (pos.fingerprint != 0 && pos.fingerprint != d.fingerprint)
    throw ConfigError("the data position (from a checkpoint) belongs to other data than '" + d.path +
                      "' (the file's contents or strata.model.seq_len changed): resume with the data the run "
                      "started with, or start a new run");
  const uint64_t n = static_cast<uint64_t>(world) * static_cast<uint64_t>(micro_batch);
  if (n > d.train)
    throw ConfigError("data file '" + d.path + "' has " + std::to_string(d.train) + " training windows of " +
                      std::to_string(d.seq_len + 1) + " tokens, but one global batch needs " + std::to_string(n) +
                      " (" + std::to_string(world) + " ranks x train_micro_batch_size_per_gpu " +
                      std::to_string(micro_batch) + "): use more data, a smaller micro-batch or a shorter seq_len");
  STRATA_CHECK(rank >= 0 && rank < world, "batch: rank " + std::to_string(rank) + " of " + std::to_string(world));
  const DataPosition p = normalized(pos, n, d.train);
  if (d.cached_epoch != p.epoch) {
    d.order = epoch_order(p.epoch);
    d.cached_epoch = p.epoch;
  }
  const uint64_t first = p.index + static_cast<uint64_t>(rank) * micro_batch;
  for (int i = 0; i < micro_batch; ++i)
    d.window(d.order[first + i], x + static_cast<size_t>(i) * d.seq_len, y + static_cast<size_t>(i) * d.seq_len);
}

DataPosition TokenDataset::advance(const DataPosition& pos, uint64_t n) const {
  DataPosition p = normalized(pos, n, impl_->train);
  p.index += n;
  p.fingerprint = impl_->fingerprint;
  return p;
}

bool TokenDataset::heldout_batch(uint64_t b, int rank, int world, int micro_batch, int32_t* x, int32_t* y) const {
  const Impl& d = *impl_;
  const uint64_t n = static_cast<uint64_t>(world) * static_cast<uint64_t>(micro_batch);
  if ((b + 1) * n > d.heldout) return false;
  const uint64_t first = d.train + b * n + static_cast<uint64_t>(rank) * micro_batch;
  for (int i = 0; i < micro_batch; ++i)
    d.window(first + i, x + static_cast<size_t>(i) * d.seq_len, y + static_cast<size_t>(i) * d.seq_len);
  return true;
}

void TokenDataset::window(uint64_t w, int32_t* x, int32_t* y) const {
  STRATA_CHECK(w < windows(), "window " + std::to_string(w) + " of " + std::to_string(windows()));
  impl_->window(w, x, y);
}
uint64_t TokenDataset::windows() const { return impl_->train + impl_->heldout; }

DataFormat TokenDataset::format() const { return impl_->format; }
const std::string& TokenDataset::path() const { return impl_->path; }
uint64_t TokenDataset::tokens() const { return impl_->count; }
uint64_t TokenDataset::train_windows() const { return impl_->train; }
uint64_t TokenDataset::heldout_windows() const { return impl_->heldout; }
uint64_t TokenDataset::fingerprint() const { return impl_->fingerprint; }
int TokenDataset::seq_len() const { return impl_->seq_len; }

std::string TokenDataset::describe() const {
  const Impl& d = *impl_;
  return std::string(to_string(d.format)) + ", " + human(d.file_bytes) + ": " + std::to_string(d.count) + " tokens, " +
         std::to_string(d.train) + " training windows of " + std::to_string(d.seq_len + 1) + " tokens, " +
         std::to_string(d.heldout) + " held out";
}

}  // namespace strata
