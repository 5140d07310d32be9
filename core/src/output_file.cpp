#include "strata/core/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <streambuf>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/log.hpp"

namespace strata {

namespace fs = std::filesystem;

namespace {

// write(2) until all of [p, p + n) is written; returns 0, or the errno of the write that
// failed (ENOSPC for one that wrote nothing) with *done the bytes written before it.
int write_fully(int fd, const char* p, size_t n, size_t* done) {
  *done = 0;
  while (*done < n) {
    const ssize_t w = ::write(fd, p + *done, n - *done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : ENOSPC;
    *done += static_cast<size_t>(w);
  }
  return 0;
}

std::atomic<uint64_t> g_temp_serial{0};

}  // namespace

// The stream's buffer writes to the temporary file; the first failed write is kept for
// commit() to throw, and every later one is refused.
struct ReplacingFile::State : std::streambuf {
  std::string target, tmp, what, on_full;
  int fd = -1;
  uint64_t written = 0;  // bytes in the temporary file
  int err = 0;           // errno of the first write that failed
  uint64_t err_length = 0;
  std::vector<char> buf = std::vector<char>(1 << 16);
  std::ostream os{this};
  bool committed = false;

  State() { setp(buf.data(), buf.data() + buf.size()); }

  bool drain() {
    if (err) return false;
    const size_t n = static_cast<size_t>(pptr() - pbase());
    size_t done = 0;
    err = write_fully(fd, pbase(), n, &done);
    written += done;
    if (err) {
      err_length = n - done;
      return false;
    }
    setp(buf.data(), buf.data() + buf.size());
    return true;
  }
  int overflow(int c) override {
    if (!drain()) return traits_type::eof();
    if (c != traits_type::eof()) {
      *pptr() = static_cast<char>(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }
  int sync() override { return drain() ? 0 : -1; }
};

ReplacingFile::ReplacingFile(const std::string& path, std::string what, std::string on_full)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.what = std::move(what);
  s.on_full = std::move(on_full);
  std::error_code ec;
  s.target = path;
  if (fs::is_symlink(path, ec)) {
    const fs::path t = fs::canonical(path, ec);
    if (!ec) s.target = t.string();
  }
  const fs::path tp(s.target);
  const fs::path dir = tp.parent_path();
  // A name of the writer's own in the target's directory, so that the rename is atomic.
  for (;;) {
    s.tmp = (dir / ("." + tp.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                    std::to_string(g_temp_serial.fetch_add(1))))
                .string();
    s.fd = ::open(s.tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (s.fd >= 0) break;
    if (errno != EEXIST) throw IoError("creating a temporary file for " + s.what, s.tmp, 0, 0, errno, s.on_full);
  }
}

ReplacingFile::~ReplacingFile() {
  if (s_->fd >= 0) ::close(s_->fd);
  if (!s_->committed) ::unlink(s_->tmp.c_str());
}

std::ostream& ReplacingFile::stream() { return s_->os; }

void ReplacingFile::commit() {
  State& s = *s_;
  s.os.flush();
  if (s.err) throw IoError("writing " + s.what, s.target, s.written, s.err_length, s.err, s.on_full);
  if (::fsync(s.fd) != 0) throw IoError("fsync of " + s.what, s.target, 0, s.written, errno, s.on_full);
  const int fd = s.fd;
  s.fd = -1;
  if (::close(fd) != 0) throw IoError("closing " + s.what, s.target, 0, s.written, errno, s.on_full);
  if (::rename(s.tmp.c_str(), s.target.c_str()) != 0)
    throw IoError("renaming " + s.what + " into place", s.target, 0, 0, errno, s.on_full);
  s.committed = true;
  fs::path dir = fs::path(s.target).parent_path();
  if (dir.empty()) dir = ".";
  if (const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    ::fsync(d);  // the rename's durability; the file is complete either way
    ::close(d);
  }
}

void write_file_replacing(const std::string& path, std::string_view text, const std::string& what,
                          const std::string& on_full) {
  ReplacingFile f(path, what, on_full);
  f.stream().write(text.data(), static_cast<std::streamsize>(text.size()));
  f.commit();
}

AppendedLines::AppendedLines(const std::string& path, std::string what, std::string on_full,
                             OnWriteFailure on_failure)
    : path_(path), what_(std::move(what)), on_full_(std::move(on_full)), on_failure_(on_failure) {
  // Read access only to see the last byte; a write-only file is appended to all the same.
  fd_ = ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0 && errno == EACCES) fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0) throw IoError("opening " + what_ + " for appending", path_, 0, 0, errno, on_full_);
  struct stat st {};
  char last = '\n';
  ends_mid_line_ =
      ::fstat(fd_, &st) == 0 && st.st_size > 0 && ::pread(fd_, &last, 1, st.st_size - 1) == 1 && last != '\n';
}

AppendedLines::~AppendedLines() { close(); }

AppendedLines::AppendedLines(AppendedLines&& o) noexcept
    : fd_(o.fd_), ends_mid_line_(o.ends_mid_line_), path_(std::move(o.path_)), what_(std::move(o.what_)),
      on_full_(std::move(o.on_full_)), on_failure_(o.on_failure_) {
  o.fd_ = -1;
}

AppendedLines& AppendedLines::operator=(AppendedLines&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    ends_mid_line_ = o.ends_mid_line_;
    path_ = std::move(o.path_);
    what_ = std::move(o.what_);
    on_full_ = std::move(o.on_full_);
    on_failure_ = o.on_failure_;
    o.fd_ = -1;
  }
  return *this;
}

void AppendedLines::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool AppendedLines::append(std::string_view record) {
  if (fd_ < 0) return false;
  std::string line = ends_mid_line_ ? "\n" : "";
  line += record;
  line += '\n';
  struct stat st {};
  const off_t start = ::fstat(fd_, &st) == 0 ? st.st_size : ::lseek(fd_, 0, SEEK_END);
  size_t done = 0;
  const int err = write_fully(fd_, line.data(), line.size(), &done);
  if (err == 0) {
    ends_mid_line_ = false;
    return true;
  }
  // No torn line: what part of the record reached the file is cut off again.
  std::string what = "appending a record to " + what_;
  if (done > 0 && ::ftruncate(fd_, start) != 0)
    what += " (it now ends in " + std::to_string(done) + " bytes of this record: cutting them off failed, " +
            std::strerror(errno) + ")";
  IoError e(what, path_, static_cast<uint64_t>(start), line.size(), err, on_full_);
  if (on_failure_ == OnWriteFailure::Throw) throw e;
  log::warn(std::string(e.what()) + "; " + what_ + " is no longer written (it is optional): the run goes on");
  close();
  return false;
}

}  // namespace strata
