/* libstrata: the C API that lets another trainer use Strata's tiered store and ZeRO-3
 * partitioner as its memory backend (docs/embedding.md).
 *
 * The caller registers parameter groups (one flat tensor each, e.g. a transformer
 * block), then per micro-batch: acquires a group's full parameters before computing
 * with it, releases them after, and hands in the group's gradient. strata_step runs the
 * optimizer (Adam/AdamW, fp32 master weights and moments) over every shard, wherever
 * its tier (device, pinned host memory, NVMe) is. Configuration is Strata's JSON
 * (docs/configuration.md: DeepSpeed keys plus a `strata` section).
 *
 * Precision: the configuration's `bf16` or `fp16` section (DeepSpeed's keys) makes the
 * runtime train in 16 bits: every group is registered with that dtype, acquired
 * parameters and gradient buffers are 16-bit (zero copy), gradients are handed in as
 * 16-bit values, and the master weights and Adam moments stay fp32; the working
 * parameters are the master weights rounded to nearest even after every step. Without
 * either section the runtime trains in fp32. In fp16 the caller multiplies its loss by
 * strata_loss_scale() (so its gradients carry the scale, which the optimizer divides
 * out); a step whose gradients overflowed is skipped and the scale lowered
 * (strata_step's *stepped is 0). Nothing is converted silently: a buffer of another
 * dtype is refused with STRATA_ERR_DTYPE, except where a call says it takes F32 too.
 * Nor does a value overflow silently: an initial value (init_value, init_std's largest
 * draw) or a loaded master weight beyond the 16-bit range (fp16: 65504) is refused, naming
 * it, unless the configuration sets "strata": {"out_of_range": "clamp"}, which clamps it
 * to the largest finite value of its sign. NaN or inf weights (STRATA_INIT_DATA data, a
 * loaded checkpoint) are refused in every precision.
 *
 * Trace-driven prefetch: the order of acquires in the first micro-step is recorded;
 * later micro-steps prefetch by it. A micro-step that departs from it fetches on demand
 * for the rest of that micro-step and its order becomes the new trace
 * (strata_stats.trace_departures counts departures).
 *
 * Conventions
 *  - Every call except the version, status-name and last-error queries returns a
 *    strata_status. On failure strata_last_error() gives a message naming the problem
 *    and the fix; no call crashes on misuse that this header describes.
 *  - Handles are values, not pointers. A destroyed handle (or one never issued) is
 *    detected and gives STRATA_ERR_INVALID_HANDLE: identifiers are never reused.
 *  - Multi-rank runs (mpirun): calls marked "collective" must be made by every rank, in
 *    the same order, with matching arguments.
 *  - Thread-safety: every call may be made from any thread. Calls on one runtime are
 *    serialised by that runtime's lock (a call that waits for data, like
 *    strata_acquire, holds it while waiting). Different runtimes are independent.
 *    strata_last_error is per thread. On more than one rank, the collective calls of a
 *    runtime must still reach each rank in the same order, so make them from one
 *    thread per rank (or order them yourself). The table in docs/embedding.md lists
 *    each call.
 *
 * ABI: STRATA_API_VERSION is (major << 16) | minor. A library accepts a caller built
 * against the same major and a minor no newer than its own (strata_runtime_create
 * checks the version passed). Structs that may grow start with struct_size; set it to
 * sizeof(the struct) as compiled, and the library reads or writes only that much.
 */
#ifndef STRATA_STRATA_H
#define STRATA_STRATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define STRATA_API __attribute__((visibility("default")))
#else
#define STRATA_API
#endif

#define STRATA_API_VERSION_MAJOR 1
/* 1.1: 16-bit runtimes, strata_loss_scale, strata_stats.skipped_steps and loss_scale,
 * strata_runtime_info.dtype.
 * 1.2: frozen groups (strata_group_desc.kind, STRATA_GROUP_FROZEN), strata_learning_rate and
 * strata_set_learning_rate. */
#define STRATA_API_VERSION_MINOR 2
#define STRATA_API_VERSION ((STRATA_API_VERSION_MAJOR << 16) | STRATA_API_VERSION_MINOR)

#define STRATA_MAX_DIMS 8 /* dimensions of a parameter group's shape */

typedef enum strata_status {
  STRATA_OK = 0,
  STRATA_ERR_INVALID_ARGUMENT = 1, /* a null pointer, a bad size or shape, malformed JSON */
  STRATA_ERR_INVALID_HANDLE = 2,   /* the runtime was destroyed or never created */
  STRATA_ERR_UNKNOWN_GROUP = 3,    /* no parameter group with that id or name */
  STRATA_ERR_DTYPE = 4,            /* a dtype this group or this build does not take */
  STRATA_ERR_STATE = 5,            /* a call out of order (double release, step mid-batch, ...) */
  STRATA_ERR_CONFIG = 6,           /* the configuration is invalid or cannot work */
  STRATA_ERR_OUT_OF_MEMORY = 7,    /* a tier's budget (or host memory) cannot hold it */
  STRATA_ERR_IO = 8,               /* a file or NVMe operation failed */
  STRATA_ERR_CORRUPT = 9,          /* data read back is damaged (checksum, checkpoint) */
  STRATA_ERR_UNAVAILABLE = 10,     /* a backend or library this asks for is not here */
  STRATA_ERR_COLLECTIVE = 11,      /* a collective between ranks failed or was misused */
  STRATA_ERR_VERSION = 12,         /* the caller was built against an incompatible API */
  STRATA_ERR_BUFFER_TOO_SMALL = 13, /* an output string would not fit: the call did nothing */
  STRATA_ERR_NOT_FOUND = 14,       /* no checkpoint under the given directory */
  STRATA_ERR_INTERNAL = 15,        /* a bug in Strata; the message says where */
  STRATA_STATUS_FORCE_INT32_MIN = -0x7fffffff - 1, /* with the next: negative int32s are values too */
  STRATA_STATUS_FORCE_INT32 = 0x7fffffff /* not a status: keeps every int32 a valid value */
} strata_status;

/* Element types. A runtime has one: F32, or BF16 / F16 when its configuration enables
 * `bf16` / `fp16`; its groups, acquired parameters and gradients are all of that type.
 * F16 and BF16 elements are their IEEE binary16 / bfloat16 bits (uint16_t in C). */
typedef enum strata_dtype {
  STRATA_F32 = 0,
  STRATA_F16 = 1,
  STRATA_BF16 = 2,
  STRATA_DTYPE_FORCE_INT32_MIN = -0x7fffffff - 1, /* with the next: negative int32s are values too */
  STRATA_DTYPE_FORCE_INT32 = 0x7fffffff /* not a dtype: any int32 a caller passes is then a
                                          value the library can check, in C and C++ alike */
} strata_dtype;

/* Where a buffer lives. The values are DLPack's kDLCPU and kDLCUDA. */
typedef enum strata_device_type {
  STRATA_DEVICE_CPU = 1,
  STRATA_DEVICE_CUDA = 2,
  STRATA_DEVICE_FORCE_INT32_MIN = -0x7fffffff - 1, /* with the next: negative int32s are values too */
  STRATA_DEVICE_FORCE_INT32 = 0x7fffffff /* not a device */
} strata_device_type;

typedef enum strata_tier {
  STRATA_TIER_DEVICE = 0,
  STRATA_TIER_PINNED = 1,
  STRATA_TIER_NVME = 2,
  STRATA_TIER_FORCE_INT32_MIN = -0x7fffffff - 1, /* with the next: negative int32s are values too */
  STRATA_TIER_FORCE_INT32 = 0x7fffffff /* not a tier */
} strata_tier;
#define STRATA_TIER_COUNT 3

/* A runtime: one ZeRO engine over one device and one communicator. id 0 is never valid. */
typedef struct strata_runtime {
  uint64_t id;
} strata_runtime;

/* How a group's initial values are made. The engine's initialisers depend only on
 * (strata.seed, group index, element index), so every world size starts alike. */
typedef enum strata_init_kind {
  STRATA_INIT_NORMAL = 0,   /* init_std * N(0, 1) */
  STRATA_INIT_ZEROS = 1,
  STRATA_INIT_ONES = 2,
  STRATA_INIT_CONSTANT = 3, /* init_value everywhere */
  STRATA_INIT_DATA = 4,     /* copied from `data` */
  STRATA_INIT_FORCE_INT32_MIN = -0x7fffffff - 1, /* with the next: negative int32s are values too */
  STRATA_INIT_FORCE_INT32 = 0x7fffffff /* not an initialiser */
} strata_init_kind;

/* Whether a group is trained. Since API 1.2. */
typedef enum strata_group_kind {
  /* Gradients handed in every micro-batch, fp32 master weights and Adam moments, stepped. */
  STRATA_GROUP_TRAINED = 0,
  /* Not trained (a LoRA run's base weights, requires_grad=False): held in the runtime's
   * dtype in offload_param's tier, sharded and acquired like any group, but with no
   * gradient, master weights or optimizer states: 2 bytes per parameter in 16 bits (4 in
   * fp32) where a trained group costs 18 or more. strata_grad_buffer, strata_grad_ready and
   * strata_grad_submit refuse it (STRATA_ERR_INVALID_ARGUMENT), strata_begin_micro_step
   * expects no gradient for it, strata_step and the gradient norm leave it out, and its
   * values never change (checkpoints save and load them). */
  STRATA_GROUP_FROZEN = 1,
  STRATA_GROUP_KIND_FORCE_INT32_MIN = -0x7fffffff - 1, /* with the next: negative int32s are values too */
  STRATA_GROUP_KIND_FORCE_INT32 = 0x7fffffff /* not a kind */
} strata_group_kind;

typedef struct strata_group_desc {
  /* sizeof(strata_group_desc); a caller built against API 1.0 or 1.1 passes the size
   * without `kind`, and its groups are trained. */
  uint32_t struct_size;
  /* Unique within the runtime, non-empty, UTF-8 with no control characters (checkpoints
   * keep it as text; messages show it): another is STRATA_ERR_INVALID_ARGUMENT. A binding
   * whose strings may hold a NUL must refuse those, not pass them cut at the NUL. */
  const char* name;
  int32_t ndim;           /* 1 .. STRATA_MAX_DIMS */
  const int64_t* shape;   /* [ndim], each >= 1; numel is their product */
  strata_dtype dtype;     /* the runtime's (strata_runtime_info.dtype); another is STRATA_ERR_DTYPE */
  strata_init_kind init;
  float init_std;         /* STRATA_INIT_NORMAL */
  float init_value;       /* STRATA_INIT_CONSTANT */
  /* STRATA_INIT_DATA: numel elements of dtype in host memory, copied before the call
   * returns. On several ranks every rank must pass the same values. In 16 bits the fp32
   * master weights start as these values widened (exactly), as DeepSpeed's start from
   * the 16-bit model: round fp32 weights to the group's dtype before passing them. */
  const void* data;
  /* Since API 1.2. STRATA_GROUP_TRAINED (0, so a zeroed desc trains) or STRATA_GROUP_FROZEN. */
  strata_group_kind kind;
} strata_group_desc;

/* A buffer handed out by strata_acquire or strata_grad_buffer. */
typedef struct strata_buffer {
  void* data;             /* numel elements, contiguous, in the group's flat layout */
  uint64_t numel;
  strata_dtype dtype;     /* the runtime's: parameters and gradients are never converted */
  strata_device_type device_type; /* CPU on the cpu backend, CUDA on the cuda backend */
  int32_t device_id;      /* the GPU ordinal (0 on the cpu backend) */
  int32_t ndim;
  int64_t shape[STRATA_MAX_DIMS]; /* the group's shape as registered */
  /* What to wait on before reading: NULL means the data is ready when the call
   * returns, which is always the case on the cpu backend and, in this version, on the
   * cuda backend too (the engine waits for the gather on the host before returning).
   * A later minor version may return a cudaEvent_t here instead; a caller on cuda that
   * gets a non-NULL value must make its stream wait on it (cudaStreamWaitEvent) before
   * reading. */
  void* ready_event;
} strata_buffer;

typedef struct strata_tier_stats {
  uint64_t budget; /* bytes */
  uint64_t used;   /* bytes now */
  uint64_t peak;   /* bytes, high-water mark */
} strata_tier_stats;

typedef struct strata_stats {
  uint32_t struct_size; /* sizeof(strata_stats) */
  strata_tier_stats tiers[STRATA_TIER_COUNT];              /* indexed by strata_tier */
  uint64_t bytes_moved[STRATA_TIER_COUNT][STRATA_TIER_COUNT]; /* [from][to], bytes */
  double elapsed_s;      /* since the engine started (device clock) */
  /* bytes_moved / elapsed_s: bytes/s averaged over the whole run, idle time included.
   * It says how much a path was used, not how fast the link is (bench/ measures that). */
  double bandwidth[STRATA_TIER_COUNT][STRATA_TIER_COUNT];
  double exposed_wait_s;   /* time acquire and gradient calls waited on transfers, summed */
  double optimizer_s;      /* the last optimizer step, waits for states included */
  double optimizer_wait_s; /* of optimizer_s, waiting for states to arrive */
  uint64_t moves;          /* tier moves started */
  uint64_t evictions;
  uint64_t gathers;        /* parameter all_gathers started */
  uint64_t prefetched;     /* of which ahead of need */
  uint64_t trace_departures; /* micro-steps that left the recorded acquire order */
  int64_t optimizer_steps;
  double last_grad_norm;   /* of the averaged gradient, before clipping (loss scale divided out) */
  /* Since API 1.1. */
  uint64_t skipped_steps;  /* strata_step calls that skipped (gradients not finite: fp16 overflows) */
  double loss_scale;       /* as strata_loss_scale (0 before the engine starts, like the rest) */
} strata_stats;

typedef struct strata_runtime_info {
  uint32_t struct_size;    /* sizeof(strata_runtime_info) */
  int32_t rank, world_size;
  strata_device_type device_type;
  int32_t device_id;
  int32_t num_groups;
  int32_t started;         /* 1 once the engine runs (groups can no longer be added) */
  int32_t gradient_accumulation_steps;
  int32_t zero_stage;
  /* Since API 1.1. */
  strata_dtype dtype;      /* the precision: every group's, every buffer's (bf16/fp16 sections) */
} strata_runtime_info;

/* ---- queries (any thread, no runtime needed) ---- */

STRATA_API uint32_t strata_api_version(void);      /* STRATA_API_VERSION of the library */
STRATA_API const char* strata_version_string(void); /* e.g. "strata 0.1.0 (api 1.0)" */
STRATA_API const char* strata_status_name(strata_status s); /* "STRATA_ERR_DTYPE" */
/* The message of the last failed call on this thread; "" after a call that succeeded.
 * Valid until this thread's next Strata call. */
STRATA_API const char* strata_last_error(void);

/* ---- runtime lifetime ---- */

/* Creates a runtime from a JSON configuration (docs/configuration.md). api_version:
 * pass STRATA_API_VERSION. Collective (under mpirun it joins the job's communicator).
 * The backend (strata.backend) must be cpu or cuda. */
STRATA_API strata_status strata_runtime_create(uint32_t api_version, const char* config_json, strata_runtime* out);
STRATA_API strata_status strata_runtime_create_from_file(uint32_t api_version, const char* path,
                                                         strata_runtime* out);
/* Frees everything the runtime holds; pointers it handed out become invalid. Calls
 * racing with it on other threads either finish first or get STRATA_ERR_INVALID_HANDLE.
 * Destroying twice gives STRATA_ERR_INVALID_HANDLE. Collective. */
STRATA_API strata_status strata_runtime_destroy(strata_runtime rt);
STRATA_API strata_status strata_runtime_get_info(strata_runtime rt, strata_runtime_info* out);

/* ---- parameter groups (before the engine starts) ---- */

/* Adds a group; *group_out is its id (0, 1, ... in registration order). Refused once
 * the engine has started. Not collective, but every rank must register the same groups
 * in the same order (strata_start checks and names the first difference). */
STRATA_API strata_status strata_register_group(strata_runtime rt, const strata_group_desc* desc, int32_t* group_out);
STRATA_API strata_status strata_find_group(strata_runtime rt, const char* name, int32_t* group_out);
/* The group's shape (shape must hold STRATA_MAX_DIMS values) and element count. */
STRATA_API strata_status strata_group_shape(strata_runtime rt, int32_t group, int32_t* ndim, int64_t* shape,
                                            uint64_t* numel);

/* Builds the engine: shards, tiers, initial values. Collective. Implied by the first
 * call that needs the engine (set_schedule, begin_micro_step, read_params, checkpoints);
 * call it yourself to see start-up errors (budgets) at a known point. Before it,
 * strata_get_stats gives zeros. */
STRATA_API strata_status strata_start(strata_runtime rt);
/* Optional: the order in which one micro-step will acquire groups (forward then
 * backward). Given, it replaces the recorded trace and is never re-learned. */
STRATA_API strata_status strata_set_schedule(strata_runtime rt, const int32_t* order, size_t n);

/* ---- one training step ---- */

/* Opens a micro-batch; gradient_accumulation_steps of them per strata_step. Every
 * trained group (not STRATA_GROUP_FROZEN) must have had its gradient handed in for the
 * previous micro-batch. */
STRATA_API strata_status strata_begin_micro_step(strata_runtime rt);
/* The group's full parameters, ready to read (see strata_buffer.ready_event), valid
 * until the matching strata_release. Of the runtime's dtype: in 16 bits, the rounded
 * working copy the model computes with (the fp32 master weights are the optimizer's).
 * A group may be acquired again while held; each acquire needs its release. Inside a micro-batch only. Collective on stage 3 (the
 * gather), so on several ranks acquire in the same order everywhere.
 * Read-only: it is the engine's own buffer, handed out without a copy, so a write into
 * it cannot be refused where it happens. Such a write is never taken into the
 * optimizer's master weights (nor checkpoints), but later acquires and strata_read_params
 * may see it until a step updates the parameters, or not, by the group's kind (persistent
 * or not, ZeRO stage). With strata.checksums on, the buffer is hashed here and again at
 * each strata_release, which finds any write, in every kind of group alike. */
STRATA_API strata_status strata_acquire(strata_runtime rt, int32_t group, strata_buffer* out);
/* Gives one acquire's hold back. With strata.checksums on, parameters that were written
 * while held are STRATA_ERR_STATE naming the group (the release is done all the same):
 * copy the buffer before changing it. */
STRATA_API strata_status strata_release(strata_runtime rt, int32_t group);
/* A writable buffer for the group's gradient of this micro-batch (zero copy), of the
 * runtime's dtype: write all numel elements, then call strata_grad_ready. One
 * outstanding per group. A frozen group has none: STRATA_ERR_INVALID_ARGUMENT. In fp16 the gradient is of the loss times strata_loss_scale(). */
STRATA_API strata_status strata_grad_buffer(strata_runtime rt, int32_t group, strata_buffer* out);
/* Hands in the buffer's gradient: reduce-scattered across ranks and accumulated into
 * this rank's shard. Collective. */
STRATA_API strata_status strata_grad_ready(strata_runtime rt, int32_t group);
/* strata_grad_buffer, a copy from `data` (numel elements of dtype, in the runtime's
 * device memory: host memory on the cpu backend), strata_grad_ready. Collective. dtype
 * must be the group's: an fp32 gradient for a 16-bit group is STRATA_ERR_DTYPE (round it
 * yourself, where you can see what rounding costs; in fp16, after scaling the loss). */
STRATA_API strata_status strata_grad_submit(strata_runtime rt, int32_t group, const void* data, strata_dtype dtype,
                                            uint64_t numel);
/* Runs the optimizer after the last micro-batch. *stepped (may be NULL) is 1, or 0 when
 * the gradient norm was not finite on some rank and the step was skipped (parameters and
 * optimizer states unchanged). In fp16 that is an overflow: the loss scale was lowered
 * (DeepSpeed's dynamic scaler: hysteresis, min_loss_scale), so read strata_loss_scale
 * again before the next micro-batch. An overflow at fp16.min_loss_scale means training
 * diverged in fp16: STRATA_ERR_STATE, naming the fixes; that step is over (skipped), so
 * a checkpoint can be loaded. Collective. */
STRATA_API strata_status strata_step(strata_runtime rt, int32_t* stepped);

/* The group's full current parameters copied into host memory dst (numel elements of
 * dtype), outside micro-batches too (evaluation, export). dtype is the group's, or F32
 * for a 16-bit group (its working values widened exactly). Collective. */
STRATA_API strata_status strata_read_params(strata_runtime rt, int32_t group, void* dst, strata_dtype dtype,
                                            uint64_t numel);

/* The factor the caller multiplies its loss by before backward, so that the gradients it
 * hands in carry it: the fp16 loss scale (2^initial_scale_power at first, or
 * fp16.loss_scale when static), 1 in fp32 and bf16. It changes only in strata_step (and
 * strata_load_checkpoint, which restores it): read it after each step. Any thread, any
 * time, before strata_start too. Since API 1.1. */
STRATA_API strata_status strata_loss_scale(strata_runtime rt, double* out);

/* The learning rate of the next optimizer step (of the open step, inside one): the
 * `scheduler` section's at this step, optimizer.params.lr without one, or the last value
 * given to strata_set_learning_rate. Any time, before strata_start too. Since API 1.2. */
STRATA_API strata_status strata_learning_rate(strata_runtime rt, double* out);
/* Sets the learning rate of every optimizer step from the next one on, for a caller that
 * schedules it itself (torch's schedulers, transformers' Trainer). Between steps only
 * (before a step's first strata_begin_micro_step: the speculative optimizer updates
 * during the backward pass). lr finite and >= 0. A configuration with a `scheduler`
 * section is STRATA_ERR_STATE: one of the two sets it. Since API 1.2. */
STRATA_API strata_status strata_set_learning_rate(strata_runtime rt, double lr);

/* ---- checkpoints (runtime/include/strata/runtime/formats/checkpoint.hpp) ---- */

/* Saves a sharded checkpoint under root (root/step-<N>/), between steps only.
 * extra_json (may be NULL) is stored with it (data position, RNG state). The new
 * directory is written to dir_out (capacity dir_cap bytes, NUL included; may be NULL).
 * A dir_out too small for it, on any rank, is STRATA_ERR_BUFFER_TOO_SMALL before
 * anything is saved. Collective. */
STRATA_API strata_status strata_save_checkpoint(strata_runtime rt, const char* root, const char* extra_json,
                                                char* dir_out, size_t dir_cap);
/* Loads the checkpoint in dir (a step-<N> directory, or a root: its latest) into the
 * engine, between steps only. Its extra JSON goes to extra_out (capacity extra_cap
 * bytes, NUL included; may be NULL). An extra_out too small for it, on any rank, is
 * STRATA_ERR_BUFFER_TOO_SMALL before anything is loaded (the manifest holds it, so its
 * size is known first). Collective. */
STRATA_API strata_status strata_load_checkpoint(strata_runtime rt, const char* dir, char* extra_out,
                                                size_t extra_cap);
/* The complete checkpoint with the highest step under root; STRATA_ERR_NOT_FOUND when
 * there is none. */
STRATA_API strata_status strata_latest_checkpoint(const char* root, char* dir_out, size_t dir_cap);

/* ---- statistics ---- */

STRATA_API strata_status strata_get_stats(strata_runtime rt, strata_stats* out);

#ifdef __cplusplus
}
#endif

#endif /* STRATA_STRATA_H */
