// Waiting for device work from a thread that CUDA's host callbacks may be waiting for.
//
// On cuda a stream's event completes in two parts: its cudaEvent (the GPU reached that
// point) and a host callback that hands it the errors of the stream's host tasks;
// Event::wait waits for both. CUDA runs the host callbacks of a device's streams on one
// thread, and a CUDA stream told to wait for a host event (an MPI or staged collective's)
// holds that thread in a callback until the event completes. The thread that completes
// such events (the staged communicator's worker) must therefore never wait for a
// callback, or each would wait for the other forever. wait_device_work waits for the GPU
// side only of CUDA events (cudaEventSynchronize), part by part through when_all and
// when_done; every other event as Event::wait (when_done's parts: without their error).
// The host-task errors of the CUDA streams waited for are not seen here; a host wait on
// those events later still sees them.
#pragma once

#include "strata/core/event.hpp"

namespace strata {

void wait_device_work(const Event& e);

}  // namespace strata
