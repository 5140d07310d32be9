#include <gtest/gtest.h>

#include "strata/core/config_keys.hpp"
#include "strata/core/error.hpp"

using namespace strata;

TEST(ConfigKeys, NearestKey) {
  std::vector<std::string> keys{"block_size", "queue_depth", "intra_op_parallelism"};
  EXPECT_EQ(nearest_key("queue_dept", keys), "queue_depth");
  EXPECT_EQ(nearest_key("blocksize", keys), "block_size");
  EXPECT_EQ(edit_distance("abc", "abc"), 0u);
  EXPECT_EQ(edit_distance("abc", "abd"), 1u);
}

TEST(ConfigKeys, UnknownKeyMessageNamesKeyAndFix) {
  try {
    throw_unknown_key("aio", "queue_dept", {"block_size", "queue_depth"});
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("aio.queue_dept"), std::string::npos) << m;
    EXPECT_NE(m.find("did you mean 'queue_depth'"), std::string::npos) << m;
  }
}
