// The staged backend: collectives on device buffers, carried by a host communicator
// through pinned host memory. NCCL refuses two ranks on one GPU; with this backend
// `mpirun -np 2` or `-np 4` can share one GPU (and, on the cpu backend, the engine's
// device-buffer path runs through the same code in CI).
//
// Each operation: the device data is copied into a pinned staging slot (copy_async on a
// stream of the device), the host communicator's collective runs on the slot, and the
// result is copied back. Staging is allocated once, up front (staging_bytes, split in
// two slots): larger buffers go in chunks, and the copy into one slot overlaps the
// collective on the other (copy-in of chunk i+1 runs during the collective of chunk i).
// Staging changes no arithmetic: a buffer that fits one slot is reduced by the host
// communicator's collective on the same elements, so the bits equal the host
// communicator's on host buffers. A buffer cut in chunks is reduced by several smaller
// collectives, for which the MPI library may pick another algorithm and so another order
// of float sums (exact values, integers, gathers and broadcasts are the same).
//
// Operations run on a worker thread of this communicator, one after another in call
// order. `after` is waited for there; if it fails, the operation still runs (so the
// other ranks do not hang) and its event fails with that error. Device work (`after`,
// the copies) is waited for with wait_device_work (core/device_wait.hpp), never through
// a CUDA host callback: on a driver without stream memory operations, a CUDA stream
// waiting for one of these operations holds CUDA's callback thread until it completes.
// On cuda, therefore, the errors of host tasks on the streams that `after` names do not
// fail the operation (a host wait on `after` still sees them). An operation's event is
// made with HostEvent::DeviceWait::Host: a CUDA stream ordered after it waits on the
// thread that orders it, not on the GPU, since the copies that complete it are issued
// later and could sit on a hardware queue behind the waiting stream. A failed copy or host
// collective fails the operation's event; the remaining chunks still run their
// collectives, for the same reason.
//
// The host communicator is owned and used by this communicator alone: its collectives
// are issued from the worker thread, and a second user issuing its own from another
// thread could order them differently on different ranks. Give it a communicator of
// its own (make_host_communicator makes a new one each call).
//
// NOTE: the cuda path (pinned staging registered with cudaHostRegister, copies on a CUDA
// stream, waits through cudaEventSynchronize) hung on an H200 and an H100 (2026-11-27,
// 2026-11-28; docs/training.md) before its events were waited for on the host, and has
// not run on a GPU since; the cpu path is tested under mpirun at 2 and 4 ranks
// (scripts/gpu-check.sh ranks is the GPU check).
#pragma once

#include <cstddef>
#include <memory>

#include "strata/collectives/communicator.hpp"
#include "strata/core/device.hpp"

namespace strata::coll {

// Bytes of pinned staging a staged communicator holds (two slots of half each), as
// DeepSpeed's default bucket: large enough that a chunk's collective outweighs its fixed
// cost, small beside a GPU's memory.
inline constexpr size_t kDefaultStagingBytes = 64ull << 20;

struct StagedOptions {
  size_t staging_bytes = kDefaultStagingBytes;  // pinned host bytes, both slots together
  int numa_node = -1;                           // where the staging lives; -1: the default policy
};

// The smallest staging_bytes a world of `world_size` ranks can use: one element of the
// widest type per rank and slot, plus reduce_scatter's result (all_to_all's: one sent and
// one received per rank).
size_t min_staging_bytes(int world_size);

// A communicator over host's ranks for buffers in `device`'s memory. Takes host (see
// above); device must outlive the result. Throws CollectiveUsageError when
// staging_bytes is below min_staging_bytes, OutOfBudget when the staging cannot be had.
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host, Device& device,
                                                       const StagedOptions& opts = {});

}  // namespace strata::coll
