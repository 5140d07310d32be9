// Reading safetensors files (https://github.com/huggingface/safetensors, "Format"), the
// weights of Hugging Face checkpoints: 8 bytes, the header's length N as a little-endian
// uint64; N bytes of a JSON object (UTF-8, beginning with '{', padded with spaces at the
// end) mapping each tensor's name to {"dtype", "shape", "data_offsets": [begin, end]},
// and an optional "__metadata__" of strings; then the byte buffer the offsets index
// (relative to its start, 8 + N).
//
// The header is checked as the safetensors package's own reader checks it, before any
// tensor byte is touched: N at most 100,000,000 and inside the file; valid JSON, no key
// twice, nested at most kMaxJsonDepth; a known dtype; a shape of non-negative integers
// whose element count times the dtype's size is the tensor's byte length, without
// overflow; tensors that tile the buffer exactly, from its first byte to the file's end,
// with neither gaps nor overlaps. Anything else is a CorruptionError naming the file, the
// tensor and the problem. So every (offset, bytes) returned lies inside the file.
// (export.hpp writes these files; this reads them.)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // as the file says: "F32", "BF16", "F16", "I64", ...
  uint32_t element_bytes = 0;   // of that dtype
  std::vector<uint64_t> shape;  // [] for a scalar
  uint64_t numel = 0;           // product of shape (1 for a scalar)
  uint64_t offset = 0;          // of its first byte in the file (not in the buffer)
  uint64_t bytes = 0;           // numel x element_bytes
};

struct SafetensorsHeader {
  uint64_t file_bytes = 0;
  uint64_t data_start = 0;                       // 8 + N
  std::vector<SafetensorsTensor> tensors;        // in file order (by offset)
  std::map<std::string, std::string> metadata;   // "__metadata__"
  // The tensor of that name, or nullptr.
  const SafetensorsTensor* find(std::string_view name) const;
};

// The largest header the safetensors package reads (its MAX_HEADER_SIZE).
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

// Checks and parses a header. `head`: the file's first bytes, at least 8 + N of them
// when the file has that many (fewer is a truncated header); `file_bytes`: the file's
// size; `where` names it in messages ("safetensors file 'model.safetensors'").
SafetensorsHeader parse_safetensors_header(std::string_view head, uint64_t file_bytes, const std::string& where);

// The header of the file at `path` (a regular file; open_input_file's rules), reading
// only the header's bytes. IoError on a failed read.
SafetensorsHeader read_safetensors_header(const std::string& path);

}  // namespace strata
