// Saving checkpoints (checkpoint.hpp): every rank writes its shards, rank 0 the manifest,
// then the directory is renamed into place; and InitialCheckpointWriter, a checkpoint
// written without an engine (strata import).
#include "strata/runtime/formats/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <xxhash.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>

#include "checkpoint_dirs.hpp"
#include "checkpoint_format.hpp"
#include "checkpoint_io.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"

namespace strata {

namespace fs = std::filesystem;
using nlohmann::json;

using namespace checkpoint_format;  // NOLINT: the format's names, used throughout
using namespace checkpoint_detail;  // NOLINT: checkpoint_io.hpp's file I/O and agreement

namespace {

// Test hook (checkpoint.hpp): die here, as a crash would, leaving what is on disk.
void maybe_kill(const char* point, int rank) {
  const char* v = std::getenv("STRATA_CHECKPOINT_KILL");
  if (rank == 0 && v != nullptr && std::strcmp(v, point) == 0) ::raise(SIGKILL);
}

void write_rank_file(ZeroEngine& engine, const fs::path& path, CheckpointFile& out) {
  const std::string p = path.string();
  Fd f(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (f.fd < 0) throw IoError("creating checkpoint file", p, 0, 0, errno, kCheckpointDiskFull);
  uint64_t off = 0;
  std::vector<float> states[kStates];
  for (int g = 0; g < engine.num_groups(); ++g) {
    const uint64_t n = engine.shard_numel(g);
    for (auto& s : states) s.resize(n);
    engine.read_optimizer_shard(g, states[0].data(), states[1].data(), states[2].data());
    for (auto& s : states) {
      out.segments.push_back(XXH3_64bits(s.data(), n * 4));
      write_all(f.fd, s.data(), n * 4, off, p);
      off += n * 4;
    }
  }
  fsync_fd(f.fd, p);
  f.close_checked(p);
  out.bytes = off;
}

void write_manifest(const fs::path& path, const CheckpointInfo& info) {
  json j = info_to_json(info);
  j["checksum"] = hex64(manifest_hash(j));
  const std::string text = j.dump(1) + "\n";
  const std::string p = path.string();
  Fd f(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (f.fd < 0) throw IoError("creating checkpoint manifest", p, 0, 0, errno, kCheckpointDiskFull);
  write_all(f.fd, text.data(), text.size(), 0, p);
  fsync_fd(f.fd, p);
  f.close_checked(p);
}

void fs_call(const std::error_code& ec, const char* what, const fs::path& p) {
  if (ec) throw IoError(what, p.string(), 0, 0, ec.value(), kCheckpointDiskFull);
}

// Collective, the last stage of writing a checkpoint (a save or an import): rank 0 learns
// every rank's file (its size and segment checksums, `mine` from each), completes `info`
// with them, writes the manifest into tmp and renames tmp to final_dir. Rank 0's error,
// if any, is returned there (the caller agrees on it); the other ranks return null.
std::exception_ptr publish_checkpoint(coll::Communicator& host, CheckpointInfo info, const CheckpointFile& mine,
                                      const fs::path& tmp, const fs::path& final_dir) {
  const int rank = host.rank(), world = host.size();
  const size_t rec = 1 + mine.segments.size();  // [bytes, segments...] per rank
  std::vector<int64_t> send(rec), all(rec * static_cast<size_t>(world));
  send[0] = static_cast<int64_t>(mine.bytes);
  for (size_t i = 0; i < mine.segments.size(); ++i) send[1 + i] = static_cast<int64_t>(mine.segments[i]);
  host.all_gather(send, all).wait();
  if (rank != 0) return nullptr;
  try {
    info.world_size = world;
    info.files.clear();
    for (int r = 0; r < world; ++r) {
      CheckpointFile cf{rank_file(r), static_cast<uint64_t>(all[r * rec]), {}};
      for (size_t i = 1; i < rec; ++i) cf.segments.push_back(static_cast<uint64_t>(all[r * rec + i]));
      info.files.push_back(std::move(cf));
    }
    maybe_kill("before-manifest", rank);
    write_manifest(tmp / "manifest.json", info);
    fsync_dir(tmp);
    maybe_kill("before-rename", rank);
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
      throw IoError("renaming the finished checkpoint into place", final_dir.string(), 0, 0, errno, kCheckpointDiskFull);
    fsync_dir(final_dir.parent_path());
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace

std::string checkpoint_dir_for(const std::string& root, int64_t step) {
  return (fs::path(root) / step_name(step)).string();
}

std::string save_checkpoint(ZeroEngine& engine, coll::Communicator& host, const std::string& root,
                            const json& config, const json& extra, const std::vector<std::string>& group_names) {
  const int rank = host.rank(), world = host.size();
  STRATA_CHECK(world == engine.comm().size() && rank == engine.comm().rank(),
               "save_checkpoint: the host communicator must span the engine's ranks in the same order");
  STRATA_CHECK(group_names.empty() || group_names.size() == static_cast<size_t>(engine.num_groups()),
               "save_checkpoint: " + std::to_string(group_names.size()) + " group names for " +
                   std::to_string(engine.num_groups()) + " groups");
  const int64_t step = engine.iterations();
  const fs::path rootp(root);
  const fs::path final_dir = checkpoint_dir_for(root, step);
  const fs::path tmp = rootp / ("." + step_name(step) + ".tmp");

  // 1. Rank 0 makes the temporary directory (replacing the leftover of a crashed save),
  // holding the directory's lock: its own run's (train), or one for this save.
  std::exception_ptr ep;
  CheckpointDirLock save_lock;
  if (rank == 0) {
    try {
      if (root.empty()) throw ConfigError("no checkpoint directory given: set strata.checkpoint_dir");
      std::error_code ec;
      fs::create_directories(rootp, ec);
      fs_call(ec, "creating checkpoint directory", rootp);
      if (!held_here(rootp)) save_lock = CheckpointDirLockAccess::take(rootp);
      if (fs::exists(final_dir, ec))
        throw ConfigError("checkpoint '" + final_dir.string() +
                          "' exists already and a checkpoint is never overwritten: move it away, or resume from it "
                          "(--resume) instead of starting over, or use another strata.checkpoint_dir");
      if (fs::exists(tmp, ec)) {
        log::warn("removing '" + tmp.string() + "', left by a save of step " + std::to_string(step) +
                  " that did not finish");
        fs::remove_all(tmp, ec);
        fs_call(ec, "removing a leftover temporary checkpoint", tmp);
      }
      fs::create_directory(tmp, ec);
      fs_call(ec, "creating temporary checkpoint directory", tmp);
    } catch (...) {
      ep = std::current_exception();
    }
  }
  if (auto f = agree(host, ep)) f->raise(rank);

  auto fail = [&](const Failure& f) {
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      if (ec) log::warn("could not remove '" + tmp.string() + "' after a failed save: " + ec.message());
    }
    f.raise(rank);
  };

  // 2. Every rank writes and fsyncs its shards.
  CheckpointFile mine{rank_file(rank), 0, {}};
  try {
    write_rank_file(engine, tmp / mine.name, mine);
  } catch (...) {
    ep = std::current_exception();
  }
  if (auto f = agree(host, ep)) fail(*f);

  // 3. Rank 0 writes the manifest with every rank's file, then renames the directory into place.
  CheckpointInfo info;
  info.step = step;
  info.optimizer_steps = engine.optimizer_steps();
  info.precision = precision_name(engine.dtype());
  if (engine.loss_scaler().enabled()) info.loss_scaler = engine.loss_scaler().state();
  info.config = config;
  info.extra = extra;
  for (int g = 0; g < engine.num_groups(); ++g) {
    const uint64_t shard = engine.shard_numel(g);
    info.groups.push_back({group_names.empty() ? "group." + std::to_string(g) : group_names[static_cast<size_t>(g)],
                           engine.group_numel(g), shard * world, shard, engine.group_frozen(g)});
  }
  ep = publish_checkpoint(host, std::move(info), mine, tmp, final_dir);
  if (auto f = agree(host, ep)) fail(*f);
  return final_dir.string();
}

// ---------------------------------------------------------------------------------------
// A checkpoint written without an engine (strata import).

struct InitialCheckpointWriter::State {
  fs::path root, tmp, final_dir;
  fs::path created;       // the outermost directory of root the writer created ("": none)
  bool made_lock_file = false;
  bool made_tmp = false;  // tmp is this writer's (another import's, or a leftover, is never removed here)
  CheckpointDirLock lock;
  Fd file;
  uint64_t offset = 0;
  CheckpointInfo info;   // groups; files[0]: this rank's
  std::unique_ptr<coll::Communicator> self;  // the host communicator of a one-rank writer
  coll::Communicator* host = nullptr;
  bool done = false;

  // After a failure: root as the writer found it. The temporary checkpoint goes, and so
  // do the lock file and the directories the writer made (each only while empty).
  void discard(int rank) {
    if (file.fd >= 0) ::close(file.fd), file.fd = -1;
    if (rank != 0) return;
    std::error_code ec;
    if (made_tmp) fs::remove_all(tmp, ec);
    if (made_lock_file) CheckpointDirLockAccess::release_and_remove(lock, root);
    lock.release();
    if (created.empty()) return;
    for (fs::path q = root; fs::remove(q, ec) && q != created; q = q.parent_path()) {
    }
  }
};

InitialCheckpointWriter::InitialCheckpointWriter(const std::string& root, coll::Communicator* host)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  if (!host) {
    s.self = coll::make_host_communicator(coll::HostBackend::Self);
    host = s.self.get();
  }
  s.host = host;
  rank_ = host->rank();
  world_ = host->size();
  std::exception_ptr ep;
  try {
    if (root.empty()) throw ConfigError("no output directory given: pass --out DIR");
    s.root = fs::absolute(fs::path(root)).lexically_normal();
    if (s.root.filename().empty()) s.root = s.root.parent_path();
    s.final_dir = s.root / step_name(0);
    s.tmp = s.root / ("." + step_name(0) + ".tmp");
    if (rank_ == 0) {
      for (fs::path q = s.root; q != q.root_path(); q = q.parent_path())
        if (is_checkpoint_dir(q))
          throw ConfigError("--out '" + root + "' is " +
                            (q == s.root ? std::string("a checkpoint") : "inside the checkpoint '" + q.string() + "'") +
                            ": give a new directory to hold the imported checkpoint");
      std::error_code ec;
      for (fs::path q = s.root; !fs::exists(q, ec) && q != q.parent_path(); q = q.parent_path()) s.created = q;
      fs::create_directories(s.root, ec);
      if (ec) throw ConfigError("cannot create --out '" + root + "': " + ec.message());
      s.made_lock_file = !CheckpointDirLockAccess::has_lock_file(s.root);
      s.lock = CheckpointDirLockAccess::take(s.root);
      std::vector<fs::path> leftovers;
      if (!step_dirs(s.root.string(), &leftovers).empty())
        throw ConfigError("--out '" + root + "' holds checkpoints already, which an import never touches: give a new "
                          "directory");
      fs::remove_all(s.tmp, ec);
      fs::create_directory(s.tmp, ec);
      fs_call(ec, "creating temporary checkpoint directory", s.tmp);
      s.made_tmp = true;
    }
  } catch (...) {
    ep = std::current_exception();
  }
  if (auto f = agree(*host, ep)) {
    s.discard(rank_);  // the destructor does not run for a constructor that throws
    f->raise(rank_);
  }
  try {
    const fs::path rf = s.tmp / rank_file(rank_);
    s.file.fd = ::open(rf.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (s.file.fd < 0) throw IoError("creating checkpoint file", rf.string(), 0, 0, errno, kCheckpointDiskFull);
  } catch (...) {
    ep = std::current_exception();
  }
  if (auto f = agree(*host, ep)) {
    s.discard(rank_);
    f->raise(rank_);
  }
  s.info.world_size = world_;
  s.info.files.push_back({rank_file(rank_), 0, {}});
}

InitialCheckpointWriter::~InitialCheckpointWriter() {
  if (s_ && !s_->done) s_->discard(rank_);
}

uint64_t InitialCheckpointWriter::shard_size(uint64_t numel) const {
  return (numel + static_cast<uint64_t>(world_) - 1) / static_cast<uint64_t>(world_);
}

void InitialCheckpointWriter::add_group(const std::string& name, const float* shard, uint64_t numel) {
  State& s = *s_;
  const std::string p = (s.tmp / rank_file(rank_)).string();
  const uint64_t n = shard_size(numel);
  const std::vector<float> zeros(n, 0.0f);
  for (const float* seg : {shard, zeros.data(), zeros.data()}) {
    s.info.files[0].segments.push_back(XXH3_64bits(seg, n * 4));
    write_all(s.file.fd, seg, n * 4, s.offset, p);
    s.offset += n * 4;
  }
  s.info.groups.push_back({name, numel, n * static_cast<uint64_t>(world_), n});
}

std::string InitialCheckpointWriter::finish(const nlohmann::json& config, const std::string& precision,
                                            const nlohmann::json& extra, std::exception_ptr failed) {
  State& s = *s_;
  coll::Communicator& host = *s.host;
  std::exception_ptr ep = failed;
  if (!ep) try {
      const std::string p = (s.tmp / rank_file(rank_)).string();
      fsync_fd(s.file.fd, p);
      s.file.close_checked(p);
    } catch (...) {
      ep = std::current_exception();
    }
  if (auto f = agree(host, ep)) f->raise(rank_);  // the destructor removes the .tmp
  CheckpointInfo info = s.info;  // the groups
  info.step = 0;
  info.optimizer_steps = 0;
  info.precision = precision;
  info.config = config;
  info.extra = extra;
  CheckpointFile mine = s.info.files[0];
  mine.bytes = s.offset;
  ep = publish_checkpoint(host, std::move(info), mine, s.tmp, s.final_dir);
  if (auto f = agree(host, ep)) f->raise(rank_);
  s.done = true;
  return s.final_dir.string();
}

}  // namespace strata
