#include "strata/core/safe_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "strata/core/error.hpp"

namespace strata {

namespace fs = std::filesystem;

namespace {

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a plain file";
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// The names runtime/src/formats/checkpoint.cpp gives checkpoints: step-%08lld, and .step-%08lld.tmp
// while one is written.
bool checkpoint_name(const std::string& name) {
  if (name.starts_with("step-")) return name.size() >= 13 && all_digits(std::string_view(name).substr(5));
  if (name.starts_with(".step-") && name.ends_with(".tmp"))
    return name.size() >= 18 && all_digits(std::string_view(name).substr(6, name.size() - 10));
  return false;
}

bool is_checkpoint_dir(const fs::path& d) {
  std::error_code ec;
  if (checkpoint_name(d.filename().string()) && fs::is_directory(d, ec)) return true;
  return fs::exists(d / "manifest.json", ec) && fs::exists(d / "rank-0.bin", ec);
}

}  // namespace

std::string enclosing_checkpoint(const std::string& path) {
  std::error_code ec;
  // Resolve what exists (symbolic links included), so a link into a checkpoint is seen.
  fs::path p = fs::weakly_canonical(fs::absolute(fs::path(path), ec), ec);
  if (ec) p = fs::absolute(fs::path(path), ec).lexically_normal();
  for (fs::path d = p.parent_path(); !d.empty(); d = d.parent_path()) {
    if (is_checkpoint_dir(d)) return d.string();
    if (d == d.root_path()) break;
  }
  return "";
}

void check_output_path(const std::string& path, const std::string& what) {
  if (path.empty()) throw ConfigError(what + " is empty: give a file name");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw ConfigError(what + " '" + path + "' is " + file_kind(st.st_mode) +
                      ", not a regular file: Strata writes outputs only to regular files or new names, so that "
                      "nothing else is replaced; give a file path");
  // A second name of a file (a hard link to a checkpoint's shard, say): writing it would
  // change the file under its other names too, where no rule here can see it.
  if (S_ISREG(st.st_mode) && st.st_nlink > 1)
    throw ConfigError(what + " '" + path + "' has " + std::to_string(st.st_nlink) +
                      " hard links: writing it would change the file under its other names too (a checkpoint's "
                      "shard, perhaps); give a file of its own");
  if (const std::string ck = enclosing_checkpoint(path); !ck.empty())
    throw ConfigError(what + " '" + path + "' lies inside checkpoint directory '" + ck +
                      "': writing there could replace or corrupt the checkpoint's files; write it outside the "
                      "checkpoint");
  if (checkpoint_name(fs::path(path).filename().string()))
    throw ConfigError(what + " '" + path + "' takes the name of a checkpoint (step-<N>), which resume and export "
                      "would read as one: choose another name");
}

void check_output_writable(const std::string& path, const std::string& what) {
  // An existing file is opened for appending (nothing written). For a new name, its
  // directory must exist and be writable: nothing is created, so that ranks checking one
  // path at once (a metrics file under mpirun) cannot race each other or the writer.
  auto refuse = [&](int err) {
    throw ConfigError(what + " '" + path + "' cannot be written (" + std::strerror(err) +
                      "): give a file in an existing, writable directory");
  };
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    return;
  }
  if (errno != ENOENT) refuse(errno);
  fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) parent = ".";
  struct stat st {};
  if (::stat(parent.c_str(), &st) != 0) refuse(errno);
  if (!S_ISDIR(st.st_mode)) refuse(ENOTDIR);
  if (::access(parent.c_str(), W_OK | X_OK) != 0) refuse(errno);
}

int open_input_file(const std::string& path, const std::string& what, struct stat* st, const std::string& key) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw ConfigError(what + " '" + path + "' cannot be opened (" + std::strerror(err) + "): " +
                      (err == ENOENT ? "check " + (key.empty() ? std::string("the path") : key) +
                                           " (relative paths are from the directory strata runs in)"
                                     : std::string("check the path and its permissions")));
  }
  if (::fstat(fd, st) != 0) {
    const int err = errno;
    ::close(fd);
    throw IoError("stat of the " + what, path, 0, 0, err);
  }
  if (!S_ISREG(st->st_mode)) {
    ::close(fd);
    throw ConfigError(what + " '" + path + "' is not a regular file (it is " + file_kind(st->st_mode) +
                      "): give a regular file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes,
                            const std::string& over_limit, const std::string& key) {
  struct stat st {};
  const int fd = open_input_file(path, what, &st, key);
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    throw ConfigError(what + " '" + path + "' is " + format_bytes(size) + ", more than the " + format_bytes(max_bytes) +
                      " a " + what + " may be" + (over_limit.empty() ? "" : " (" + over_limit + ")") +
                      ": check that it is the right file");
  }
  std::string text;
  try {
    text.resize(static_cast<size_t>(size));
  } catch (...) {
    ::close(fd);
    throw;
  }
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, text.data() + done, static_cast<size_t>(size - done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw IoError("reading the " + what, path, done, size - done, err);
    }
    if (n == 0) {
      ::close(fd);
      throw IoError("the " + what + " shrank to " + std::to_string(done) + " bytes while it was read (it was " +
                        std::to_string(size) + "): something else is writing it; try again when it is complete",
                    path, done, size - done, 0);
    }
    done += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return text;
}

size_t json_nesting_depth(std::string_view text, size_t limit, size_t* offset) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > deepest) deepest = depth;
      if (depth > limit) {
        if (offset) *offset = i;
        return depth;
      }
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  if (offset) *offset = text.size();
  return deepest;
}

nlohmann::json parse_untrusted_json(std::string_view text) {
  using nlohmann::json;
  if (json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth) return json(json::value_t::discarded);
  try {
    return json::parse(text, nullptr, /*allow_exceptions=*/false);
  } catch (const json::exception&) {
    return json(json::value_t::discarded);
  }
}

uint64_t first_non_text(const unsigned char* p, uint64_t n, const char** why) {
  uint64_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c >= 0x01 && c < 0x80) {
      ++i;
      continue;
    }
    if (c == 0) {
      *why = "is a NUL byte";
      return i;
    }
    int len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else {
      *why = "cannot begin a UTF-8 character";
      return i;
    }
    if (i + len > n) {
      *why = "begins a UTF-8 character cut off by the end";
      return i;
    }
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) {
        *why = "begins a malformed UTF-8 sequence";
        return i;
      }
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      *why = "begins an invalid UTF-8 sequence (overlong, surrogate or beyond U+10FFFF)";
      return i;
    }
    i += len;
  }
  return n;
}

}  // namespace strata
