// Errors in Strata take one of two paths:
//  - A broken invariant is a bug: STRATA_CHECK aborts with the statement, file, line
//    and rank.
//  - A failure the caller can act on (a full tier, a full disk, an I/O error, a bad
//    config) is thrown as a typed exception derived from strata::Error whose message
//    names what, where and the numbers. The CLI turns it into one clear message.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace strata {

// Base of every recoverable Strata error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A configuration file, key or flag is wrong. The message names the key and the fix.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// An I/O operation failed. Carries the path, offset, length and errno.
class IoError : public Error {
 public:
  // `on_full`: the fix a full disk (ENOSPC, EDQUOT) asks for, which depends on whose
  // file it is ("point nvme_path at a disk with room", "set strata.checkpoint_dir ...").
  IoError(const std::string& what, std::string path, uint64_t offset, uint64_t length, int err,
          const std::string& on_full = "free space on it");
  const std::string& path() const { return path_; }
  uint64_t offset() const { return offset_; }
  uint64_t length() const { return length_; }
  int error_code() const { return err_; }

 private:
  std::string path_;
  uint64_t offset_;
  uint64_t length_;
  int err_;
};

// Data read back does not match what was written (checksum mismatch).
class CorruptionError : public Error {
 public:
  using Error::Error;
};

// A tier (or a disk) cannot hold what was asked of it, even after eviction.
class OutOfBudget : public Error {
 public:
  using Error::Error;
};

// A device or library the configuration asks for is not available here.
class Unavailable : public Error {
 public:
  using Error::Error;
};

// Process rank used in fatal messages; set once by whoever knows it (MPI init).
void set_process_rank(int rank);
int process_rank();

[[noreturn]] void fatal(const char* file, int line, std::string_view msg);

// Formats "<call> failed: <detail> (<kind> code <code>)" for the generated checkers below.
[[noreturn]] void fail_call(const char* kind, const char* call, long code, const std::string& detail,
                            const char* file, int line);

// How format_bytes writes a byte count, in binary units either way.
enum class ByteStyle {
  Full,     // "512 B", "1.50 GiB": messages
  Compact,  // "0K", "12.3M", "1.50G": K to G only, for columns (`strata train`'s lines)
};

// Human-readable byte count: "1.50 GiB" (Full) or "1.50G" (Compact).
std::string format_bytes(uint64_t bytes, ByteStyle style = ByteStyle::Full);

}  // namespace strata

#define STRATA_CHECK(cond, msg)                                                     \
  do {                                                                              \
    if (!(cond)) [[unlikely]]                                                       \
      ::strata::fatal(__FILE__, __LINE__, std::string("check failed: " #cond ": ") + (msg)); \
  } while (0)

// One template for checking library calls, so a failed call of any library reads the
// same way: the call, what the code means, and where. Each family supplies
// how to tell success and how to describe the code; the macro reports the failing call
// and where. Recoverable families (io_uring) throw from their own call sites instead.
#define STRATA_DEFINE_CALL_CHECK(NAME, KIND, CODE_T, IS_OK, DESCRIBE)               \
  namespace strata::detail {                                                        \
  inline void NAME(CODE_T code, const char* call, const char* file, int line) {     \
    if (!(IS_OK)) [[unlikely]]                                                      \
      ::strata::fail_call(KIND, call, static_cast<long>(code), DESCRIBE, file, line); \
  }                                                                                 \
  }

// POSIX calls returning -1 and setting errno; io_uring calls returning -errno.
#include <cerrno>
#include <cstring>
STRATA_DEFINE_CALL_CHECK(check_errno_call, "errno", long, code >= 0, std::strerror(errno))
STRATA_DEFINE_CALL_CHECK(check_neg_errno_call, "io_uring", long, code >= 0,
                         std::strerror(static_cast<int>(-code)))
#define STRATA_CHECK_ERRNO(expr) ::strata::detail::check_errno_call((expr), #expr, __FILE__, __LINE__)
#define STRATA_CHECK_NEG_ERRNO(expr) \
  ::strata::detail::check_neg_errno_call((expr), #expr, __FILE__, __LINE__)
// For a result already in hand (a call retried in a loop, or one of several calls made on
// one line): `call` names the call in the message, as the expression would.
#define STRATA_CHECK_NEG_ERRNO_OF(code, call) \
  ::strata::detail::check_neg_errno_call((code), (call), __FILE__, __LINE__)
