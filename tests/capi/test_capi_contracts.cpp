// Contracts of the C API that hold for every kind of group and every input (issue #37):
// a write into acquired (read-only) parameters is found at release with strata.checksums,
// whatever the group's kind; a group's name is text a checkpoint can keep.
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

TEST(CApiContracts, AGroupNameMustBeTextACheckpointCanKeep) {
  RuntimeHandle h(config_json({}));
  std::vector<int64_t> shape{4};
  int32_t id = -1;
  struct Bad {
    std::string name, says;
  };
  const std::vector<Bad> bad = {
      {"\xff", "is not UTF-8 text: its byte 1"},
      {"block.\xc3", "is not UTF-8 text: its byte 7"},
      {"a\xed\xa0\x80", "is not UTF-8 text: its byte 2"},  // a surrogate
      {"tab\tname", "has a control character (0x09) at byte 4"},
      {"new\nline", "has a control character (0x0a) at byte 4"},
      {"del\x7f", "has a control character (0x7f) at byte 4"},
      {"\x1b[31mred", "has a control character (0x1b) at byte 1"},
  };
  for (const Bad& b : bad) {
    strata_group_desc d = group_desc(b.name.c_str(), shape, STRATA_F32, STRATA_INIT_ZEROS, 0.0f);
    EXPECT_STRATA_FAILS(strata_register_group(h.rt, &d, &id), STRATA_ERR_INVALID_ARGUMENT, b.says);
    EXPECT_STRATA_FAILS(strata_find_group(h.rt, b.name.c_str(), &id), STRATA_ERR_UNKNOWN_GROUP, "no parameter group");
  }
  strata_runtime_info info{};
  info.struct_size = sizeof info;
  ASSERT_STRATA_OK(strata_runtime_get_info(h.rt, &info));
  EXPECT_EQ(info.num_groups, 0) << "a refused name registered a group";
  // Text beyond ASCII is a name like any other.
  for (const char* good : {"блок.0", "层.1", "block 2 (tied)"}) {
    strata_group_desc d = group_desc(good, shape, STRATA_F32, STRATA_INIT_ZEROS, 0.0f);
    ASSERT_STRATA_OK(strata_register_group(h.rt, &d, &id));
    int32_t found = -1;
    ASSERT_STRATA_OK(strata_find_group(h.rt, good, &found));
    EXPECT_EQ(found, id);
  }
}
