#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "strata/core/error.hpp"
#include "strata/offload/aio_config.hpp"

using namespace strata;
using nlohmann::json;

namespace {

// The ConfigError message for j, or "" when it parses.
std::string error_of(const json& j) {
  try {
    parse_aio_config(j);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(AioConfig, DefaultsFromAnEmptyObject) {
  AioConfig c = parse_aio_config(json::object());
  EXPECT_EQ(c.block_size, 1u << 20);
  EXPECT_EQ(c.queue_depth, 32u);
  EXPECT_EQ(c.intra_op_parallelism, 1u);
  EXPECT_FALSE(c.single_submit);
  EXPECT_TRUE(c.overlap_events);
  EXPECT_FALSE(c.use_sqpoll);
  EXPECT_EQ(c.engine, IoEngineKind::Auto);
}

TEST(AioConfig, EveryKeyIsRead) {
  AioConfig c = parse_aio_config(json{{"block_size", 262144},
                                      {"queue_depth", 64},
                                      {"intra_op_parallelism", 3},
                                      {"single_submit", true},
                                      {"overlap_events", false},
                                      {"use_sqpoll", true},
                                      {"engine", "threadpool"}});
  EXPECT_EQ(c.block_size, 262144u);
  EXPECT_EQ(c.queue_depth, 64u);
  EXPECT_EQ(c.intra_op_parallelism, 3u);
  EXPECT_TRUE(c.single_submit);
  EXPECT_FALSE(c.overlap_events);
  EXPECT_TRUE(c.use_sqpoll);
  EXPECT_EQ(c.engine, IoEngineKind::ThreadPool);
  EXPECT_EQ(parse_aio_config(json{{"engine", "io_uring"}}).engine, IoEngineKind::Uring);
  EXPECT_EQ(parse_aio_config(json{{"engine", "auto"}}).engine, IoEngineKind::Auto);
}

TEST(AioConfig, ThreadCountIsTheOlderNameOfIntraOpParallelism) {
  EXPECT_EQ(parse_aio_config(json{{"thread_count", 4}}).intra_op_parallelism, 4u);
  EXPECT_EQ(parse_aio_config(json{{"thread_count", 2}, {"intra_op_parallelism", 2}}).intra_op_parallelism, 2u);
  std::string m = error_of(json{{"thread_count", 2}, {"intra_op_parallelism", 3}});
  EXPECT_NE(m.find("thread_count"), std::string::npos) << m;
  EXPECT_NE(m.find("intra_op_parallelism"), std::string::npos) << m;
}

TEST(AioConfig, UnknownKeyNamesTheNearestValidOne) {
  std::string m = error_of(json{{"queue_dept", 8}});
  EXPECT_NE(m.find("aio.queue_dept"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean 'queue_depth'"), std::string::npos) << m;
  m = error_of(json{{"blocksize", 4096}});
  EXPECT_NE(m.find("'block_size'"), std::string::npos) << m;
}

TEST(AioConfig, BadBlockSizesNameKeyValueAndRange) {
  for (json v : {json(1000), json(2048), json(6144), json(0), json(-4096), json(1ull << 31), json(65536.5),
                 json(6.5536e4 + 1), json("1M"), json(true)}) {
    std::string m = error_of(json{{"block_size", v}});
    ASSERT_FALSE(m.empty()) << "accepted block_size " << v.dump();
    EXPECT_NE(m.find("aio.block_size"), std::string::npos) << m;
    EXPECT_NE(m.find(v.dump()), std::string::npos) << m;
    EXPECT_NE(m.find("power of two from 4096"), std::string::npos) << m;
  }
  EXPECT_EQ(parse_aio_config(json{{"block_size", 4096}}).block_size, 4096u);
  EXPECT_EQ(parse_aio_config(json{{"block_size", 1 << 30}}).block_size, 1u << 30);
  // Whole numbers in float notation, as the rest of the configuration reads them.
  EXPECT_EQ(parse_aio_config(json{{"block_size", 65536.0}}).block_size, 65536u);
  EXPECT_EQ(parse_aio_config(json::parse(R"({"block_size": 1.048576e6})")).block_size, 1u << 20);
}

TEST(AioConfig, BadQueueDepthsNameKeyValueAndRange) {
  for (json v : {json(0), json(4097), json(-1), json("32"), json(1.5), json(false), json::array({32})}) {
    std::string m = error_of(json{{"queue_depth", v}});
    ASSERT_FALSE(m.empty()) << "accepted queue_depth " << v.dump();
    EXPECT_NE(m.find("aio.queue_depth"), std::string::npos) << m;
    EXPECT_NE(m.find("from 1 to 4096"), std::string::npos) << m;
  }
  EXPECT_EQ(parse_aio_config(json{{"queue_depth", 4096}}).queue_depth, 4096u);
  EXPECT_EQ(parse_aio_config(json{{"queue_depth", 1}}).queue_depth, 1u);
}

TEST(AioConfig, WrongTypesAndChoicesAreErrors) {
  EXPECT_NE(error_of(json{{"single_submit", 1}}).find("true or false"), std::string::npos);
  EXPECT_NE(error_of(json{{"overlap_events", "yes"}}).find("aio.overlap_events"), std::string::npos);
  EXPECT_NE(error_of(json{{"use_sqpoll", json(nullptr)}}).find("aio.use_sqpoll"), std::string::npos);
  std::string m = error_of(json{{"engine", "libaio"}});
  EXPECT_NE(m.find("\"libaio\""), std::string::npos) << m;
  EXPECT_NE(m.find("\"threadpool\""), std::string::npos) << m;
  EXPECT_NE(error_of(json{{"intra_op_parallelism", 0}}).find("from 1 to 64"), std::string::npos);
  EXPECT_FALSE(error_of(json::array()).empty());
  EXPECT_FALSE(error_of(json(5)).empty());
}
