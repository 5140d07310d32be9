// Paths from the outside, made safe to use (docs/failure-behaviour.md):
//  - An output (export's --out, --metrics, strata.trace, bench's --trace/--json/--csv) is
//    written only where it can destroy nothing but an earlier output: a regular file or
//    a name that does not exist yet, outside any checkpoint.
//  - An input (a config file, a data file, a checkpoint manifest) is opened without
//    blocking and checked to be a regular file before a byte is read, so a FIFO with no
//    writer or a device such as /dev/zero is an error, not a hang; what is read into
//    memory is bounded.
//  - JSON from a file is bounded in nesting before it is parsed, so a document nested
//    100,000 deep is an error, not a stack overflow.
// Each refusal is a ConfigError naming the path, what is wrong with it and the fix.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace strata {

// Refuses (ConfigError) an output path that exists and is not a regular file (a device,
// a FIFO, a socket, a directory), or that lies inside a checkpoint directory (one named
// step-<N> or .step-<N>.tmp, or holding manifest.json and rank-0.bin), or that would take
// a name of the checkpoint layout (step-<N>, .step-<N>.tmp). `what` names where the path
// came from: "--out", "--metrics", "strata.trace". Symbolic links are followed.
void check_output_path(const std::string& path, const std::string& what);

// Refuses (ConfigError) an output that cannot be written: a directory that does not
// exist or is read-only, a file without write permission. Creates and changes nothing:
// an existing file is opened for appending and closed; for a new name its directory is
// checked (access(2)). For outputs written later in a run (a trace at its end), so that
// the run fails before its work.
void check_output_writable(const std::string& path, const std::string& what);

// The checkpoint directory `path` (a file or directory, existing or not) lies in, or ""
// (the rule of check_output_path).
std::string enclosing_checkpoint(const std::string& path);

// Opens `path` for reading with O_NONBLOCK, fstat()s it and refuses (ConfigError) anything
// but a regular file, then clears O_NONBLOCK. Returns the descriptor (the caller closes
// it) and fills *st. `what` names the file in messages ("config file", "data file");
// `key`, when given, is where the path came from ("strata.data.path"), for the fix.
int open_input_file(const std::string& path, const std::string& what, struct stat* st, const std::string& key = "");

// The whole of a regular file (open_input_file), refused (ConfigError) when larger than
// max_bytes (the message says why with `over_limit`). A file that shrinks while it is
// read is an IoError, not a crash.
std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes,
                            const std::string& over_limit = "", const std::string& key = "");

// The deepest nesting of objects and arrays in `text` (strings skipped), counted until it
// passes `limit`; *offset is set to the byte where it did. Invalid JSON is left to the
// parser.
size_t json_nesting_depth(std::string_view text, size_t limit, size_t* offset = nullptr);

// Nesting deeper than this in a config, a manifest or an API argument is refused.
inline constexpr size_t kMaxJsonDepth = 64;

// Parses JSON that came from outside without throwing: a document nested deeper than
// kMaxJsonDepth, invalid JSON and numbers out of a double's range all give a discarded
// value (is_discarded()).
nlohmann::json parse_untrusted_json(std::string_view text);

// Offset of the first byte that makes `p[0..n)` not UTF-8 text (a NUL, a malformed or
// overlong sequence, a surrogate, a code point above U+10FFFF), or n when it is text.
// `why` says which ("is a NUL byte", ...).
uint64_t first_non_text(const unsigned char* p, uint64_t n, const char** why);

}  // namespace strata
