// For the multi-rank collective tests: wait for every posted operation before checking
// anything, so that a failed check on one rank leaves no other rank waiting.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <vector>

#include "strata/core/event.hpp"

namespace strata::coll::test_support {

// Waits for every event; returns how many failed (each failure is also reported).
inline int wait_all(const std::vector<Event>& events) {
  int failed = 0;
  for (const Event& e : events) {
    try {
      e.wait();
    } catch (const std::exception& ex) {
      ADD_FAILURE() << "operation failed: " << ex.what();
      ++failed;
    }
  }
  return failed;
}

}  // namespace strata::coll::test_support
