// Tests of the report helpers every `strata bench` sub-benchmark shares: sizes,
// statistics, the CSV and JSON forms, the machine summary, output-option checks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "strata/bench/report.hpp"
#include "strata/core/error.hpp"

using namespace strata;
using namespace strata::bench;
using nlohmann::json;

TEST(BenchReport, ParsesSizes) {
  // The benches' sizes are byte counts as every flag reads them (core/byte_count.hpp):
  // their single letters stay powers of 1024.
  EXPECT_EQ(parse_byte_count("4096", "--x"), 4096u);
  EXPECT_EQ(parse_byte_count("64K", "--x"), 64u << 10);
  EXPECT_EQ(parse_byte_count("3M", "--x"), 3u << 20);
  EXPECT_EQ(parse_byte_count("2G", "--x"), 2ull << 30);
  EXPECT_EQ(parse_byte_count("1T", "--x"), 1ull << 40);
  EXPECT_THROW(parse_byte_count("", "--x"), ConfigError);
  EXPECT_THROW(parse_byte_count("-1M", "--x"), ConfigError);
  EXPECT_THROW(parse_byte_count("M", "--x"), ConfigError);
  EXPECT_THROW(parse_byte_count("99999999999999999T", "--x"), ConfigError);
  try {
    parse_byte_count("1Q", "--sizes");
    FAIL() << "no error for 1Q";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--sizes = \"1Q\" has an unknown unit \"Q\""), std::string::npos) << e.what();
  }
  EXPECT_EQ(short_size(64u << 10), "64K");
  EXPECT_EQ(short_size(3ull << 30), "3G");
  EXPECT_EQ(short_size(1000), "1000");
}

// bench step --cuda-profile's labels: found where they are, in the order asked; an unknown
// one refused naming it and every label there is to give.
TEST(BenchReport, FindsLabelsAndNamesTheChoicesForOneThatIsNot) {
  const std::vector<std::string> names{"params and optimizer on GPU, bf16", "PyTorch on the GPU, autocast bf16"};
  EXPECT_EQ(find_labels(names, {"PyTorch on the GPU, autocast bf16", "params and optimizer on GPU, bf16"}, "--f"),
            (std::vector<size_t>{1, 0}));
  EXPECT_TRUE(find_labels(names, {}, "--f").empty());
  try {
    find_labels(names, {"PyTorch"}, "bench step: --cuda-profile");
    ADD_FAILURE() << "an unknown label was accepted";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "bench step: --cuda-profile 'PyTorch' is no configuration of this run; give one of 'params and "
                 "optimizer on GPU, bf16', 'PyTorch on the GPU, autocast bf16'");
  }
}

TEST(BenchReport, SummarizesRepetitions) {
  Summary odd = summarize({3, 1, 2});
  EXPECT_EQ(odd.median, 2);
  EXPECT_EQ(odd.min, 1);
  EXPECT_EQ(odd.max, 3);
  EXPECT_DOUBLE_EQ(odd.spread(), 1.0);
  Summary even = summarize({4, 1, 2, 3});
  EXPECT_DOUBLE_EQ(even.median, 2.5);
  EXPECT_EQ(summarize({}).median, 0);
  EXPECT_EQ(summarize({5}).spread(), 0);
}

Report sample_report() {
  Report r;
  r.benchmark = "copy";
  r.command = "strata bench copy --sizes 1M";
  r.title = "test";
  r.config = {{"reps", 2}};
  r.table.columns = {{"direction", "dir", ""}, {"size_bytes", "size", ""}, {"strata_gbps", "GB/s", "%.2f"}};
  r.table.rows = {{{"direction", "h2d"}, {"size_bytes", 1048576}, {"strata_gbps", 5.5}, {"json_only", 1}},
                  {{"direction", "a,\"b\""}, {"size_bytes", 4096}}};
  r.notes = {"a note"};
  r.extra = {{"points", json::array({1, 2})}};
  return r;
}

TEST(BenchReport, CsvHasHeaderAndOneLinePerRow) {
  const std::string csv = report_csv(sample_report());
  EXPECT_EQ(csv, "direction,size_bytes,strata_gbps\nh2d,1048576,5.5\n\"a,\"\"b\"\"\",4096,\n");
}

TEST(BenchReport, JsonCarriesMachineConfigRowsAndExtras) {
  const json machine = machine_json();
  const json doc = report_json(sample_report(), machine);
  EXPECT_EQ(doc.at("tool"), "strata bench copy");
  EXPECT_EQ(doc.at("benchmark"), "copy");
  EXPECT_EQ(doc.at("command"), "strata bench copy --sizes 1M");
  EXPECT_EQ(doc.at("config").at("reps"), 2);
  ASSERT_EQ(doc.at("rows").size(), 2u);
  EXPECT_EQ(doc.at("rows")[0].at("json_only"), 1);  // rows keep keys the table does not show
  EXPECT_EQ(doc.at("columns").size(), 3u);
  EXPECT_EQ(doc.at("points").size(), 2u);
  EXPECT_EQ(doc.at("notes")[0], "a note");
  EXPECT_EQ(doc.at("machine"), machine);
}

TEST(BenchReport, MachineSummaryHasTheHardware) {
  const json m = machine_json();
  EXPECT_GT(m.at("cores").get<int>(), 0);
  EXPECT_GE(m.at("threads").get<int>(), m.at("cores").get<int>());
  EXPECT_GT(m.at("memory_bytes").get<uint64_t>(), 0u);
  EXPECT_GE(m.at("numa_nodes").get<int>(), 1);
  EXPECT_FALSE(m.at("cpu_model").get<std::string>().empty());
  ASSERT_TRUE(m.at("disks").is_array());
  for (const auto& d : m.at("disks")) EXPECT_FALSE(d.at("name").get<std::string>().empty());
  ASSERT_TRUE(m.at("gpus").is_array());
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  print_machine(f, m);
  std::fclose(f);
  const std::string text(buf, len);
  std::free(buf);
  EXPECT_EQ(text.rfind("machine: ", 0), 0u) << text;
  EXPECT_NE(text.find("GPUs: "), std::string::npos) << text;
}

TEST(BenchReport, OutputOptionsAreCheckedBeforeMeasuring) {
  OutputOptions o;
  EXPECT_NO_THROW(check_output_options(o));
  o.json = "-";
  o.csv = "-";
  EXPECT_THROW(check_output_options(o), ConfigError);
  o = {};
  o.csv = "/nonexistent/strata/x.csv";
  EXPECT_THROW(check_output_options(o), ConfigError);
  o = {};
  o.json = "/tmp";  // a directory
  EXPECT_THROW(check_output_options(o), ConfigError);
  o = {};
  o.plot = "x.svg";
  EXPECT_THROW(check_output_options(o), ConfigError);
  o = {};
  o.plot = "/tmp/strata-test-plot.png";
  o.python = "/nonexistent/python3";
  EXPECT_THROW(check_output_options(o), ConfigError);
}
