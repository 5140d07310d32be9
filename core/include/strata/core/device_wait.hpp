// Waiting for device work from a thread that completes host events streams wait for.
//
// On cuda a stream's event completes in two parts: its cudaEvent (the GPU reached that
// point) and a host callback that hands it the errors of the stream's host tasks;
// Event::wait waits for both. A CUDA stream told to wait for a host event (an I/O
// completion, an MPI or staged collective) waits on the GPU for a host-mapped word the
// event's completion writes (cuda_device.cu), so no host callback blocks. Where the
// driver has no cuStreamWaitValue32 it waits in a host callback instead; CUDA runs the
// host callbacks of a device's streams on one thread, so that callback holds it until the
// event completes, and the thread that completes such events (the staged communicator's
// worker) must then never wait for a callback, or each would wait for the other forever.
// wait_device_work waits for the GPU side only of CUDA events (cudaEventSynchronize),
// part by part through when_all and when_done; every other event as Event::wait
// (when_done's parts: without their error). The host-task errors of the CUDA streams
// waited for are not seen here; a host wait on those events later still sees them.
#pragma once

#include "strata/core/event.hpp"

namespace strata {

void wait_device_work(const Event& e);

// How a cuda stream is ordered after a host event (cuda_device.cu), from
// STRATA_CUDA_HOST_EVENT_WAIT: "stream" (or unset, or empty: the GPU waits, the default) or
// "host" (the issuing thread waits for the event before it issues more: no GPU queue is
// held by a wait, at the cost of overlap). Anything else is an Error naming both values.
enum class HostEventWait { Stream, Host };
HostEventWait parse_host_event_wait(const char* value);

}  // namespace strata
