// The one wall clock for measuring intervals (step times, progress throttling, the cpu
// backend's Device::now). The simulated clock of the sim backend is sim::now().
#pragma once

#include <chrono>

namespace strata {

// Seconds of steady (monotonic) time since the first call in this process. Only
// differences mean anything.
inline double steady_seconds() {
  static const auto t0 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace strata
