// Training data for the GPT: a file of tokens cut into sample windows, shuffled by seed,
// each rank reading its own slice of every global batch.
//
// Formats (strata.data.format):
//   "text"    any UTF-8 text file, one token per byte (vocabulary 256). A file with a NUL
//             byte or a byte sequence that is not UTF-8 is refused as "not text": that
//             is binary data (or text in another encoding: convert it with iconv), and
//             training a byte-level model on it is almost certainly a mistake.
//   "tokens"  llm.c's token files (dev/data/data_common.py, write_datafile): a header of
//             256 little-endian int32 (magic, version, token count), then that many
//             tokens: magic 20240520 version 1 ("gpt-2"), uint16 tokens; magic 20240801
//             version 7 ("llama-3"), uint32 tokens, for vocabularies beyond 65536. Every
//             token must be below the model's vocabulary.
//   "auto"    "tokens" when the file begins with either llm.c magic, else "text".
//
// Samples: the tokens are cut into windows of seq_len + 1 tokens, window i starting at
// token i * seq_len (consecutive windows share one token): inputs are its first seq_len
// tokens, targets the last seq_len (the inputs shifted by one). The last
// heldout_fraction of the windows (rounded down) is held out for evaluation, never
// trained on; the rest are the training windows.
//
// Order: epoch e visits every training window once, in a permutation that depends only
// on (seed, e). A global batch is n = world x micro_batch consecutive windows of that
// order; rank r reads windows [r x micro_batch, (r + 1) x micro_batch) of it. When fewer
// than n windows are left in an epoch, they are skipped and the batch starts the next
// epoch, so every global batch is whole.
//
// A DataPosition (epoch, index into that epoch's order) is all the state there is:
// stored in a checkpoint's extra, it continues the run exactly, also at another world
// size (the next global batch starts at the same window). It carries a fingerprint of
// the data (file contents and seq_len), so a resume on other data is refused.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata {

enum class DataFormat { Auto, Text, Tokens };
const char* to_string(DataFormat f);
// "auto", "text", "tokens"; anything else is a ConfigError naming the choices.
DataFormat parse_data_format(const std::string& s);

// llm.c's token file header (256 int32).
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int kLlmcHeaderInts = 256;

struct DataPosition {
  uint64_t epoch = 0;        // passes over the training windows completed
  uint64_t index = 0;        // windows of this epoch's order already consumed
  uint64_t fingerprint = 0;  // of the data it belongs to; 0 = not yet tied to any

  // {"epoch": e, "index": i, "fingerprint": "<16 hex digits>"}: what a checkpoint's
  // extra["data"] holds. from_json throws ConfigError when a field is missing or wrong.
  nlohmann::json to_json() const;
  static DataPosition from_json(const nlohmann::json& j);
  bool operator==(const DataPosition&) const = default;
};

class TokenDataset {
 public:
  // Maps and checks the whole file (formats above). Throws ConfigError naming the path,
  // the problem and the fix: missing or unreadable file, empty file, non-text data in
  // a text file, a token file with a bad magic, version or length, a token id at or
  // above `vocab`, fewer than seq_len + 1 tokens.
  TokenDataset(const std::string& path, DataFormat format, int seq_len, int vocab, uint64_t seed,
               double heldout_fraction = 0.05);
  // From the configuration's data section (strata.data: path and format string).
  template <class DataSection>
    requires requires(const DataSection& d) {
      { d.path } -> std::convertible_to<std::string>;
      { d.format } -> std::convertible_to<std::string>;
    }
  TokenDataset(const DataSection& d, int seq_len, int vocab, uint64_t seed, double heldout_fraction = 0.05)
      : TokenDataset(d.path, parse_data_format(d.format), seq_len, vocab, seed, heldout_fraction) {}
  ~TokenDataset();
  TokenDataset(TokenDataset&&) noexcept;
  TokenDataset& operator=(TokenDataset&&) noexcept;

  // This rank's micro_batch samples of the global batch at `pos` (world x micro_batch
  // windows): x, y [micro_batch, seq_len] token ids (inputs; targets = inputs shifted
  // by one). Throws ConfigError when a global batch needs more windows than the
  // training split has, or when pos belongs to other data.
  void batch(const DataPosition& pos, int rank, int world, int micro_batch, int32_t* x, int32_t* y) const;
  // The position after the global batch of n = world x micro_batch windows at pos.
  DataPosition advance(const DataPosition& pos, uint64_t n) const;
  // Held-out global batch b (in file order, not shuffled): this rank's slice, as
  // batch(). Returns false (and writes nothing) when the held-out split has fewer than
  // (b + 1) x world x micro_batch windows.
  bool heldout_batch(uint64_t b, int rank, int world, int micro_batch, int32_t* x, int32_t* y) const;

  // Window w of the file, in file order (0 <= w < windows(): the training windows, then
  // the held-out ones), as batch() writes one: x, y [seq_len]. For evaluation over the
  // whole file (`strata eval`).
  void window(uint64_t w, int32_t* x, int32_t* y) const;
  uint64_t windows() const;               // train_windows() + heldout_windows()

  DataFormat format() const;              // Text or Tokens (never Auto)
  const std::string& path() const;
  uint64_t tokens() const;                // in the file
  uint64_t train_windows() const;
  uint64_t heldout_windows() const;
  uint64_t fingerprint() const;           // xxh3 of (seq_len, format, tokens)
  int seq_len() const;
  // "text, 1.2 MiB: 1234567 tokens, 9000 training windows of 129 tokens, 473 held out"
  std::string describe() const;

  // The training windows' order in epoch e (a permutation of 0 .. train_windows-1).
  std::vector<uint64_t> epoch_order(uint64_t epoch) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
