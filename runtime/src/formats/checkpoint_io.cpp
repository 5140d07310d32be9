// Checkpoint file I/O and the ranks' agreement on a failure (checkpoint_io.hpp).
#include "checkpoint_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

namespace strata::checkpoint_detail {

namespace fs = std::filesystem;
using nlohmann::json;

void write_all(int fd, const void* data, uint64_t n, uint64_t offset, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, std::min<uint64_t>(n, 1ull << 30), static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw IoError("writing checkpoint file", path, offset, n, errno, kCheckpointDiskFull);
    }
    if (w == 0) throw IoError("writing checkpoint file", path, offset, n, ENOSPC, kCheckpointDiskFull);
    p += w;
    offset += static_cast<uint64_t>(w);
    n -= static_cast<uint64_t>(w);
  }
}

void read_exact(int fd, void* data, uint64_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(data);
  const uint64_t want_end = offset + n;
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min<uint64_t>(n, 1ull << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw IoError("reading checkpoint file", path, offset, n, errno, kCheckpointDiskFull);
    }
    if (r == 0)
      throw CorruptionError("checkpoint file '" + path + "' ends at byte " + std::to_string(offset) +
                            ", expected at least " + std::to_string(want_end) +
                            " bytes: it is truncated; resume from another checkpoint");
    p += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
}

void fsync_fd(int fd, const std::string& path) {
  if (::fsync(fd) != 0) throw IoError("fsync of checkpoint file", path, 0, 0, errno, kCheckpointDiskFull);
}

void fsync_dir(const fs::path& dir) {
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd < 0) throw IoError("opening directory for fsync", dir.string(), 0, 0, errno, kCheckpointDiskFull);
  if (::fsync(d.fd) != 0) throw IoError("fsync of directory", dir.string(), 0, 0, errno, kCheckpointDiskFull);
}

void Failure::raise(int rank) const {
  if (rank == origin && mine) std::rethrow_exception(mine);
  const std::string kind = desc.value("kind", "error");
  const std::string what = "on rank " + std::to_string(origin) + ": " + desc.value("what", "");
  if (kind == "io")
    throw IoError("checkpoint I/O failed on rank " + std::to_string(origin), desc.value("path", ""),
                  desc.value("offset", uint64_t{0}), desc.value("length", uint64_t{0}), desc.value("errno", 0),
                  kCheckpointDiskFull);
  if (kind == "config") throw ConfigError(what);
  if (kind == "corruption") throw CorruptionError(what);
  throw Error(what);
}

namespace {

json describe(const std::exception_ptr& ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const IoError& e) {
    return {{"kind", "io"}, {"what", e.what()}, {"path", e.path()}, {"offset", e.offset()},
            {"length", e.length()}, {"errno", e.error_code()}};
  } catch (const ConfigError& e) {
    return {{"kind", "config"}, {"what", e.what()}};
  } catch (const CorruptionError& e) {
    return {{"kind", "corruption"}, {"what", e.what()}};
  } catch (const std::exception& e) {
    return {{"kind", "error"}, {"what", e.what()}};
  }
}

}  // namespace

std::optional<Failure> agree(coll::Communicator& host, const std::exception_ptr& ep) {
  const int world = host.size(), rank = host.rank();
  int32_t flag = ep ? world - rank : 0;  // the maximum names the lowest failing rank
  host.all_reduce(std::span<int32_t>(&flag, 1), coll::ReduceOp::Max).wait();
  if (flag == 0) return std::nullopt;
  Failure f;
  f.origin = world - flag;
  std::string msg;
  if (rank == f.origin) {
    f.mine = ep;
    msg = describe(ep).dump();
  }
  int64_t len = static_cast<int64_t>(msg.size());
  host.broadcast(std::span<int64_t>(&len, 1), f.origin).wait();
  std::vector<uint8_t> buf(static_cast<size_t>(len));
  if (rank == f.origin) std::memcpy(buf.data(), msg.data(), buf.size());
  if (len > 0) host.broadcast(std::span<uint8_t>(buf), f.origin).wait();
  f.desc = json::parse(buf.begin(), buf.end(), nullptr, false);
  if (f.desc.is_discarded()) f.desc = json{{"kind", "error"}, {"what", "(unreadable error message)"}};
  return f;
}

}  // namespace strata::checkpoint_detail
