// Contracts of the C API that hold for every kind of group (issue #37): a write into
// acquired (read-only) parameters is found at release with strata.checksums, whatever
// the group's kind.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "capi_harness.hpp"

using namespace capi_test;

namespace {

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

// The toy groups (264, 408 and 560 elements) under `stage`; in stage 3 those of at most
// 300 elements (block.0) are persistent: gathered once and kept, so a write into them
// outlives its release, where the others' is dropped with the gathered copy.
std::string layout_json(int stage, bool checksums) {
  std::string j = config_json({.stage = stage});
  if (stage == 3)
    j = replaced(j, "\"stage3_param_persistence_threshold\": 0", "\"stage3_param_persistence_threshold\": 300");
  if (!checksums) j = replaced(j, "\"checksums\": true", "\"checksums\": false");
  return j;
}

// Ways to write into an acquired buffer of n floats.
using Write = void (*)(float* p, uint64_t n);
const std::vector<std::pair<const char*, Write>> kWrites = {
    {"first element", [](float* p, uint64_t) { p[0] += 1.0f; }},
    {"last element", [](float* p, uint64_t n) { p[n - 1] = -p[n - 1] - 1.0f; }},
    {"a NaN in the middle", [](float* p, uint64_t n) { p[n / 2] = std::nanf(""); }},
    {"every element", [](float* p, uint64_t n) {
       for (uint64_t i = 0; i < n; ++i) p[i] *= 2.0f;
     }},
};

}  // namespace

TEST(CApiContracts, AWriteIntoAcquiredParametersIsFoundAtReleaseInEveryKindOfGroup) {
  const auto gs = toy_groups(3);
  for (int stage : {3, 2, 1}) {
    RuntimeHandle h(layout_json(stage, true));
    register_toy(h.rt, gs);
    ASSERT_STRATA_OK(strata_begin_micro_step(h.rt));
    for (int32_t g = 0; g < 3; ++g) {
      const std::string kind = "stage " + std::to_string(stage) + ", group " + gs[g].name +
                               (stage == 3 && g == 0 ? " (persistent)" : "");
      strata_buffer b{};
      // Reading only: no complaint.
      ASSERT_STRATA_OK(strata_acquire(h.rt, g, &b));
      EXPECT_STRATA_OK(strata_release(h.rt, g)) << kind;
      for (const auto& [what, write] : kWrites) {
        ASSERT_STRATA_OK(strata_acquire(h.rt, g, &b));
        write(static_cast<float*>(b.data), b.numel);
        EXPECT_STRATA_FAILS(strata_release(h.rt, g), STRATA_ERR_STATE,
                            "group '" + gs[g].name + "' were written while acquired");
        EXPECT_NE(std::string(strata_last_error()).find("The group is released"), std::string::npos) << kind;
        // It was released all the same: the next acquire and release balance.
        ASSERT_STRATA_OK(strata_acquire(h.rt, g, &b)) << kind << ", " << what;
        EXPECT_STRATA_OK(strata_release(h.rt, g)) << kind << ", " << what;
      }
      // Held twice: the write is reported by the release after it, once.
      ASSERT_STRATA_OK(strata_acquire(h.rt, g, &b));
      ASSERT_STRATA_OK(strata_acquire(h.rt, g, &b));
      static_cast<float*>(b.data)[1] += 1.0f;
      EXPECT_STRATA_FAILS(strata_release(h.rt, g), STRATA_ERR_STATE, "were written while acquired");
      EXPECT_STRATA_OK(strata_release(h.rt, g)) << kind;
      EXPECT_STRATA_FAILS(strata_release(h.rt, g), STRATA_ERR_STATE, "is not acquired");
    }
  }
}

TEST(CApiContracts, WithoutChecksumsAWriteIsNotLookedFor) {
  // The check costs a pass over the group per acquire and release: off by default.
  const auto gs = toy_groups(3);
  RuntimeHandle h(layout_json(3, false));
  register_toy(h.rt, gs);
  ASSERT_STRATA_OK(strata_begin_micro_step(h.rt));
  for (int32_t g = 0; g < 3; ++g) {
    strata_buffer b{};
    ASSERT_STRATA_OK(strata_acquire(h.rt, g, &b));
    static_cast<float*>(b.data)[0] += 1.0f;
    EXPECT_STRATA_OK(strata_release(h.rt, g));
  }
}
