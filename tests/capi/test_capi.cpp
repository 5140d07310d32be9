// The C API (include/strata/strata.h) on one process: every call, its misuse (each a
// status and a message, never a crash), and training through it against a reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>

#include "capi_harness.hpp"

using namespace capi_test;

namespace {

strata_group_desc desc_f32(const char* name, const std::vector<int64_t>& shape, strata_init_kind init) {
  return group_desc(name, shape, STRATA_F32, init, 0.02f);
}

// A runtime with the toy groups registered and one micro-batch open.
struct OpenStep {
  RuntimeHandle h;
  std::vector<ToyGroup> gs = toy_groups(3);
  explicit OpenStep(const ConfigSpec& c = {}) : h(config_json(c)) {
    register_toy(h.rt, gs);
    EXPECT_STRATA_OK(strata_begin_micro_step(h.rt));
  }
  void submit_all() {
    for (size_t g = 0; g < gs.size(); ++g) {
      std::vector<float> grad(gs[g].numel(), 0.01f);
      EXPECT_STRATA_OK(strata_grad_submit(h.rt, static_cast<int32_t>(g), grad.data(), STRATA_F32, grad.size()));
    }
  }
};

}  // namespace

TEST(CApi, VersionAndNames) {
  EXPECT_EQ(strata_api_version(), static_cast<uint32_t>(STRATA_API_VERSION));
  EXPECT_EQ(strata_api_version() >> 16, 1u);
  EXPECT_NE(std::string(strata_version_string()).find("api 1.2"), std::string::npos) << strata_version_string();
  EXPECT_STREQ(strata_status_name(STRATA_OK), "STRATA_OK");
  EXPECT_STREQ(strata_status_name(STRATA_ERR_DTYPE), "STRATA_ERR_DTYPE");
  EXPECT_STREQ(strata_status_name(static_cast<strata_status>(999)), "STRATA_ERR_(unknown status)");
}

TEST(CApi, CreateChecksTheApiVersion) {
  strata_runtime rt{77};
  const std::string json = config_json({});
  EXPECT_STRATA_FAILS(strata_runtime_create(STRATA_API_VERSION + (1u << 16), json.c_str(), &rt), STRATA_ERR_VERSION,
                      "rebuild against");
  EXPECT_EQ(rt.id, 0u) << "a failed create must leave the handle invalid";
  EXPECT_STRATA_FAILS(strata_runtime_create(STRATA_API_VERSION + 1, json.c_str(), &rt), STRATA_ERR_VERSION,
                      "implements 1.2");
  // An older minor of the same major is accepted.
  ASSERT_STRATA_OK(strata_runtime_create(STRATA_API_VERSION_MAJOR << 16, json.c_str(), &rt));
  EXPECT_STRATA_OK(strata_runtime_destroy(rt));
}

TEST(CApi, CreateRejectsBadConfigurations) {
  strata_runtime rt{};
  EXPECT_STRATA_FAILS(strata_runtime_create(STRATA_API_VERSION, "{\"strata\": ", &rt), STRATA_ERR_CONFIG,
                      "not valid JSON");
  EXPECT_STRATA_FAILS(strata_runtime_create(STRATA_API_VERSION, "{\"zero_optimisation\": {}}", &rt),
                      STRATA_ERR_CONFIG, "did you mean 'zero_optimization'");
  EXPECT_STRATA_FAILS(strata_runtime_create(STRATA_API_VERSION, "{\"strata\": {\"backend\": \"sim\"}}", &rt),
                      STRATA_ERR_CONFIG, "use \"cpu\" or \"cuda\"");
  EXPECT_STRATA_FAILS(strata_runtime_create(STRATA_API_VERSION, nullptr, &rt), STRATA_ERR_INVALID_ARGUMENT,
                      "config_json is null");
  EXPECT_STRATA_FAILS(strata_runtime_create(STRATA_API_VERSION, "{}", nullptr), STRATA_ERR_INVALID_ARGUMENT,
                      "out is null");
  EXPECT_STRATA_FAILS(strata_runtime_create_from_file(STRATA_API_VERSION, "/nonexistent/strata.json", &rt),
                      STRATA_ERR_CONFIG, "/nonexistent/strata.json");
  // A budget that cannot hold the model fails at start, with the numbers.
  RuntimeHandle h("{\"strata\": {\"backend\": \"cpu\", \"device_budget\": \"64KiB\"}}");
  std::vector<int64_t> shape{1 << 20};
  strata_group_desc d = desc_f32("big", shape, STRATA_INIT_ZEROS);
  int32_t id;
  ASSERT_STRATA_OK(strata_register_group(h.rt, &d, &id));
  EXPECT_STRATA_FAILS(strata_start(h.rt), STRATA_ERR_OUT_OF_MEMORY, "Raise strata.device_budget");
}

TEST(CApi, CreateFromFile) {
  TempDir dir("file");
  const std::string path = (dir.path / "run.json").string();
  std::ofstream(path) << config_json({});
  strata_runtime rt{};
  ASSERT_STRATA_OK(strata_runtime_create_from_file(STRATA_API_VERSION, path.c_str(), &rt));
  strata_runtime_info info{};
  info.struct_size = sizeof info;
  ASSERT_STRATA_OK(strata_runtime_get_info(rt, &info));
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.device_type, STRATA_DEVICE_CPU);
  EXPECT_EQ(info.zero_stage, 3);
  EXPECT_EQ(info.started, 0);
  EXPECT_STRATA_OK(strata_runtime_destroy(rt));
}

TEST(CApi, RegisterGroupValidatesItsDescription) {
  RuntimeHandle h(config_json({}));
  int32_t id = -1;
  std::vector<int64_t> shape{4, 5};
  strata_group_desc d = desc_f32("w", shape, STRATA_INIT_NORMAL);
  ASSERT_STRATA_OK(strata_register_group(h.rt, &d, &id));
  EXPECT_EQ(id, 0);
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, &d, &id), STRATA_ERR_INVALID_ARGUMENT, "registered already");
  strata_group_desc e = desc_f32("", shape, STRATA_INIT_ZEROS);
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, &e, &id), STRATA_ERR_INVALID_ARGUMENT, "null or empty");
  e = desc_f32("x", shape, STRATA_INIT_ZEROS);
  e.ndim = 0;
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, &e, &id), STRATA_ERR_INVALID_ARGUMENT, "ndim is 0");
  e.ndim = STRATA_MAX_DIMS + 1;
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, &e, &id), STRATA_ERR_INVALID_ARGUMENT, "ndim is 9");
  std::vector<int64_t> bad{3, 0};
  e = desc_f32("x", bad, STRATA_INIT_ZEROS);
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, &e, &id), STRATA_ERR_INVALID_ARGUMENT, "dimension 1 is 0");
  e = desc_f32("x", shape, STRATA_INIT_ZEROS);
  e.dtype = STRATA_BF16;
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, &e, &id), STRATA_ERR_DTYPE, "does not match the runtime's F32");
  e.dtype = static_cast<strata_dtype>(42);
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, &e, &id), STRATA_ERR_INVALID_ARGUMENT, "not a strata_dtype");
  e = desc_f32("x", shape, static_cast<strata_init_kind>(9));
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, &e, &id), STRATA_ERR_INVALID_ARGUMENT, "not a strata_init_kind");
  e = desc_f32("x", shape, STRATA_INIT_DATA);
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, &e, &id), STRATA_ERR_INVALID_ARGUMENT, "data is null");
  float one = 1;
  e = desc_f32("x", shape, STRATA_INIT_ZEROS);
  e.data = &one;
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, &e, &id), STRATA_ERR_INVALID_ARGUMENT, "not STRATA_INIT_DATA");
  e = desc_f32("x", shape, STRATA_INIT_ZEROS);
  e.struct_size = 8;
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, &e, &id), STRATA_ERR_VERSION, "sizeof(strata_group_desc)");
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, nullptr, &id), STRATA_ERR_INVALID_ARGUMENT, "desc is null");
  // None of the refused ones was added.
  strata_runtime_info info{};
  info.struct_size = sizeof info;
  ASSERT_STRATA_OK(strata_runtime_get_info(h.rt, &info));
  EXPECT_EQ(info.num_groups, 1);
}

TEST(CApi, RegisteringAfterTheEngineStartedIsRefused) {
  RuntimeHandle h(config_json({}));
  std::vector<int64_t> shape{64};
  strata_group_desc d = desc_f32("a", shape, STRATA_INIT_ZEROS);
  int32_t id;
  EXPECT_STRATA_FAILS(strata_start(h.rt), STRATA_ERR_STATE, "call strata_register_group first");
  ASSERT_STRATA_OK(strata_register_group(h.rt, &d, &id));
  ASSERT_STRATA_OK(strata_start(h.rt));
  ASSERT_STRATA_OK(strata_start(h.rt));  // again: nothing happens
  d.name = "b";
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, &d, &id), STRATA_ERR_STATE, "register every group before");
}

TEST(CApi, FindGroupAndShape) {
  RuntimeHandle h(config_json({}));
  auto gs = toy_groups(3);
  register_toy(h.rt, gs);
  int32_t id = -1;
  ASSERT_STRATA_OK(strata_find_group(h.rt, "block.2", &id));
  EXPECT_EQ(id, 2);
  EXPECT_STRATA_FAILS(strata_find_group(h.rt, "block.9", &id), STRATA_ERR_UNKNOWN_GROUP, "'block.9'");
  int32_t ndim = 0;
  int64_t shape[STRATA_MAX_DIMS] = {};
  uint64_t numel = 0;
  ASSERT_STRATA_OK(strata_group_shape(h.rt, 1, &ndim, shape, &numel));
  EXPECT_EQ(ndim, 2);
  EXPECT_EQ(shape[0], gs[1].shape[0]);
  EXPECT_EQ(shape[1], gs[1].shape[1]);
  EXPECT_EQ(numel, gs[1].numel());
  EXPECT_STRATA_FAILS(strata_group_shape(h.rt, 3, &ndim, shape, &numel), STRATA_ERR_UNKNOWN_GROUP, "no parameter group 3");
}

TEST(CApi, AcquireHandsOutTheInitialValues) {
  for (std::string off : {"none", "nvme"}) {
    TempDir dir("init");
    RuntimeHandle h(config_json({.offload = off, .nvme_dir = dir.path.string()}));
    std::vector<int64_t> shape{3000};
    std::vector<float> data(3000);
    for (size_t i = 0; i < data.size(); ++i) data[i] = 0.001f * static_cast<float>(i) - 1.0f;
    strata_group_desc d = desc_f32("data", shape, STRATA_INIT_DATA);
    d.data = data.data();
    strata_group_desc ones = desc_f32("ones", shape, STRATA_INIT_ONES);
    strata_group_desc c = desc_f32("constant", shape, STRATA_INIT_CONSTANT);
    c.init_value = 0.25f;
    strata_group_desc n = desc_f32("normal", shape, STRATA_INIT_NORMAL);
    n.init_std = 0.5f;
    int32_t id;
    for (auto* x : {&d, &ones, &c, &n}) ASSERT_STRATA_OK(strata_register_group(h.rt, x, &id));
    data.assign(data.size(), 7.0f);  // the runtime copied the data at registration
    ASSERT_STRATA_OK(strata_begin_micro_step(h.rt));
    strata_buffer b{};
    ASSERT_STRATA_OK(strata_acquire(h.rt, 0, &b));
    EXPECT_EQ(b.device_type, STRATA_DEVICE_CPU);
    EXPECT_EQ(b.dtype, STRATA_F32);
    EXPECT_EQ(b.numel, 3000u);
    EXPECT_EQ(b.ndim, 1);
    EXPECT_EQ(b.shape[0], 3000);
    EXPECT_EQ(b.ready_event, nullptr);
    const float* p = static_cast<const float*>(b.data);
    for (int i = 0; i < 3000; ++i) ASSERT_EQ(p[i], 0.001f * static_cast<float>(i) - 1.0f) << off << " element " << i;
    ASSERT_STRATA_OK(strata_release(h.rt, 0));
    ASSERT_STRATA_OK(strata_acquire(h.rt, 1, &b));
    for (int i = 0; i < 3000; ++i) ASSERT_EQ(static_cast<const float*>(b.data)[i], 1.0f);
    ASSERT_STRATA_OK(strata_release(h.rt, 1));
    ASSERT_STRATA_OK(strata_acquire(h.rt, 2, &b));
    for (int i = 0; i < 3000; ++i) ASSERT_EQ(static_cast<const float*>(b.data)[i], 0.25f);
    ASSERT_STRATA_OK(strata_release(h.rt, 2));
    ASSERT_STRATA_OK(strata_acquire(h.rt, 3, &b));
    double sum = 0, sq = 0;
    for (int i = 0; i < 3000; ++i) {
      const double v = static_cast<const float*>(b.data)[i];
      sum += v;
      sq += v * v;
    }
    const double mean = sum / 3000, sd = std::sqrt(sq / 3000 - mean * mean);
    EXPECT_NEAR(mean, 0.0, 0.05);
    EXPECT_NEAR(sd, 0.5, 0.05);
    ASSERT_STRATA_OK(strata_release(h.rt, 3));
  }
}

TEST(CApi, MisuseInsideAStepGivesAStatusAndAMessage) {
  OpenStep o;
  strata_runtime rt = o.h.rt;
  strata_buffer b{};
  EXPECT_STRATA_FAILS(strata_release(rt, 0), STRATA_ERR_STATE, "is not acquired");
  ASSERT_STRATA_OK(strata_acquire(rt, 0, &b));
  ASSERT_STRATA_OK(strata_acquire(rt, 0, &b));  // held twice: two releases
  ASSERT_STRATA_OK(strata_release(rt, 0));
  ASSERT_STRATA_OK(strata_release(rt, 0));
  EXPECT_STRATA_FAILS(strata_release(rt, 0), STRATA_ERR_STATE, "released twice");
  EXPECT_STRATA_FAILS(strata_acquire(rt, 3, &b), STRATA_ERR_UNKNOWN_GROUP, "no parameter group 3");
  EXPECT_STRATA_FAILS(strata_acquire(rt, -1, &b), STRATA_ERR_UNKNOWN_GROUP, "no parameter group -1");
  EXPECT_STRATA_FAILS(strata_acquire(rt, 0, nullptr), STRATA_ERR_INVALID_ARGUMENT, "out is null");
  EXPECT_STRATA_FAILS(strata_release(rt, 17), STRATA_ERR_UNKNOWN_GROUP, "no parameter group 17");
  std::vector<float> grad(o.gs[0].numel(), 0.5f);
  EXPECT_STRATA_FAILS(strata_grad_submit(rt, 0, grad.data(), STRATA_F16, grad.size()), STRATA_ERR_DTYPE,
                      "is F32 (the configuration enables neither bf16 nor fp16) but the buffer is F16");
  EXPECT_STRATA_FAILS(strata_grad_submit(rt, 0, grad.data(), STRATA_F32, grad.size() - 1), STRATA_ERR_INVALID_ARGUMENT,
                      "elements, the buffer");
  EXPECT_STRATA_FAILS(strata_grad_submit(rt, 0, nullptr, STRATA_F32, grad.size()), STRATA_ERR_INVALID_ARGUMENT,
                      "data is null");
  EXPECT_STRATA_FAILS(strata_grad_submit(rt, 5, grad.data(), STRATA_F32, grad.size()), STRATA_ERR_UNKNOWN_GROUP,
                      "no parameter group 5");
  EXPECT_STRATA_FAILS(strata_grad_ready(rt, 0), STRATA_ERR_STATE, "no gradient buffer out");
  ASSERT_STRATA_OK(strata_grad_submit(rt, 0, grad.data(), STRATA_F32, grad.size()));
  EXPECT_STRATA_FAILS(strata_grad_submit(rt, 0, grad.data(), STRATA_F32, grad.size()), STRATA_ERR_STATE,
                      "one gradient per group per micro-batch");
  ASSERT_STRATA_OK(strata_grad_buffer(rt, 1, &b));
  EXPECT_STRATA_FAILS(strata_grad_buffer(rt, 1, &b), STRATA_ERR_STATE, "already has a gradient buffer out");
  EXPECT_STRATA_FAILS(strata_step(rt, nullptr), STRATA_ERR_STATE, "call strata_grad_ready for it first");
  std::fill_n(static_cast<float*>(b.data), b.numel, 0.5f);
  ASSERT_STRATA_OK(strata_grad_ready(rt, 1));
  EXPECT_STRATA_FAILS(strata_step(rt, nullptr), STRATA_ERR_STATE, "'block.2' has no gradient for micro-batch 0");
  EXPECT_STRATA_FAILS(strata_begin_micro_step(rt), STRATA_ERR_STATE, "'block.2' has no gradient");
  ASSERT_STRATA_OK(strata_acquire(rt, 2, &b));
  std::vector<float> g2(o.gs[2].numel(), 0.5f);
  ASSERT_STRATA_OK(strata_grad_submit(rt, 2, g2.data(), STRATA_F32, g2.size()));
  EXPECT_STRATA_FAILS(strata_step(rt, nullptr), STRATA_ERR_STATE, "'block.2' is acquired (1 time(s))");
  EXPECT_STRATA_FAILS(strata_save_checkpoint(rt, "/tmp", nullptr, nullptr, 0), STRATA_ERR_STATE,
                      "a step is in progress");
  ASSERT_STRATA_OK(strata_release(rt, 2));
  // accumulation is 1: a second micro-batch is refused until the step.
  EXPECT_STRATA_FAILS(strata_begin_micro_step(rt), STRATA_ERR_STATE, "call strata_step");
  int32_t stepped = -1;
  ASSERT_STRATA_OK(strata_step(rt, &stepped));
  EXPECT_EQ(stepped, 1);
  EXPECT_STRATA_FAILS(strata_step(rt, &stepped), STRATA_ERR_STATE, "without a micro-batch");
  EXPECT_STRATA_FAILS(strata_acquire(rt, 0, &b), STRATA_ERR_STATE, "outside a micro-batch");
  EXPECT_STRATA_FAILS(strata_grad_submit(rt, 0, grad.data(), STRATA_F32, grad.size()), STRATA_ERR_STATE,
                      "outside a micro-batch");
}

TEST(CApi, AccumulationCountsMicroBatches) {
  OpenStep o({.accum = 2});
  o.submit_all();
  EXPECT_STRATA_FAILS(strata_step(o.h.rt, nullptr), STRATA_ERR_STATE, "after 1 micro-batch(es); gradient_accumulation_steps is 2");
  ASSERT_STRATA_OK(strata_begin_micro_step(o.h.rt));
  o.submit_all();
  ASSERT_STRATA_OK(strata_step(o.h.rt, nullptr));
}

TEST(CApi, EveryCallOnADestroyedRuntimeIsRefused) {
  strata_runtime rt{};
  const std::string json = config_json({});
  ASSERT_STRATA_OK(strata_runtime_create(STRATA_API_VERSION, json.c_str(), &rt));
  auto gs = toy_groups(2);
  register_toy(rt, gs);
  ASSERT_STRATA_OK(strata_begin_micro_step(rt));
  strata_buffer b{};
  ASSERT_STRATA_OK(strata_acquire(rt, 0, &b));
  ASSERT_STRATA_OK(strata_runtime_destroy(rt));  // with a group still acquired
  EXPECT_STRATA_FAILS(strata_runtime_destroy(rt), STRATA_ERR_INVALID_HANDLE, "destroyed already");
  EXPECT_STRATA_FAILS(strata_acquire(rt, 0, &b), STRATA_ERR_INVALID_HANDLE, "was destroyed");
  EXPECT_STRATA_FAILS(strata_release(rt, 0), STRATA_ERR_INVALID_HANDLE, "was destroyed");
  std::vector<float> grad(gs[0].numel());
  EXPECT_STRATA_FAILS(strata_grad_submit(rt, 0, grad.data(), STRATA_F32, grad.size()), STRATA_ERR_INVALID_HANDLE, "destroyed");
  EXPECT_STRATA_FAILS(strata_grad_buffer(rt, 0, &b), STRATA_ERR_INVALID_HANDLE, "destroyed");
  EXPECT_STRATA_FAILS(strata_grad_ready(rt, 0), STRATA_ERR_INVALID_HANDLE, "destroyed");
  EXPECT_STRATA_FAILS(strata_step(rt, nullptr), STRATA_ERR_INVALID_HANDLE, "destroyed");
  EXPECT_STRATA_FAILS(strata_begin_micro_step(rt), STRATA_ERR_INVALID_HANDLE, "destroyed");
  EXPECT_STRATA_FAILS(strata_start(rt), STRATA_ERR_INVALID_HANDLE, "destroyed");
  int32_t order[1] = {0};
  EXPECT_STRATA_FAILS(strata_set_schedule(rt, order, 1), STRATA_ERR_INVALID_HANDLE, "destroyed");
  EXPECT_STRATA_FAILS(strata_read_params(rt, 0, grad.data(), STRATA_F32, grad.size()), STRATA_ERR_INVALID_HANDLE, "destroyed");
  strata_stats s{};
  s.struct_size = sizeof s;
  EXPECT_STRATA_FAILS(strata_get_stats(rt, &s), STRATA_ERR_INVALID_HANDLE, "destroyed");
  strata_runtime_info info{};
  info.struct_size = sizeof info;
  EXPECT_STRATA_FAILS(strata_runtime_get_info(rt, &info), STRATA_ERR_INVALID_HANDLE, "destroyed");
  int32_t id;
  EXPECT_STRATA_FAILS(strata_find_group(rt, "block.0", &id), STRATA_ERR_INVALID_HANDLE, "destroyed");
  strata_group_desc d = desc_f32("late", {4}, STRATA_INIT_ZEROS);
  std::vector<int64_t> shape{4};
  d.shape = shape.data();
  EXPECT_STRATA_FAILS(strata_register_group(rt, &d, &id), STRATA_ERR_INVALID_HANDLE, "destroyed");
  EXPECT_STRATA_FAILS(strata_save_checkpoint(rt, "/tmp", nullptr, nullptr, 0), STRATA_ERR_INVALID_HANDLE, "destroyed");
  EXPECT_STRATA_FAILS(strata_load_checkpoint(rt, "/tmp", nullptr, 0), STRATA_ERR_INVALID_HANDLE, "destroyed");
  EXPECT_STRATA_FAILS(strata_acquire(strata_runtime{0}, 0, &b), STRATA_ERR_INVALID_HANDLE, "handle is 0");
  EXPECT_STRATA_FAILS(strata_acquire(strata_runtime{rt.id + 1000}, 0, &b), STRATA_ERR_INVALID_HANDLE, "never created");
  // A new runtime never gets the old id.
  strata_runtime rt2{};
  ASSERT_STRATA_OK(strata_runtime_create(STRATA_API_VERSION, json.c_str(), &rt2));
  EXPECT_NE(rt2.id, rt.id);
  EXPECT_STRATA_OK(strata_runtime_destroy(rt2));
}

// Training through the C API follows a reference AdamW, for each stage and offload.
TEST(CApi, TrainingMatchesAReferenceAdamW) {
  struct Case {
    int stage;
    std::string offload;
    int accum;
  };
  for (const Case& c : {Case{3, "nvme", 1}, Case{3, "cpu", 2}, Case{3, "none", 1}, Case{2, "nvme", 2}, Case{1, "none", 1}}) {
    SCOPED_TRACE("stage " + std::to_string(c.stage) + ", offload " + c.offload + ", accum " + std::to_string(c.accum));
    TempDir dir("train");
    const strata_stats st = train_toy_against_reference(
        config_json({.stage = c.stage, .accum = c.accum, .offload = c.offload, .nvme_dir = dir.path.string()}),
        c.accum, [](strata_runtime rt, const std::vector<ToyGroup>& gs, const std::vector<int>& order, int step,
                    int micro) { return toy_micro_step(rt, gs, order, step, micro, 0); });
    EXPECT_EQ(st.trace_departures, 0u);
  }
}

// The `scheduler` section applies through the C API as through strata train. With
// WarmupCosineLR and warmup_min_ratio 0, DeepSpeed's first two steps run at lr 0.
TEST(CApi, TheSchedulerSetsEachStepsLearningRate) {
  auto run = [](bool scheduled) {
    std::string cfg = config_json({});
    if (scheduled)
      cfg.insert(cfg.size() - 1, ", \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": "
                                 "{\"total_num_steps\": 10, \"warmup_num_steps\": 4}}");
    RuntimeHandle h(cfg);
    auto gs = toy_groups(2);
    register_toy(h.rt, gs);
    std::vector<std::vector<std::vector<float>>> after;  // the parameters after each step
    after.push_back(read_all(h.rt, gs));
    for (int s = 0; s < 3; ++s) {
      toy_micro_step(h.rt, gs, forward_backward(2), s, 0, 0);
      int32_t stepped = 0;
      EXPECT_STRATA_OK(strata_step(h.rt, &stepped));
      after.push_back(read_all(h.rt, gs));
    }
    return after;
  };
  const auto constant = run(false), cosine = run(true);
  EXPECT_NE(constant[1], constant[0]);  // without a scheduler the first step moves the weights
  EXPECT_EQ(cosine[1], cosine[0]);      // step 1: lr 0 (the value at construction)
  EXPECT_EQ(cosine[2], cosine[0]);      // step 2: lr 0 * warmup_min_ratio
  EXPECT_NE(cosine[3], cosine[2]);      // step 3: lr 0.01 * log(2) / log(4)
}

TEST(CApi, GradBufferIsTheSameAsSubmit) {
  auto gs = toy_groups(2);
  std::vector<std::vector<float>> result[2];
  for (int zero_copy = 0; zero_copy < 2; ++zero_copy) {
    RuntimeHandle h(config_json({}));
    register_toy(h.rt, gs);
    for (int s = 0; s < 3; ++s) {
      ASSERT_STRATA_OK(strata_begin_micro_step(h.rt));
      for (int g = 0; g < 2; ++g) {
        std::vector<float> grad(gs[g].numel());
        for (size_t i = 0; i < grad.size(); ++i) grad[i] = std::sin(0.1f * i + s + g);
        if (zero_copy) {
          strata_buffer b{};
          ASSERT_STRATA_OK(strata_grad_buffer(h.rt, g, &b));
          ASSERT_EQ(b.numel, grad.size());
          std::memcpy(b.data, grad.data(), grad.size() * sizeof(float));
          ASSERT_STRATA_OK(strata_grad_ready(h.rt, g));
        } else {
          ASSERT_STRATA_OK(strata_grad_submit(h.rt, g, grad.data(), STRATA_F32, grad.size()));
        }
      }
      ASSERT_STRATA_OK(strata_step(h.rt, nullptr));
    }
    result[zero_copy] = read_all(h.rt, gs);
  }
  EXPECT_EQ(result[0], result[1]);
  EXPECT_NE(result[0][0][0], initial_value(0, 0)) << "the parameters never changed";
}

TEST(CApi, ReadParamsChecksItsArguments) {
  RuntimeHandle h(config_json({}));
  auto gs = toy_groups(1);
  register_toy(h.rt, gs);
  std::vector<float> out(gs[0].numel());
  EXPECT_STRATA_FAILS(strata_read_params(h.rt, 0, out.data(), STRATA_BF16, out.size()), STRATA_ERR_DTYPE, "but the buffer is BF16; pass F32");
  EXPECT_STRATA_FAILS(strata_read_params(h.rt, 0, out.data(), STRATA_F32, 3), STRATA_ERR_INVALID_ARGUMENT, "the buffer 3");
  EXPECT_STRATA_FAILS(strata_read_params(h.rt, 0, nullptr, STRATA_F32, out.size()), STRATA_ERR_INVALID_ARGUMENT, "dst is null");
  EXPECT_STRATA_FAILS(strata_read_params(h.rt, 1, out.data(), STRATA_F32, out.size()), STRATA_ERR_UNKNOWN_GROUP, "group 1");
  ASSERT_STRATA_OK(strata_read_params(h.rt, 0, out.data(), STRATA_F32, out.size()));
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], initial_value(0, i));
}

TEST(CApi, StatsReportTiersTrafficAndWaits) {
  TempDir dir("stats");
  RuntimeHandle h(config_json({.offload = "nvme", .nvme_dir = dir.path.string()}));
  auto gs = toy_groups(3);
  strata_stats before{};
  before.struct_size = sizeof before;
  ASSERT_STRATA_OK(strata_get_stats(h.rt, &before));  // before the engine runs: zeros
  EXPECT_EQ(before.optimizer_steps, 0);
  EXPECT_EQ(before.tiers[STRATA_TIER_DEVICE].budget, 0u);
  register_toy(h.rt, gs);
  for (int s = 0; s < 3; ++s) {
    toy_micro_step(h.rt, gs, forward_backward(3), s, 0, 0);
    ASSERT_STRATA_OK(strata_step(h.rt, nullptr));
  }
  strata_stats st{};
  st.struct_size = sizeof st;
  ASSERT_STRATA_OK(strata_get_stats(h.rt, &st));
  EXPECT_EQ(st.struct_size, sizeof st);
  EXPECT_EQ(st.optimizer_steps, 3);
  EXPECT_EQ(st.tiers[STRATA_TIER_DEVICE].budget, 16u << 20);
  EXPECT_EQ(st.tiers[STRATA_TIER_PINNED].budget, 16u << 20);
  EXPECT_GT(st.tiers[STRATA_TIER_NVME].used, 0u) << "nothing lives on NVMe";
  EXPECT_GT(st.tiers[STRATA_TIER_DEVICE].peak, 0u);
  EXPECT_LE(st.tiers[STRATA_TIER_DEVICE].peak, st.tiers[STRATA_TIER_DEVICE].budget);
  EXPECT_GT(st.bytes_moved[STRATA_TIER_NVME][STRATA_TIER_PINNED], 0u);
  EXPECT_GT(st.bytes_moved[STRATA_TIER_PINNED][STRATA_TIER_NVME], 0u);
  EXPECT_GT(st.elapsed_s, 0.0);
  EXPECT_NEAR(st.bandwidth[STRATA_TIER_NVME][STRATA_TIER_PINNED],
              st.bytes_moved[STRATA_TIER_NVME][STRATA_TIER_PINNED] / st.elapsed_s,
              1e-6 * st.bandwidth[STRATA_TIER_NVME][STRATA_TIER_PINNED] + 1);
  EXPECT_GT(st.moves, 0u);
  // Step 0 has no trace yet, so each group is dropped after use and gathered again for
  // its backward (6); later steps know the next use is near and keep it (3 each).
  EXPECT_EQ(st.gathers, 6u + 3u + 3u);
  EXPECT_GE(st.exposed_wait_s, 0.0);
  EXPECT_GT(st.optimizer_s, 0.0);
  EXPECT_GT(st.last_grad_norm, 0.0);
  // A caller built against a shorter struct gets only that much written.
  struct {
    strata_stats s;
    uint64_t sentinel;
  } old{};
  old.sentinel = 0xabcdef;
  old.s.struct_size = offsetof(strata_stats, bytes_moved);
  ASSERT_STRATA_OK(strata_get_stats(h.rt, &old.s));
  EXPECT_EQ(old.s.tiers[STRATA_TIER_NVME].used, st.tiers[STRATA_TIER_NVME].used);
  EXPECT_EQ(old.s.bytes_moved[STRATA_TIER_NVME][STRATA_TIER_PINNED], 0u);
  EXPECT_EQ(old.s.optimizer_steps, 0);
  EXPECT_EQ(old.sentinel, 0xabcdefu);
  strata_stats unset{};
  EXPECT_STRATA_FAILS(strata_get_stats(h.rt, &unset), STRATA_ERR_VERSION, "set it to sizeof(strata_stats)");
}

TEST(CApi, GivenScheduleIsFollowed) {
  // Parameters in pinned memory: on one rank with them on the device each group is read in
  // place, and nothing is gathered, ahead or not.
  RuntimeHandle h(config_json({.offload = "cpu"}));
  auto gs = toy_groups(3);
  register_toy(h.rt, gs);
  std::vector<int> order = forward_backward(3);
  std::vector<int32_t> order32(order.begin(), order.end());
  EXPECT_STRATA_FAILS(strata_set_schedule(h.rt, nullptr, 2), STRATA_ERR_INVALID_ARGUMENT, "order is null");
  int32_t bad[2] = {0, 7};
  EXPECT_STRATA_FAILS(strata_set_schedule(h.rt, bad, 2), STRATA_ERR_UNKNOWN_GROUP, "group 7");
  ASSERT_STRATA_OK(strata_set_schedule(h.rt, order32.data(), order32.size()));
  for (int s = 0; s < 3; ++s) {
    toy_micro_step(h.rt, gs, order, s, 0, 0);
    ASSERT_STRATA_OK(strata_step(h.rt, nullptr));
  }
  strata_stats st{};
  st.struct_size = sizeof st;
  ASSERT_STRATA_OK(strata_get_stats(h.rt, &st));
  EXPECT_EQ(st.trace_departures, 0u);
  EXPECT_GT(st.prefetched, 0u) << "a known schedule should let the engine gather ahead";
}

TEST(CApi, LastErrorIsPerThreadAndClearedBySuccess) {
  RuntimeHandle h(config_json({}));
  strata_buffer b{};
  EXPECT_NE(strata_acquire(h.rt, 0, &b), STRATA_OK);
  const std::string mine = strata_last_error();
  EXPECT_NE(mine.find("strata_acquire"), std::string::npos) << mine;
  std::string theirs;
  std::thread t([&] {
    theirs = strata_last_error();  // nothing failed on this thread
    strata_find_group(h.rt, "nope", nullptr);
  });
  t.join();
  EXPECT_EQ(theirs, "");
  EXPECT_EQ(std::string(strata_last_error()), mine) << "another thread's failure changed this thread's message";
  strata_runtime_info info{};
  info.struct_size = sizeof info;
  ASSERT_STRATA_OK(strata_runtime_get_info(h.rt, &info));
  EXPECT_STREQ(strata_last_error(), "");
}

TEST(CApi, AStepWithANonFiniteGradientIsSkipped) {
  RuntimeHandle h(config_json({}));
  auto gs = toy_groups(2);
  register_toy(h.rt, gs);
  const auto before = read_all(h.rt, gs);
  ASSERT_STRATA_OK(strata_begin_micro_step(h.rt));
  for (int g = 0; g < 2; ++g) {
    std::vector<float> grad(gs[g].numel(), 0.1f);
    if (g == 1) grad[7] = NAN;
    ASSERT_STRATA_OK(strata_grad_submit(h.rt, g, grad.data(), STRATA_F32, grad.size()));
  }
  int32_t stepped = -1;
  ASSERT_STRATA_OK(strata_step(h.rt, &stepped));
  EXPECT_EQ(stepped, 0);
  EXPECT_EQ(read_all(h.rt, gs), before) << "a skipped step changed the parameters";
  // The next step works normally.
  toy_micro_step(h.rt, gs, forward_backward(2), 0, 0, 0);
  ASSERT_STRATA_OK(strata_step(h.rt, &stepped));
  EXPECT_EQ(stepped, 1);
  EXPECT_NE(read_all(h.rt, gs), before);
}

TEST(CApi, CudaWithoutAGpuIsUnavailable) {
  strata_runtime rt{};
  const strata_status s =
      strata_runtime_create(STRATA_API_VERSION, "{\"strata\": {\"backend\": \"cuda\"}}", &rt);
  if (s == STRATA_OK) {
    strata_runtime_destroy(rt);
    GTEST_SKIP() << "a GPU is present; the cuda path of the C API is not tested here";
  }
  EXPECT_EQ(s, STRATA_ERR_UNAVAILABLE) << strata_last_error();
  EXPECT_NE(std::string(strata_last_error()).find("strata_runtime_create: "), std::string::npos);
  EXPECT_EQ(rt.id, 0u);
}
