// The I/O engine under the NVMe tier, split the way fio and liburing split it:
//
//   queue    an op is prepared in the backend's submission queue (not yet visible),
//   submit   queued ops are handed to the kernel (or the worker threads) in one batch,
//   reap     finished ops are collected as raw results (bytes moved, or -errno),
//   complete the engine reads every result, resubmits short transfers for the rest,
//            retries EAGAIN/EINTR, turns anything else into an IoError, and completes
//            the transfer's event once every byte has moved (or failed).
//
// Two layers:
//  - IoBackend: the raw interface (queue/submit/reap over file indexes, offsets,
//    buffers and registered-buffer indexes). Implementations: io_uring (liburing,
//    registered files and buffers, READ_FIXED/WRITE_FIXED), a pread/pwrite thread pool
//    used when io_uring is refused, and a fault-injection decorator (fault_injection.hpp).
//  - IoEngine: transfers of any size over `intra_op_parallelism` rings. Each ring has
//    one thread that owns its backend: it queues block_size requests while fewer than
//    queue_depth are in flight, submits them in batches, sleeps in the kernel until a
//    completion (or a wake-up) arrives, and completes events. Callers never poll.
//
// All offsets, lengths and buffer addresses must be multiples of the engine's alignment
// (O_DIRECT); a misaligned request is a bug and aborts with the request's numbers.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "strata/core/event.hpp"
#include "strata/offload/aio_config.hpp"

namespace strata {

struct FaultPlan;

enum class IoDir : uint8_t { Read, Write };
const char* to_string(IoDir d);  // "read" / "write"

// ---------------------------------------------------------------------------------------
// Raw backend

// One request as the backend sees it.
struct RawOp {
  uint64_t tag = 0;      // handed back with the completion
  IoDir dir = IoDir::Read;
  unsigned file = 0;     // index into the fds given to set_files()
  uint64_t offset = 0;   // bytes into the file
  void* buf = nullptr;
  uint32_t len = 0;      // bytes
  int buf_index = -1;    // registered-buffer slot holding [buf, buf+len), or -1
};

struct RawCompletion {
  uint64_t tag = 0;
  int64_t result = 0;    // bytes moved (may be short), or -errno
};

// Not thread-safe except wake(): one thread (the ring's) drives it.
class IoBackend {
 public:
  virtual ~IoBackend() = default;
  virtual const char* name() const = 0;
  // The files ops refer to by index. io_uring registers them (fixed files) when it can,
  // noting in `notes` (may be null) why it could not.
  virtual void set_files(const std::vector<int>& fds, std::vector<std::string>* notes) = 0;
  // Registered-buffer slots; 0 when the backend has none (ops then go with buf_index -1).
  virtual unsigned buffer_slots() const = 0;
  // Registers [base, base+bytes) (at most 1 GiB) in `slot`; bytes == 0 clears the slot.
  // Returns 0, or -errno when the kernel refuses (the region is then used unregistered).
  virtual int set_buffer(unsigned slot, void* base, uint64_t bytes) = 0;
  // Prepares one op. The caller keeps at most `depth` ops outstanding (queued or in flight).
  virtual void queue(const RawOp& op) = 0;
  // Hands every queued op over, then waits until at least `wait_for` completions are
  // ready or wake() is called (wait_for 0: does not wait).
  virtual void submit(unsigned wait_for) = 0;
  // Moves up to `max` ready completions into out, without waiting. Returns the count.
  virtual size_t reap(RawCompletion* out, size_t max) = 0;
  // From any thread: makes a waiting (or the next) submit() return. Wake-ups are sticky.
  virtual void wake() = 0;
  // Whether a kernel thread polls the submission queue (io_uring SQPOLL) as set up, which
  // may be less than was asked for. The engine reports it in config().use_sqpoll.
  virtual bool sqpoll() const = 0;
};

// io_uring with `depth` data ops outstanding; probes features and drops refused ones
// (SQPOLL, single-issuer/deferred task running, registered files or buffers), noting
// each in `notes`, which are for people: code asks the backend what it kept (sqpoll(),
// buffer_slots()). Throws Unavailable with the kernel's reason when io_uring itself is
// refused. Must be called on the thread that will drive it. A submit or wait the kernel
// refuses for any reason but EINTR/EAGAIN/EBUSY is fatal, naming the call and errno: the
// ring's ops (and the callers' buffers) may still be in the kernel's hands, so failing
// their transfers would let callers reuse memory the kernel can still write. `faults`
// (tests) may fail the backend's own calls (FaultPlan::fail_uring_call).
std::unique_ptr<IoBackend> make_uring_backend(unsigned depth, bool sqpoll, std::vector<std::string>* notes,
                                              std::shared_ptr<FaultPlan> faults = nullptr);
// pread/pwrite on min(depth, 64) worker threads.
std::unique_ptr<IoBackend> make_threadpool_backend(unsigned depth);
// Decorator: consults `plan` for every op queued and fails or shortens the chosen ones.
std::unique_ptr<IoBackend> make_fault_backend(std::unique_ptr<IoBackend> inner, std::shared_ptr<FaultPlan> plan);

// O_DIRECT alignment of an open file (bytes): max(memory, offset) alignment from
// statx(STATX_DIOALIGN) where the kernel reports it, else 4096.
uint64_t probe_dio_alignment(int fd);

// ---------------------------------------------------------------------------------------
// Engine

// One file the engine does I/O on, opened by the caller with O_DIRECT. The engine
// registers it with each ring and never closes it.
struct IoFile {
  std::string path;  // named in errors
  int fd = -1;
};

// One contiguous piece of a transfer: `bytes` at `offset` of files[file] <-> buf.
struct IoSegment {
  unsigned file = 0;
  uint64_t offset = 0;  // bytes into the file
  void* buf = nullptr;
  uint64_t bytes = 0;
};

// Runs on the ring's thread when a transfer has finished, before its event completes,
// with the transfer's I/O error (null when every byte moved). Returns the final error
// (the NVMe store verifies checksums here). An exception thrown from it fails the event.
using IoFinish = std::function<std::exception_ptr(std::exception_ptr io_error)>;

struct IoEngineOptions {
  AioConfig aio;
  std::vector<IoFile> files;
  uint64_t alignment = 4096;          // bytes; offsets, lengths and buffers are multiples
  std::shared_ptr<FaultPlan> faults;  // optional fault injection under the engine (tests)
  // The fix an IoError names when the disk is full (whose files these are).
  std::string on_full = "free space on it or point nvme_path at a disk with room";
};

struct IoStats {
  uint64_t transfers = 0;        // submitted
  uint64_t requests = 0;         // ops submitted to the backend, resubmissions included
  uint64_t fixed_requests = 0;   // of those, with a registered buffer
  uint64_t bytes = 0;            // moved successfully
  uint64_t short_resubmits = 0;  // short transfers resubmitted for the remainder
  uint64_t retries = 0;          // EAGAIN/EINTR resubmissions
  uint64_t failed_transfers = 0;
};

class IoEngine {
 public:
  // Starts the rings. Throws Unavailable when aio.engine is io_uring and the kernel
  // refuses it; with Auto a refusal falls back to the thread pool with one warning.
  explicit IoEngine(IoEngineOptions opts);
  // Finishes every transfer already submitted, then stops the rings.
  ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Moves every segment; the event completes when all have (or fails with the first
  // IoError, naming path, offset and length). Buffers must stay valid until then.
  Event submit(IoDir dir, std::span<const IoSegment> segments, IoFinish finish = {});
  Event read(unsigned file, uint64_t offset, void* buf, uint64_t bytes);
  Event write(unsigned file, uint64_t offset, const void* buf, uint64_t bytes);

  // Registers a region (e.g. the pinned pool) for fixed-buffer I/O on every ring, in
  // slices of at most 1 GiB (the kernel's per-buffer limit). Blocks until every ring has
  // it. Refusals (no slots left, kernel says no) leave the region usable, unregistered.
  void register_buffer(void* base, uint64_t bytes);
  // Forgets a region given to register_buffer (before its memory is released).
  void unregister_buffer(void* base);

  std::string name() const;          // "io_uring" or "threadpool"
  uint64_t alignment() const;        // bytes
  const AioConfig& config() const;   // as running: refused features are switched off
                                     // (use_sqpoll: every ring's backend has SQPOLL)
  bool fixed_buffers() const;        // whether registered buffers are in use
  const std::vector<std::string>& notes() const;  // features dropped at setup, and why (for people)
  IoStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
