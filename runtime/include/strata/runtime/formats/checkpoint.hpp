// Sharded checkpoints of a ZeroEngine (for users: docs/checkpoints.md).
//
// Layout of one checkpoint, <root>/step-<N>/ (N zero-padded to 8 digits):
//   rank-<r>.bin    this rank's optimizer shards of every group, wherever they live
//                   (device, pinned or NVMe), in group order; per group three segments of
//                   shard = padded / world fp32 values: master, exp_avg, exp_avg_sq. No
//                   header: offsets follow from the manifest.
//   manifest.json   written last, by rank 0, after every rank's file is complete and
//                   fsync'd: format version, step, world size, the groups (name, numel,
//                   padded numel, shard), per-rank file size and the xxh3 of every segment,
//                   the optimizer's step count, the precision and (fp16) the loss scaler,
//                   the run's config and the caller's `extra` (data position, RNG state,
//                   ...), and the xxh3 of the manifest itself
// Every rank writes into <root>/.step-<N>.tmp/; once rank 0 has the manifest written it
// renames the directory to step-<N> (one rename(2) of a directory: atomic), so a crash at
// any point leaves either no step-<N> or a complete one. Existing checkpoints are never
// opened for writing; a failed save removes only its own .tmp directory. A leftover
// .step-<N>.tmp (a crash mid-save) is never read, and the next save of step N replaces it.
//
// One run per directory: <root>/.strata-lock is held with flock(2) by rank 0 of the run
// that saves there (lock_checkpoint_dir for a whole run, save_checkpoint for one save
// when its process does not hold it already), and holds that process's PID and host. A
// second run is refused with both named, so no run removes another's save in progress
// as "a leftover"; the kernel drops the lock when its holder dies, so none is stale.
//
// Resuming at another world size: the values of global element i of group g are in
// writer file i / shard at element i % shard of each segment, so any world size can
// read its own slice (padding is zero and is not stored twice).
//
// Test hook: STRATA_CHECKPOINT_KILL=before-manifest|before-rename makes save_checkpoint
// (and an import's InitialCheckpointWriter::finish) raise SIGKILL on rank 0 at that point (the
// crash tests use it; nothing else should).
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/runtime/engine/zero_engine.hpp"

namespace strata {

struct CheckpointGroup {
  std::string name;         // e.g. "block.3"
  uint64_t numel = 0;       // elements without padding
  uint64_t padded = 0;      // elements, a multiple of world_size
  uint64_t shard = 0;       // elements per rank: padded / world_size
  // Saved from a frozen group (ZeroEngine::group_frozen): its master segment holds the
  // working parameters widened, its moments zeros. The manifest says "frozen": true for
  // these alone; older manifests have none.
  bool frozen = false;
};

struct CheckpointFile {
  std::string name;                 // "rank-<r>.bin"
  uint64_t bytes = 0;               // 3 * 4 * sum of shards
  std::vector<uint64_t> segments;   // xxh3 per group and state: [3 * g + k], k = master,
                                    // exp_avg, exp_avg_sq
};

struct CheckpointInfo {
  std::string dir;          // <root>/step-<N>
  int64_t step = 0;         // training steps taken when it was saved (skipped ones included)
  int64_t optimizer_steps = 0;  // of which the optimizer took (Adam's t); older manifests: = step
  std::string precision = "f32";  // the working precision it trained in ("f32", "bf16", "fp16")
  std::optional<LossScalerState> loss_scaler;  // fp16 runs: the scaler, to resume it exactly
  int world_size = 0;       // ranks that wrote it
  nlohmann::json config;    // the configuration of the run that saved it
  nlohmann::json extra;     // what the caller stored (data position, RNG state, ...)
  std::vector<CheckpointGroup> groups;
  std::vector<CheckpointFile> files;   // one per writing rank
};

// The collective calls take `host`, a communicator over the same ranks as the engine's
// (in the same order) that serves host buffers: the engine's host_comm. The small
// messages by which ranks agree on success travel over it (engine.comm() may be NCCL).
//
// Collective: every rank of engine.comm() calls it with the same arguments. Returns the
// new checkpoint's directory. Throws IoError (full disk, ...) on every rank when any
// rank fails, with the .tmp directory removed and nothing existing touched; ConfigError
// when step-<N> exists already (a checkpoint is never overwritten). group_names: the
// engine's groups' names in order (GroupSpec::name; the engine does not expose them),
// recorded in the manifest and named by errors; empty: "group.<g>".
std::string save_checkpoint(ZeroEngine& engine, coll::Communicator& host, const std::string& root,
                            const nlohmann::json& config, const nlohmann::json& extra,
                            const std::vector<std::string>& group_names = {});

// The directory save_checkpoint writes for an engine at `step` iterations
// (engine.iterations()): <root>/step-<N>. Known before saving, so a caller that hands the
// name on (the C API) can check it has room for it before anything is written.
std::string checkpoint_dir_for(const std::string& root, int64_t step);

// The complete checkpoint with the highest step under root (directories without a
// valid manifest are ignored, with a warning); nullopt when there is none.
std::optional<std::string> latest_checkpoint(const std::string& root);

// Every step-<N> directory under root, highest step first, complete or not.
struct CheckpointEntry {
  int64_t step = 0;
  std::string dir;          // <root>/step-<N>
  std::string problem;      // why it cannot be resumed from (read_checkpoint_info's error); "" = complete
};
std::vector<CheckpointEntry> list_checkpoints(const std::string& root);

// The lock on a checkpoint directory (the file's flock, released when the object is
// destroyed or its process dies). Empty on ranks other than 0 and for no directory.
class CheckpointDirLock {
 public:
  CheckpointDirLock() = default;
  CheckpointDirLock(CheckpointDirLock&& o) noexcept;
  CheckpointDirLock& operator=(CheckpointDirLock&& o) noexcept;
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;
  ~CheckpointDirLock();
  bool held() const { return fd_ >= 0; }
  void release();  // unlocks now (idempotent)

 private:
  friend struct CheckpointDirLockAccess;  // checkpoint_dirs.hpp
  int fd_ = -1;
  uint64_t dev_ = 0, ino_ = 0;  // the directory's identity, for this process's saves
};

// Collective, at the start of a run that saves into root, before anything else: rank 0
// creates root if needed, refuses a root that is (or is inside) a checkpoint, proves it
// writable (a probe file created and removed) and takes its lock. Every rank returns (the
// lock on rank 0) or throws the same ConfigError: "checkpoint_dir X is in use by another
// strata train (pid N on host H); ...", "... is not writable ...", "... is a checkpoint
// ...". Other ranks take no lock: a run is one holder, however many ranks write.
CheckpointDirLock lock_checkpoint_dir(coll::Communicator& host, const std::string& root);

// Collective, at start-up with root locked (root may be "" for a run that saves
// nothing): the checkpoint a run starts from, "" for step 0. `from` non-empty: that
// step-<N> directory (--resume-from), which must be complete; otherwise with `resume` the
// latest complete one under root (--resume), or none. Refuses (ConfigError) when root holds
// step-<M> directories beyond the start, complete or damaged: the run would stop at the
// first save that reached one ("exists already"), so it is named with the fix at once.
// A damaged `from` is a CorruptionError listing the complete checkpoints beside it.
// Every rank gets rank 0's answer or its error.
std::string choose_start_checkpoint(coll::Communicator& host, const std::string& root, bool resume,
                                    const std::string& from);

// "; the complete checkpoints in 'P' are step-a, step-b: name one with --resume-from
// P/step-b" for the directory holding `failed` (without `failed` itself), or that there
// is none: what a CorruptionError about `failed` adds for `strata train`.
std::string other_checkpoints_hint(const std::string& failed);

// Reads and checks a checkpoint's manifest only (no shard data). Throws
// CorruptionError (missing/garbled manifest, missing rank file, wrong size) or
// ConfigError naming the problem.
CheckpointInfo read_checkpoint_info(const std::string& dir);
// The manifest part of read_checkpoint_info: `text` as manifest.json of checkpoint `dir`
// holds it, checked (checksum, fields, their types and ranges, that the sizes fit
// together) but no file opened. seal_checkpoint_manifest: `body` with the checksum a
// manifest carries (any "checksum" in it replaced), as the text of a manifest.json.
CheckpointInfo parse_checkpoint_manifest(const std::string& dir, const std::string& text);
std::string seal_checkpoint_manifest(nlohmann::json body);

// Collective: loads optimizer shards (and so the working parameters) into the engine.
// The fp32 master weights and moments are stored whatever the precision, so a checkpoint
// resumes in any precision: the working copy is the masters rounded to the engine's type.
// Resuming in another precision than the one saved says so in a warning; an fp16 run
// resumed in fp16 gets its loss scaler back.
// Every value loaded is checked as read_checkpoint_group checks it, against the
// engine's working type (rounding a master weight beyond fp16's range would give inf):
// refused, or clamped to the largest finite value under strata.out_of_range = "clamp"
// (EngineOptions::out_of_range). A refusal, like a checksum mismatch, stops the load at
// that group: load again before training on.
// The engine's groups must match the checkpoint's (names and numels; otherwise a
// ConfigError naming the first difference, e.g. "checkpoint is of another model
// shape"). A checkpoint written by a different world size is re-sharded: each rank
// reads its own slice from the writers' files. Checksums are verified; a mismatch is a
// CorruptionError naming the file.
CheckpointInfo load_checkpoint(ZeroEngine& engine, coll::Communicator& host, const std::string& dir);

// Collective: the weights only (fine-tuning, `strata train --init-from`): each rank reads
// its slice of the checkpoint's fp32 master weights (only those bytes); the Adam moments
// start at zero, the step and optimizer step counts at 0. Groups must match as in
// load_checkpoint.
// first_groups: only the engine's first that many model groups are loaded, and the
// checkpoint must hold exactly those (a LoRA run from its base model's checkpoint: the
// adapter groups after them keep their start).
CheckpointInfo load_checkpoint_weights(ZeroEngine& engine, coll::Communicator& host, const std::string& dir,
                                       size_t first_groups = SIZE_MAX);

// A checkpoint made without an engine (`strata import`), written as saves write one:
// root/.step-00000000.tmp, fsynced, renamed to root/step-00000000. Rank 0 locks root
// (created if needed) and refuses a root that holds checkpoints or lies in one; groups
// are added one at a time in the model's order (the master weights; zero moments), so
// only one group's shard is ever in memory; finish() writes the manifest and renames.
// Destroyed unfinished, it removes its .tmp.
//
// With a host communicator of W ranks it is collective: every rank writes rank-<r>.bin
// with its shard of each group (shard = ceil(numel / W) elements, the last rank's padded
// with zeros), which training re-shards like any checkpoint. Without one, W = 1.
class InitialCheckpointWriter {
 public:
  explicit InitialCheckpointWriter(const std::string& root, coll::Communicator* host = nullptr);
  ~InitialCheckpointWriter();
  InitialCheckpointWriter(const InitialCheckpointWriter&) = delete;
  InitialCheckpointWriter& operator=(const InitialCheckpointWriter&) = delete;
  // Elements of group `numel` this rank writes: [shard_begin(numel), + shard_size(numel)),
  // of which those below numel are the group's (the rest padding).
  uint64_t shard_size(uint64_t numel) const;
  uint64_t shard_begin(uint64_t numel) const { return shard_size(numel) * static_cast<uint64_t>(rank_); }
  // This rank's shard of the group: shard_size(numel) floats (padding included).
  void add_group(const std::string& name, const float* shard, uint64_t numel);
  // Collective. `failed`: this rank's error while reading its part (or null); when any
  // rank has one, every rank throws the lowest failing rank's, and nothing is left
  // behind. Returns the checkpoint's directory.
  std::string finish(const nlohmann::json& config, const std::string& precision, const nlohmann::json& extra,
                     std::exception_ptr failed = nullptr);

 private:
  struct State;
  std::unique_ptr<State> s_;
  int rank_ = 0, world_ = 1;
};

// Reads the full fp32 master weights of the model's group g (unpadded, numel elements;
// checkpoint_model_groups below counts the groups) from a checkpoint's files, without an engine (export, sample). Verifies the checksums of
// the segments it reads (CorruptionError), and the values: a NaN or inf, or (working
// bf16 or fp16: the type a caller rounds them to) a value beyond working's range, is a
// ConfigError naming the tensor (a GPT checkpoint's, else the group) and flat index.
std::vector<float> read_checkpoint_group(const CheckpointInfo& info, int g, DType working = DType::F32);

// A checkpoint's groups as the model has them: groups saved in parts ("block.3@1536",
// gpt_parts: per-tensor gathers and tiles) merged into the group they cut (name and numel;
// padded and shard 0). read_checkpoint_group and the loads count groups this way, so a
// checkpoint resumes, fine-tunes and exports whatever the bucket size and tile factor of
// the run that saved it and of the one that reads it.
std::vector<CheckpointGroup> checkpoint_model_groups(const CheckpointInfo& info);

}  // namespace strata
