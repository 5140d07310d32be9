// safetensors headers: checked before use (safetensors.hpp).
#include "strata/runtime/formats/safetensors.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"
#include "strata/core/safe_io.hpp"

namespace strata {

using nlohmann::json;

namespace {

// The dtypes of the safetensors format with a whole number of bytes per element.
uint32_t element_bytes_of(const std::string& dtype) {
  static const std::pair<const char*, uint32_t> kTypes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  for (const auto& [name, bytes] : kTypes)
    if (dtype == name) return bytes;
  return 0;
}

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 80)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return s.size() > 80 ? out + "..." : out;
}

// The header's JSON text as an object, refused when damaged: invalid, too deep, or naming
// a key twice.
json parse_header_json(std::string_view text, const std::string& where, const std::string& damaged) {
  // Duplicate keys: which one wins would be the parser's choice, so none is taken.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  json::parser_callback_t on_event = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) keys.emplace_back();
    if (ev == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (ev == json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json j;
  if (json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth)
    throw CorruptionError(where + ": its header nests deeper than " + std::to_string(kMaxJsonDepth) + damaged);
  try {
    j = json::parse(text, on_event);
  } catch (const json::exception& e) {
    throw CorruptionError(where + ": its header is not valid JSON (" + e.what() + ")" + damaged);
  }
  if (!duplicate.empty())
    throw CorruptionError(where + ": its header names '" + printable(duplicate) + "' twice" + damaged);
  if (!j.is_object()) throw CorruptionError(where + ": its header is not a JSON object" + damaged);
  return j;
}

// Tensor `name`'s entry v: its dtype, shape and data_offsets checked, the offsets within
// the `buffer` bytes of tensor data that start at data_start.
SafetensorsTensor parse_tensor(const std::string& name, const json& v, uint64_t data_start, uint64_t buffer,
                               const std::string& where, const std::string& damaged) {
  const std::string tensor = where + ": tensor '" + printable(name) + "'";
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
      v.size() != 3)
    throw CorruptionError(tensor + " is not {\"dtype\", \"shape\", \"data_offsets\"}" + damaged);
  SafetensorsTensor t;
  t.name = name;
  if (!v["dtype"].is_string()) throw CorruptionError(tensor + " has a dtype that is not a string" + damaged);
  t.dtype = v["dtype"].get<std::string>();
  t.element_bytes = element_bytes_of(t.dtype);
  if (t.element_bytes == 0)
    throw CorruptionError(tensor + " has dtype '" + printable(t.dtype) +
                          "', which Strata does not read (BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, "
                          "I32, U32, F32, F64, I64, U64)");
  if (!v["shape"].is_array()) throw CorruptionError(tensor + " has a shape that is not a list" + damaged);
  t.numel = 1;
  for (const auto& d : v["shape"]) {
    if (!d.is_number_unsigned())
      throw CorruptionError(tensor + " has a shape entry " + printable(d.dump()) +
                            " that is not a non-negative integer" + damaged);
    const uint64_t dim = d.get<uint64_t>();
    t.shape.push_back(dim);
    if (__builtin_mul_overflow(t.numel, dim, &t.numel))
      throw CorruptionError(tensor + " has a shape whose element count overflows 64 bits" + damaged);
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    throw CorruptionError(tensor + " has data_offsets " + printable(off.dump()) + ", not [begin, end]" + damaged);
  const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  if (begin > end || end > buffer)
    throw CorruptionError(tensor + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                          "] outside the file's " + std::to_string(buffer) + " bytes of tensor data" + damaged);
  if (__builtin_mul_overflow(t.numel, uint64_t{t.element_bytes}, &t.bytes) || t.bytes != end - begin)
    throw CorruptionError(tensor + " is " + t.dtype + " of " + std::to_string(t.numel) + " elements but spans " +
                          std::to_string(end - begin) + " bytes" + damaged);
  t.offset = data_start + begin;
  return t;
}

// Sorts h's tensors by offset; they must tile the data, which must end where the file does.
void check_tiling(SafetensorsHeader& h, uint64_t file_bytes, const std::string& where, const std::string& damaged) {
  // The tensors tile the buffer: sorted by offset (empty ones first where they share
  // one), each begins where the last ended.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.bytes != b.bytes ? a.bytes < b.bytes : a.name < b.name;
  });
  uint64_t at = h.data_start;
  for (const auto& t : h.tensors) {
    if (t.offset != at)
      throw CorruptionError(where + ": tensor '" + printable(t.name) + "' begins at byte " +
                            std::to_string(t.offset - h.data_start) + " of the data, " +
                            (t.offset < at ? "inside the tensor before it" : "leaving a gap after the one before it") +
                            " (at " + std::to_string(at - h.data_start) + ")" + damaged);
    at += t.bytes;
  }
  if (at != file_bytes)
    throw CorruptionError(where + ": its tensors end at byte " + std::to_string(at) + " but the file has " +
                          std::to_string(file_bytes) + damaged);
}

}  // namespace

const SafetensorsTensor* SafetensorsHeader::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

SafetensorsHeader parse_safetensors_header(std::string_view head, uint64_t file_bytes, const std::string& where) {
  const std::string damaged = ": the file is damaged or not a safetensors file; download or write it again";
  if (file_bytes < 8 || head.size() < 8)
    throw CorruptionError(where + " is " + std::to_string(file_bytes) +
                          " bytes, shorter than the 8 bytes of a safetensors header's length" + damaged);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(head[i]);
  if (n > kSafetensorsMaxHeader)
    throw CorruptionError(where + " declares a header of " + std::to_string(n) + " bytes, more than the format's " +
                          std::to_string(kSafetensorsMaxHeader) + damaged);
  if (n > file_bytes - 8 || head.size() - 8 < n)
    throw CorruptionError(where + " declares a header of " + std::to_string(n) + " bytes but has only " +
                          std::to_string(std::min<uint64_t>(file_bytes, head.size()) - 8) +
                          " after the length (truncated)" + damaged);
  std::string_view text = head.substr(8, n);
  if (text.empty() || text[0] != '{')
    throw CorruptionError(where + ": its header does not begin with '{'" + damaged);

  const json j = parse_header_json(text, where, damaged);

  SafetensorsHeader h;
  h.file_bytes = file_bytes;
  h.data_start = 8 + n;
  const uint64_t buffer = file_bytes - h.data_start;
  for (const auto& item : j.items()) {
    const std::string& name = item.key();
    const json& v = item.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw CorruptionError(where + ": __metadata__ is not an object of strings" + damaged);
      for (const auto& m : v.items()) {
        if (!m.value().is_string())
          throw CorruptionError(where + ": __metadata__ '" + printable(m.key()) + "' is not a string" + damaged);
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_tensor(name, v, h.data_start, buffer, where, damaged));
  }
  check_tiling(h, file_bytes, where, damaged);
  return h;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  struct stat st {};
  const int fd = open_input_file(path, "safetensors file", &st);
  const std::string where = "safetensors file '" + path + "'";
  auto read_at = [&](uint64_t offset, uint64_t n) {
    std::string buf(n, '\0');
    uint64_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd, buf.data() + got, n - got, static_cast<off_t>(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        const int err = errno;
        ::close(fd);
        throw IoError("reading safetensors header", path, offset + got, n - got, err);
      }
      if (r == 0) break;  // shorter than it was: parse_safetensors_header names it
      got += static_cast<uint64_t>(r);
    }
    buf.resize(got);
    return buf;
  };
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  std::string head = read_at(0, std::min<uint64_t>(file_bytes, 8));
  if (head.size() == 8) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(head[i]);
    if (n <= kSafetensorsMaxHeader) head += read_at(8, std::min<uint64_t>(n, file_bytes - 8));
  }
  ::close(fd);
  return parse_safetensors_header(head, file_bytes, where);
}

}  // namespace strata
