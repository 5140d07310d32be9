#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "strata/core/config_keys.hpp"
#include "strata/core/error.hpp"
#include "strata/runtime/config/config.hpp"
#include "strata/runtime/engine/zero_engine.hpp"
#include "config_errors.hpp"

using namespace strata;
using nlohmann::json;
using strata::test::error_of;

namespace {

std::string load_error(const std::string& path) {
  try {
    load_config(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string world_error(const Config& c, int world) {
  try {
    validate_for_world(c, world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "missing \"" << (part) << "\" in: " << (msg)

// A fresh directory per test, removed afterwards.
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "strata_config_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all, ec);
    for (auto& e : std::filesystem::recursive_directory_iterator(dir_, ec))
      std::filesystem::permissions(e.path(), std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(dir_, ec);
  }
  std::string mkdir(const std::string& name) {
    std::string p = dir_ + "/" + name;
    std::filesystem::create_directories(p);
    return p;
  }
  std::string write(const std::string& name, const std::string& text) {
    std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::string dir_;
};

}  // namespace

// ---- a full config and the defaults ----------------------------------------------

TEST_F(ConfigTest, ZeroInfinityConfigParsesToTheGivenValues) {
  std::string nvme_a = mkdir("nvme0"), nvme_b = mkdir("nvme1");
  json j = json::parse(R"({
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 8,
    "gradient_clipping": 1.0,
    "steps_per_print": 10,
    "bf16": {"enabled": true},
    "fp16": {"enabled": false, "loss_scale": 0, "initial_scale_power": 16},
    "optimizer": {"type": "adamw", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
    "zero_optimization": {
      "stage": 3,
      "contiguous_gradients": true,
      "overlap_comm": false,
      "reduce_scatter": true,
      "allgather_partitions": true,
      "allgather_bucket_size": 2e8,
      "stage3_max_live_parameters": 2e9,
      "stage3_max_reuse_distance": 3e9,
      "stage3_prefetch_bucket_size": 1e7,
      "stage3_param_persistence_threshold": 1e5,
      "reduce_bucket_size": 1e7,
      "sub_group_size": 1e8,
      "offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme_a + R"(", "pin_memory": true,
                            "buffer_count": 4, "fast_init": false, "ratio": 0.5},
      "offload_param": {"device": "nvme", "nvme_path": [")" + nvme_a + R"(", ")" + nvme_b + R"("],
                        "pin_memory": false, "buffer_count": 5, "buffer_size": 1e8, "max_in_cpu": 1e9}
    },
    "aio": {"block_size": 262144, "queue_depth": 64, "thread_count": 2, "single_submit": true,
            "overlap_events": false},
    "activation_checkpointing": {"enabled": true, "partition_activations": false, "cpu_checkpointing": false,
                                 "contiguous_memory_optimization": false, "number_checkpoints": 4,
                                 "synchronize_checkpoint_boundary": false, "profile": false},
    "strata": {
      "backend": "sim", "device_budget": "2GiB", "pinned_budget": 1073741824, "nvme_budget": "1.5TB",
      "checksums": true, "seed": 7, "trace": "run.trace.json", "steps": 500, "checkpoint_every": 50,
      "checkpoint_dir": "ckpt",
      "model": {"layers": 12, "d_model": 768, "heads": 12, "seq_len": 1024, "vocab": 50257},
      "data": {"path": "data/tokens.bin", "format": "tokens"}
    }
  })");
  Config c = parse_config(j);
  EXPECT_EQ(c.train_batch_size, 64);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_FLOAT_EQ(c.gradient_clipping, 1.0f);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_TRUE(c.bf16);

  EXPECT_EQ(c.optimizer.kind, OptimizerKind::AdamW);
  EXPECT_FLOAT_EQ(c.optimizer.lr, 3e-4f);
  EXPECT_FLOAT_EQ(c.optimizer.beta1, 0.8f);
  EXPECT_FLOAT_EQ(c.optimizer.beta2, 0.95f);
  EXPECT_FLOAT_EQ(c.optimizer.eps, 1e-6f);
  EXPECT_FLOAT_EQ(c.optimizer.weight_decay, 0.1f);

  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 2'000'000'000u);
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 3'000'000'000u);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 10'000'000u);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100'000u);
  EXPECT_EQ(c.zero.sub_group_size, 100'000'000u);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::Nvme);
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, std::vector<std::string>{nvme_a});
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::Nvme);
  EXPECT_EQ(c.zero.offload_param.nvme_path, (std::vector<std::string>{nvme_a, nvme_b}));

  EXPECT_EQ(c.aio.block_size, 262144u);
  EXPECT_EQ(c.aio.queue_depth, 64u);
  EXPECT_EQ(c.aio.intra_op_parallelism, 2u);
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_FALSE(c.aio.overlap_events);

  EXPECT_TRUE(c.activation_checkpointing.enabled);

  EXPECT_EQ(c.strata.backend, Backend::Sim);
  EXPECT_EQ(c.strata.device_budget, 2ull << 30);
  EXPECT_EQ(c.strata.pinned_budget, 1ull << 30);
  EXPECT_EQ(c.strata.nvme_budget, 1'500'000'000'000ull);
  EXPECT_TRUE(c.strata.checksums);
  EXPECT_EQ(c.strata.seed, 7u);
  EXPECT_EQ(c.strata.trace, "run.trace.json");
  EXPECT_EQ(c.strata.steps, 500);
  EXPECT_EQ(c.strata.checkpoint_every, 50);
  EXPECT_EQ(c.strata.checkpoint_dir, "ckpt");
  EXPECT_EQ(c.strata.model.layers, 12);
  EXPECT_EQ(c.strata.model.d_model, 768);
  EXPECT_EQ(c.strata.model.heads, 12);
  EXPECT_EQ(c.strata.model.seq_len, 1024);
  EXPECT_EQ(c.strata.model.vocab, 50257);
  EXPECT_EQ(c.strata.data.path, "data/tokens.bin");
  EXPECT_EQ(c.strata.data.format, "tokens");

  EXPECT_EQ(c.raw, j);
  // DeepSpeed's tuning keys load, each with one warning that says why it does nothing
  // here: 0 of fp16 (its keys act now), 6 of zero_optimization (overlap_comm false among them), 2 of
  // offload_optimizer (ratio acts: the GPU optimizer's split), 4 of offload_param (pin_memory false among them) and 4 of
  // activation_checkpointing. pin_memory true and the two checkpointing keys at false
  // are what Strata does, and say nothing.
  EXPECT_EQ(c.warnings.size(), 16u) << ::testing::PrintToString(c.warnings);
  EXPECT_EQ(c.zero.offload_optimizer.ratio, 0.5f);
  EXPECT_HAS(::testing::PrintToString(c.warnings), "zero_optimization.overlap_comm = false has no effect");
  EXPECT_HAS(::testing::PrintToString(c.warnings), "zero_optimization.offload_param.pin_memory = false has no effect");
  EXPECT_EQ(home_tier(c.zero.offload_param.device), Tier::Nvme);
  EXPECT_NO_THROW(validate_for_world(c, 2));  // 4 * 8 * 2 = 64
}

TEST(Config, DefaultsFromAnEmptyObject) {
  Config c = parse_config(json::object());
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 1);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_FALSE(c.train_batch_size.has_value());
  EXPECT_EQ(c.gradient_clipping, 0.0f);
  EXPECT_FALSE(c.bf16);
  EXPECT_EQ(c.steps_per_print, 1);
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::AdamW);
  EXPECT_FLOAT_EQ(c.optimizer.lr, 1e-3f);
  EXPECT_FLOAT_EQ(c.optimizer.beta1, 0.9f);
  EXPECT_FLOAT_EQ(c.optimizer.beta2, 0.999f);
  EXPECT_FLOAT_EQ(c.optimizer.eps, 1e-8f);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0f);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::None);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::None);
  EXPECT_TRUE(c.zero.offload_param.nvme_path.empty());
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50'000'000u);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100'000u);
  EXPECT_EQ(c.aio.block_size, 1u << 20);
  EXPECT_FALSE(c.activation_checkpointing.enabled);
  EXPECT_EQ(c.strata.backend, Backend::Cpu);
  EXPECT_EQ(c.strata.device_budget, 1ull << 30);
  EXPECT_EQ(c.strata.nvme_budget, 0u);
  EXPECT_EQ(c.strata.model.vocab, 256);
  EXPECT_EQ(c.strata.data.format, "auto");
  EXPECT_EQ(c.strata.steps, 100);
  EXPECT_EQ(c.strata.checkpoint_every, 0);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(Config, OffloadDeviceNamesAndTiers) {
  EXPECT_STREQ(to_string(OffloadDevice::None), "none");
  EXPECT_STREQ(to_string(OffloadDevice::Cpu), "cpu");
  EXPECT_STREQ(to_string(OffloadDevice::Nvme), "nvme");
  EXPECT_EQ(home_tier(OffloadDevice::None), Tier::Device);
  EXPECT_EQ(home_tier(OffloadDevice::Cpu), Tier::Pinned);
  EXPECT_EQ(home_tier(OffloadDevice::Nvme), Tier::Nvme);
  Config c = parse_config(json::parse(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})"));
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::Cpu);
}

// DeepSpeed's "Adam" is AdamW unless params.adam_w_mode is false.
TEST(Config, OptimizerTypeFollowsDeepSpeed) {
  auto kind = [](const json& opt) { return parse_config(json{{"optimizer", opt}}).optimizer.kind; };
  EXPECT_EQ(kind(json{{"type", "Adam"}}), OptimizerKind::AdamW);
  EXPECT_EQ(kind(json{{"type", "ADAM"}, {"params", {{"adam_w_mode", false}}}}), OptimizerKind::Adam);
  EXPECT_EQ(kind(json{{"type", "AdamW"}}), OptimizerKind::AdamW);
  EXPECT_EQ(kind(json{{"type", "adam"}, {"params", {{"adam_w_mode", true}}}}), OptimizerKind::AdamW);
  std::string m = error_of(json{{"optimizer", {{"type", "AdamW"}, {"params", {{"adam_w_mode", false}}}}}});
  EXPECT_HAS(m, "optimizer.params.adam_w_mode");
  EXPECT_HAS(m, "set optimizer.type to \"Adam\"");
  m = error_of(json{{"optimizer", {{"type", "Lamb"}}}});
  EXPECT_HAS(m, "optimizer.type = \"Lamb\"");
  EXPECT_HAS(m, "\"Adam\" or \"AdamW\"");
}

TEST(Config, ElementCountsAcceptFloatNotation) {
  Config c = parse_config(json::parse(R"({"zero_optimization": {"stage3_prefetch_bucket_size": 5e7,
      "sub_group_size": 1E9, "stage3_max_reuse_distance": 5e8}, "train_micro_batch_size_per_gpu": 2.0,
      "aio": {"block_size": 1.048576e6, "queue_depth": 6.4e1}})"));
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50'000'000u);
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000u);
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 500'000'000u);
  // The aio section reads numbers the same way (it once refused float notation).
  EXPECT_EQ(c.aio.block_size, 1u << 20);
  EXPECT_EQ(c.aio.queue_depth, 64u);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  std::string m = error_of(json::parse(R"({"zero_optimization": {"sub_group_size": 2.5}})"));
  EXPECT_HAS(m, "zero_optimization.sub_group_size = 2.5");
  EXPECT_HAS(m, "whole number");
  m = error_of(json::parse(R"({"zero_optimization": {"stage3_max_live_parameters": 1e30}})"));
  EXPECT_HAS(m, "zero_optimization.stage3_max_live_parameters");
}

// ---- unknown keys ------------------------------------------------------------------

TEST(Config, UnknownKeysNameTheDottedKeyAndTheNearestValidOne) {
  struct Case {
    const char* json;
    const char* key;
    const char* nearest;
  };
  const Case cases[] = {
      {R"({"train_micro_batch_size_per_gpus": 1})", "'train_micro_batch_size_per_gpus'",
       "'train_micro_batch_size_per_gpu'"},
      {R"({"bf16": {"enable": true}})", "'bf16.enable'", "'enabled'"},
      {R"({"optimizer": {"params": {"weight_decy": 0.1}}})", "'optimizer.params.weight_decy'", "'weight_decay'"},
      {R"({"zero_optimization": {"stage3_prefetch_bucket_sise": 1}})",
       "'zero_optimization.stage3_prefetch_bucket_sise'", "'stage3_prefetch_bucket_size'"},
      {R"({"zero_optimization": {"offload_param": {"nvme_paht": "/x"}}})",
       "'zero_optimization.offload_param.nvme_paht'", "'nvme_path'"},
      {R"({"zero_optimization": {"offload_optimizer": {"buffer_size": 1}}})",
       "'zero_optimization.offload_optimizer.buffer_size'", "'buffer_count'"},
      {R"({"activation_checkpointing": {"cpu_checkpoint": true}})", "'activation_checkpointing.cpu_checkpoint'",
       "'cpu_checkpointing'"},
      {R"({"strata": {"pined_budget": 1}})", "'strata.pined_budget'", "'pinned_budget'"},
      {R"({"strata": {"model": {"d_modle": 64}}})", "'strata.model.d_modle'", "'d_model'"},
      {R"({"strata": {"data": {"fromat": "text"}}})", "'strata.data.fromat'", "'format'"},
      {R"({"aio": {"queue_dept": 8}})", "'aio.queue_dept'", "'queue_depth'"},
  };
  for (const auto& c : cases) {
    std::string m = error_of(json::parse(c.json));
    EXPECT_HAS(m, std::string("unknown config key ") + c.key);
    EXPECT_HAS(m, std::string("did you mean ") + c.nearest);
  }
}

// ---- types and ranges ----------------------------------------------------------------

TEST(Config, WrongTypesNameTheKeyTheValueAndWhatIsAccepted) {
  std::string m = error_of(json::parse(R"({"train_micro_batch_size_per_gpu": "8"})"));
  EXPECT_HAS(m, "train_micro_batch_size_per_gpu = \"8\" is invalid");
  EXPECT_HAS(m, "a whole number >= 1");
  m = error_of(json::parse(R"({"gradient_accumulation_steps": true})"));
  EXPECT_HAS(m, "gradient_accumulation_steps = true");
  m = error_of(json::parse(R"({"bf16": {"enabled": "yes"}})"));
  EXPECT_HAS(m, "bf16.enabled = \"yes\"");
  EXPECT_HAS(m, "true or false");
  m = error_of(json::parse(R"({"zero_optimization": 3})"));
  EXPECT_HAS(m, "zero_optimization = 3");
  EXPECT_HAS(m, "a JSON object");
  m = error_of(json::parse(R"([1, 2])"));
  EXPECT_HAS(m, "top level");
  m = error_of(json::parse(R"({"strata": {"trace": 1}})"));
  EXPECT_HAS(m, "strata.trace = 1");
  EXPECT_HAS(m, "a string");
  m = error_of(json::parse(R"({"zero_optimization": {"offload_param": {"nvme_path": 5}}})"));
  EXPECT_HAS(m, "zero_optimization.offload_param.nvme_path = 5");
  m = error_of(json::parse(R"({"zero_optimization": {"offload_param": {"nvme_path": []}}})"));
  EXPECT_HAS(m, "non-empty list");
  // HuggingFace's placeholder gets a hint.
  m = error_of(json::parse(R"({"train_micro_batch_size_per_gpu": "auto"})"));
  EXPECT_HAS(m, "HuggingFace");
  // Accepted-and-ignored keys are still type-checked.
  m = error_of(json::parse(R"({"zero_optimization": {"contiguous_gradients": 1}})"));
  EXPECT_HAS(m, "zero_optimization.contiguous_gradients = 1");
  m = error_of(json::parse(R"({"zero_optimization": {"offload_optimizer": {"ratio": 2}}})"));
  EXPECT_HAS(m, "zero_optimization.offload_optimizer.ratio = 2");
  // A split of the optimizer needs a host tier to split it with.
  m = error_of(json::parse(R"({"zero_optimization": {"offload_optimizer": {"ratio": 0.5}}})"));
  EXPECT_HAS(m, "offload_optimizer.ratio below 1");
  EXPECT_HAS(m, "set the device to \"cpu\" or \"nvme\"");
}

TEST(Config, OutOfRangeValuesNameTheKeyAndTheRange) {
  struct Case {
    const char* json;
    const char* needle1;
    const char* needle2;
  };
  const Case cases[] = {
      {R"({"train_micro_batch_size_per_gpu": 0})", "train_micro_batch_size_per_gpu = 0", ">= 1"},
      {R"({"gradient_accumulation_steps": 0})", "gradient_accumulation_steps = 0", ">= 1"},
      {R"({"gradient_accumulation_steps": -2})", "gradient_accumulation_steps = -2", ">= 1"},
      {R"({"train_batch_size": 0})", "train_batch_size = 0", ">= 1"},
      {R"({"gradient_clipping": -1})", "gradient_clipping = -1", ">= 0"},
      {R"({"optimizer": {"params": {"lr": 0}}})", "optimizer.params.lr = 0", "> 0"},
      {R"({"optimizer": {"params": {"lr": -0.001}}})", "optimizer.params.lr = -0.001", "> 0"},
      {R"({"optimizer": {"params": {"lr": 1e300}}})", "optimizer.params.lr = 1e+300", "> 0"},
      {R"({"optimizer": {"params": {"betas": [0.9, 1.0]}}})", "optimizer.params.betas = 1.0", "[0, 1)"},
      {R"({"optimizer": {"params": {"betas": [-0.1, 0.9]}}})", "optimizer.params.betas = -0.1", "[0, 1)"},
      {R"({"optimizer": {"params": {"betas": [0.9]}}})", "optimizer.params.betas = [0.9]", "two numbers"},
      {R"({"optimizer": {"params": {"eps": 0}}})", "optimizer.params.eps = 0", "> 0"},
      {R"({"optimizer": {"params": {"weight_decay": -0.01}}})", "optimizer.params.weight_decay = -0.01", ">= 0"},
      {R"({"zero_optimization": {"stage": 0}})", "zero_optimization.stage = 0", "1, 2 or 3"},
      {R"({"zero_optimization": {"stage": 4}})", "zero_optimization.stage = 4", "1, 2 or 3"},
      {R"({"zero_optimization": {"offload_param": {"device": "disk"}}})",
       "zero_optimization.offload_param.device = \"disk\"", "\"none\", \"cpu\" or \"nvme\""},
      {R"({"strata": {"backend": "tpu"}})", "strata.backend = \"tpu\"", "\"cpu\", \"cuda\" or \"sim\""},
      {R"({"strata": {"model": {"layers": 0}}})", "strata.model.layers = 0", "from 1 to 16384"},
      {R"({"strata": {"model": {"seq_len": 0}}})", "strata.model.seq_len = 0", "from 1 to 16777216"},
      {R"({"strata": {"model": {"vocab": 16777217}}})", "strata.model.vocab = 16777217", "from 1 to 16777216"},
      {R"({"strata": {"model": {"d_model": 100, "heads": 3}}})", "d_model = 100 is not divisible by",
       "heads = 3"},
      {R"({"strata": {"steps": 0}})", "strata.steps = 0", ">= 1"},
      {R"({"strata": {"data": {"format": "csv"}}})", "strata.data.format = \"csv\"", "\"tokens\""},
  };
  for (const auto& c : cases) {
    std::string m = error_of(json::parse(c.json));
    EXPECT_HAS(m, c.needle1);
    EXPECT_HAS(m, c.needle2);
  }
  // The edges themselves are accepted.
  Config c = parse_config(json::parse(
      R"({"optimizer": {"params": {"betas": [0, 0.999999], "weight_decay": 0}}, "gradient_clipping": 0,
          "strata": {"model": {"vocab": 65536, "d_model": 96, "heads": 3}}})"));
  EXPECT_EQ(c.strata.model.vocab, 65536);
  EXPECT_FLOAT_EQ(c.optimizer.beta1, 0.0f);
}

// Llama's keys: read into the shape (and back by model_json); refused for GPT-2, which
// would otherwise accept and ignore them; values the model cannot compute refused.
TEST(Config, LlamaKeysAreReadAndRefusedForGpt2) {
  Config c = parse_config(json::parse(
      R"({"strata": {"model": {"arch": "llama", "d_model": 64, "heads": 8, "kv_heads": 2, "ffn": 176,
                                "rope_theta": 500000, "norm_eps": 1e-6, "tied_head": true}}})"));
  const ModelShape& m = c.strata.model;
  EXPECT_TRUE(m.llama());
  EXPECT_EQ(m.kv(), 2);
  EXPECT_EQ(m.ffn_dim(), 176);
  EXPECT_EQ(m.rope_theta, 500000);
  EXPECT_EQ(m.norm_eps, 1e-6);
  EXPECT_TRUE(m.tied());
  EXPECT_EQ(parse_config(json{{"strata", {{"model", model_json(m)}}}}).strata.model, m);
  ModelShape meta;  // Meta's rule for the MLP width: 4096 -> 11008
  meta.arch = Arch::Llama;
  meta.d_model = 4096;
  meta.heads = 32;
  EXPECT_EQ(meta.ffn_dim(), 11008);
  EXPECT_EQ(parse_config(json::parse("{}")).strata.model.arch, Arch::Gpt2);
  const struct {
    const char* json;
    const char* needle1;
    const char* needle2;
  } cases[] = {
      {R"({"strata": {"model": {"kv_heads": 2}}})", "strata.model.kv_heads applies to strata.model.arch \"llama\" only",
       "remove the key"},
      {R"({"strata": {"model": {"tied_head": false}}})", "strata.model.tied_head applies", "always ties"},
      {R"({"strata": {"model": {"rope_theta": 10000}}})", "strata.model.rope_theta applies", "llama"},
      {R"({"strata": {"model": {"arch": "llama", "heads": 4, "kv_heads": 3}}})", "kv_heads = 3 does not divide heads = 4",
       "give a divisor of heads"},
      {R"({"strata": {"model": {"arch": "llama", "d_model": 96, "heads": 32}}})", "d_model / heads = 3 is odd",
       "even head size"},
      {R"({"strata": {"model": {"arch": "mamba"}}})", "strata.model.arch = \"mamba\"", "\"gpt2\" or \"llama\""},
      {R"({"strata": {"model": {"arch": "llama", "rope_theta": 1}}})", "strata.model.rope_theta = 1", "> 1"},
      {R"({"strata": {"model": {"arch": "llama", "norm_eps": 0}}})", "strata.model.norm_eps = 0", "in (0, 1)"},
  };
  for (const auto& k : cases) {
    const std::string msg = error_of(json::parse(k.json));
    EXPECT_HAS(msg, k.needle1);
    EXPECT_HAS(msg, k.needle2);
  }
}

TEST(Config, BudgetsOfZeroAreRefused) {
  for (const char* k : {"device_budget", "pinned_budget", "nvme_budget"}) {
    std::string m = error_of(json{{"strata", {{k, 0}}}});
    EXPECT_HAS(m, std::string("strata.") + k + " = 0");
    EXPECT_HAS(m, "budget of 0 bytes");
    m = error_of(json{{"strata", {{k, "0GiB"}}}});
    EXPECT_HAS(m, std::string("strata.") + k);
  }
  EXPECT_HAS(error_of(json{{"strata", {{"nvme_budget", 0}}}}), "remove the key to size the NVMe tier from the plan");
}

// ---- keys without effect, and keys refused ------------------------------------------------

namespace {

// Every row of the tables with its dotted key and, for rows with a field, the target it
// reads its default from (within `defaults`).
struct Row {
  std::string key;
  const ConfigKey* k;
  void* target;
};
void collect_rows(const ConfigSection& s, void* target, std::vector<Row>& out) {
  for (const ConfigKey& k : s.keys) {
    const std::string key = s.path.empty() ? std::string(k.name) : s.path + "." + k.name;
    if (k.type == KeyType::Section)
      collect_rows(*k.section, k.enter ? k.enter(target) : target, out);
    else
      out.push_back({key, &k, target});
  }
}
std::vector<Row> all_rows(Config& defaults) {
  std::vector<Row> rows;
  collect_rows(config_table(), &defaults, rows);
  return rows;
}

// A config holding only `key` = v.
json with_key(const std::string& key, const json& v) {
  std::string pointer = "/" + key;
  std::replace(pointer.begin(), pointer.end(), '.', '/');
  json j = json::object();
  j[json::json_pointer(pointer)] = v;
  return j;
}

// A value the row accepts: its lower bound, or the boolean asked for.
json valid_value(const ConfigKey& k, bool flag) {
  switch (k.type) {
    case KeyType::Boolean: return flag;
    case KeyType::Whole: return std::max<uint64_t>(k.min, 1);
    case KeyType::Float:
    case KeyType::Double: return k.lo_open ? k.lo + 1 : k.lo;
    default: return 0;
  }
}

}  // namespace

TEST(Config, PinMemoryTrueIsWhatStrataDoesAndFalseWarnsOnce) {
  for (const char* s : {"offload_param", "offload_optimizer"}) {
    EXPECT_TRUE(parse_config(json{{"zero_optimization", {{s, {{"pin_memory", true}}}}}}).warnings.empty());
    auto w = parse_config(json{{"zero_optimization", {{s, {{"pin_memory", false}}}}}}).warnings;
    ASSERT_EQ(w.size(), 1u);
    EXPECT_HAS(w[0], std::string("zero_optimization.") + s + ".pin_memory = false has no effect");
    EXPECT_HAS(w[0], "always pinned memory");
    EXPECT_HAS(error_of(json{{"zero_optimization", {{s, {{"pin_memory", 0}}}}}}), "true or false");
  }
}

TEST(Config, OverlapCommIsAlwaysOnAndFalseWarnsOnce) {
  EXPECT_TRUE(parse_config(json{{"zero_optimization", {{"overlap_comm", true}}}}).warnings.empty());
  auto w = parse_config(json{{"zero_optimization", {{"overlap_comm", false}}}}).warnings;
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], "zero_optimization.overlap_comm = false has no effect");
  EXPECT_HAS(w[0], "always overlaps communication with compute");
}

TEST(Config, ReduceBucketSizeWarnsThatEachGroupIsOneCollective) {
  auto w = parse_config(json::parse(R"({"zero_optimization": {"reduce_bucket_size": 5e8}})")).warnings;
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], "zero_optimization.reduce_bucket_size has no effect");
  EXPECT_HAS(w[0], "each parameter group (a whole transformer block) as one collective");
  // Still type-checked, as every key without effect.
  EXPECT_HAS(error_of(json{{"zero_optimization", {{"reduce_bucket_size", 0}}}}),
             "zero_optimization.reduce_bucket_size = 0 is invalid: expected a whole number >= 1");
}

// partition_activations is refused (Strata does not split checkpoints across ranks);
// cpu_checkpointing acts, and only with checkpointing on.
TEST(Config, PartitionedActivationsAreRefusedAndCpuCheckpointingNeedsCheckpointing) {
  const std::string key = "activation_checkpointing.partition_activations";
  std::string m = error_of(json{{"activation_checkpointing", {{"enabled", true}, {"partition_activations", true}}}});
  EXPECT_HAS(m, key + " = true is not supported yet");
  EXPECT_HAS(m, "Strata's ranks are data-parallel, each rank's checkpoints are of its own batch");
  EXPECT_HAS(m, "cpu_checkpointing moves them off the device instead");
  EXPECT_HAS(m, "set " + key + " to false or remove it");
  // false is what Strata does: accepted without a word.
  Config c = parse_config(json{{"activation_checkpointing", {{"enabled", true}, {"partition_activations", false}}}});
  EXPECT_TRUE(c.warnings.empty()) << ::testing::PrintToString(c.warnings);

  c = parse_config(json{{"activation_checkpointing", {{"enabled", true}, {"cpu_checkpointing", true}}}});
  EXPECT_TRUE(c.activation_checkpointing.cpu_checkpointing);
  EXPECT_TRUE(EngineOptions::from_config(c).cpu_checkpointing);
  EXPECT_TRUE(c.warnings.empty()) << ::testing::PrintToString(c.warnings);
  m = error_of(json{{"activation_checkpointing", {{"cpu_checkpointing", true}}}});
  EXPECT_HAS(m, "activation_checkpointing.cpu_checkpointing moves the checkpoints that activation checkpointing keeps, "
                "and activation_checkpointing.enabled is false: set enabled to true, or drop cpu_checkpointing");
}

// Every row that does not simply store its value, walked from the tables: a key
// without effect warns exactly once, naming itself and why; a fixed switch warns only
// at its other value; a refused one is refused only at its other value.
TEST(Config, EveryKeyThatDoesNotActSaysSoOnce) {
  Config defaults;
  int no_effect = 0, fixed = 0, refused = 0;
  for (const Row& r : all_rows(defaults)) {
    const ConfigKey& k = *r.k;
    if (k.use == KeyUse::Used) continue;
    ASSERT_NE(k.why, nullptr) << r.key;
    if (k.use == KeyUse::NoEffect) {
      ++no_effect;
      auto w = parse_config(with_key(r.key, valid_value(k, true))).warnings;
      ASSERT_EQ(w.size(), 1u) << r.key;
      EXPECT_EQ(w[0], r.key + " has no effect: " + k.why);
      continue;
    }
    EXPECT_TRUE(parse_config(with_key(r.key, k.only)).warnings.empty()) << r.key;
    if (k.use == KeyUse::Fixed) {
      ++fixed;
      auto w = parse_config(with_key(r.key, !k.only)).warnings;
      ASSERT_EQ(w.size(), 1u) << r.key;
      EXPECT_HAS(w[0], r.key + " = " + json(!k.only).dump() + " has no effect: " + k.why);
    } else {
      ++refused;
      std::string m = error_of(with_key(r.key, !k.only));
      EXPECT_HAS(m, r.key + " = " + json(!k.only).dump() + " is not supported yet: " + k.why);
      EXPECT_HAS(m, "set " + r.key + " to " + json(k.only).dump() + " or remove it");
    }
  }
  // fp16.auto_cast, 5 of zero_optimization, 3 of offload_param and 2 of offload_optimizer
  // (ratio acts), 4 of activation_checkpointing; pin_memory twice and overlap_comm;
  // partition_activations (cpu_checkpointing acts).
  EXPECT_EQ(no_effect, 15);
  EXPECT_EQ(fixed, 3);
  EXPECT_EQ(refused, 1);
}

// A key that is used stores its value (or is one the section's check reads), and its
// default, the struct's own initialiser, is a value the key accepts.
TEST(Config, EveryUsedKeyStoresItsValueAndItsDefaultIsAccepted) {
  Config defaults;
  for (const Row& r : all_rows(defaults)) {
    const ConfigKey& k = *r.k;
    if (k.use != KeyUse::Used) continue;
    if (!k.field.store) {
      // strata.lora.target is read by strata's check, which resolves it once the arch is known.
      EXPECT_TRUE(r.key == "optimizer.params.adam_w_mode" || r.key == "strata.lora.target") << "a key no one reads: "
                                                                                             << r.key;
      continue;
    }
    ASSERT_NE(k.field.load, nullptr) << r.key;
    if (k.fallback) continue;  // a default the field does not hold (required, or set from other keys)
    json v = k.field.load(r.target);
    if (v.is_null()) continue;  // unset
    if (k.type == KeyType::Text && v.is_number()) {  // an enum: its choice's name
      auto c = std::find_if(k.choices.begin(), k.choices.end(), [&](const Choice& c) { return c.value == v; });
      ASSERT_NE(c, k.choices.end()) << r.key << ": the default is none of the choices";
      v = c->name;
    }
    EXPECT_NO_THROW(read_key(k, r.key, v)) << r.key << " = " << v.dump();
  }
}

TEST(Config, TheListingShowsEveryKeyWithItsRangeDefaultAndWhy) {
  const std::string text = config_keys_text();
  EXPECT_HAS(text, "aio.block_size: a power of two from 4096 to 1073741824; default 1048576\n");
  EXPECT_HAS(text, "zero_optimization.sub_group_size: a whole number >= 1; default 1e9\n");
  EXPECT_HAS(text, "strata.device_budget: ");
  EXPECT_HAS(text, "; default 1GiB\n");
  EXPECT_HAS(text, "optimizer.params.betas: a list of two numbers, each in [0, 1); default [0.9, 0.999]\n");
  EXPECT_HAS(text, "zero_optimization.reduce_bucket_size: a whole number >= 1; default —\n");
  EXPECT_HAS(text, "No effect, with a warning: Strata reduces each parameter group");
  Config defaults;
  for (const Row& r : all_rows(defaults)) EXPECT_HAS("\n" + text, "\n" + r.key + ": ");
}

// docs/configuration.md holds each section's key list between markers; each must be
// what the tables give, so the page cannot drift from the parser.
TEST(Config, TheDocsKeyListsAreTheTables) {
  const std::string path = std::string(STRATA_DOCS_DIR) + "/configuration.md";
  std::ifstream f(path);
  ASSERT_TRUE(f) << "cannot open " << path;
  const std::string doc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string open = "<!-- keys: ", open_end = " -->\n", close = "<!-- end keys -->";
  std::vector<std::string> sections;
  std::string regenerated;
  size_t pos = 0;
  for (size_t b; (b = doc.find(open, pos)) != std::string::npos;) {
    const size_t name_end = doc.find(open_end, b);
    ASSERT_NE(name_end, std::string::npos);
    std::string section = doc.substr(b + open.size(), name_end - b - open.size());
    if (section == "top level") section = "";
    const size_t body = name_end + open_end.size(), end = doc.find(close, body);
    ASSERT_NE(end, std::string::npos) << "no " << close << " after " << open << section;
    const std::string expected = config_keys_markdown(section);
    EXPECT_EQ(doc.substr(body, end - body), expected)
        << "docs/configuration.md's keys of '" << section << "' differ from the tables (runtime/src/config/"
        << "config_table.cpp); STRATA_UPDATE_DOCS=1 ./build/tests/runtime/test_config "
        << "--gtest_filter='*DocsKeyLists*' rewrites them";
    regenerated += doc.substr(pos, body - pos) + expected;
    pos = end;
    sections.push_back(section);
  }
  regenerated += doc.substr(pos);
  EXPECT_EQ(sections, config_doc_sections()) << "every section with a table of its own has one block, in order";
  if (std::getenv("STRATA_UPDATE_DOCS") && regenerated != doc) std::ofstream(path, std::ios::binary) << regenerated;
}

// ---- cross-field checks -----------------------------------------------------------------

TEST(Config, Stage3OptionsBelowStage3NameTheFix) {
  for (const char* k : {"stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                        "stage3_param_persistence_threshold"}) {
    std::string m = error_of(json{{"zero_optimization", {{"stage", 2}, {k, 1000}}}});
    EXPECT_HAS(m, std::string("zero_optimization.") + k + " only applies to ZeRO stage 3");
    EXPECT_HAS(m, "remove it or set zero_optimization.stage to 3");
  }
  std::string m = error_of(json::parse(R"({"zero_optimization": {"stage": 1, "offload_param": {"device": "cpu"}}})"));
  EXPECT_HAS(m, "zero_optimization.offload_param only applies to ZeRO stage 3");
  EXPECT_HAS(m, "stage is 1");
  EXPECT_HAS(m, "remove it or set zero_optimization.stage to 3");
  // Optimizer offload is fine at any stage.
  Config c = parse_config(
      json::parse(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})"));
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::Cpu);
}

TEST_F(ConfigTest, NvmeOffloadNeedsAWritableDirectory) {
  std::string m = error_of(json::parse(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})"));
  EXPECT_HAS(m, "zero_optimization.offload_optimizer.device is \"nvme\"");
  EXPECT_HAS(m, "zero_optimization.offload_optimizer.nvme_path is not set");
  EXPECT_HAS(m, "add \"nvme_path\"");

  std::string missing = dir_ + "/no_such_dir";
  m = error_of(json{{"zero_optimization", {{"offload_param", {{"device", "nvme"}, {"nvme_path", missing}}}}}});
  EXPECT_HAS(m, "zero_optimization.offload_param.nvme_path '" + missing + "'");
  EXPECT_HAS(m, "No such file or directory");
  EXPECT_HAS(m, "create the directory");

  std::string file = write("a_file", "x");
  m = error_of(json{{"zero_optimization", {{"offload_param", {{"device", "nvme"}, {"nvme_path", file}}}}}});
  EXPECT_HAS(m, "is not a directory");

  // Every directory of a striped list is checked, not just the first.
  std::string ok = mkdir("ok");
  m = error_of(json{{"zero_optimization",
                     {{"offload_optimizer", {{"device", "nvme"}, {"nvme_path", {ok, missing}}}}}}});
  EXPECT_HAS(m, missing);
  m = error_of(json{{"zero_optimization", {{"offload_optimizer", {{"device", "nvme"}, {"nvme_path", {ok, ok}}}}}}});
  EXPECT_HAS(m, "twice");

  // A path that is not used (device cpu) is not checked.
  EXPECT_EQ(error_of(json{{"zero_optimization", {{"offload_param", {{"device", "cpu"}, {"nvme_path", missing}}}}}}),
            "");
}

TEST_F(ConfigTest, NvmeDirectoryThatIsNotWritable) {
  std::string ro = mkdir("read_only");
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
  ASSERT_EQ(chmod(ro.c_str(), 0555), 0);
  json j{{"zero_optimization", {{"offload_param", {{"device", "nvme"}, {"nvme_path", ro}}}}}};
  std::string m;
  if (geteuid() != 0) {
    m = error_of(j);
  } else {
    // Root passes permission bits, so parse as an unprivileged user in a child.
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      std::string out = (setgid(65534) == 0 && setuid(65534) == 0) ? error_of(j) : "SETUID_FAILED";
      ssize_t n = ::write(fds[1], out.data(), out.size());
      _exit(n == static_cast<ssize_t>(out.size()) ? 0 : 1);
    }
    close(fds[1]);
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) m.append(buf, static_cast<size_t>(n));
    close(fds[0]);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (m == "SETUID_FAILED") GTEST_SKIP() << "running as root and cannot drop to uid 65534 to test permissions";
  }
  EXPECT_HAS(m, "zero_optimization.offload_param.nvme_path '" + ro + "' is not writable");
  EXPECT_HAS(m, "Permission denied");
}

TEST(Config, PrecisionSections) {
  Config c = parse_config(json::parse(R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
      "loss_scale_window": 50, "hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 0.25}})"));
  EXPECT_EQ(c.precision(), DType::F16);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.fp16.loss_scale_window, 50);
  EXPECT_EQ(c.fp16.hysteresis, 3);
  EXPECT_TRUE(c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.min_loss_scale, 0.25);
  EXPECT_EQ(parse_config(json::parse(R"({"bf16": {"enabled": true}})")).precision(), DType::BF16);
  EXPECT_EQ(parse_config(json::object()).precision(), DType::F32);
  // A DeepSpeed config with fp16 turned off parses.
  EXPECT_EQ(error_of(json::parse(R"({"fp16": {"enabled": false, "loss_scale_window": 1000, "hysteresis": 2}})")), "");
}

TEST(Config, PrecisionErrorsNameTheFix) {
  std::string m = error_of(json::parse(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})"));
  EXPECT_HAS(m, "bf16.enabled and fp16.enabled are both true");
  EXPECT_HAS(m, "choose one");
  EXPECT_HAS(error_of(json::parse(R"({"fp16": {"enabled": true, "hysteresis": 0}})")), "fp16.hysteresis = 0");
  EXPECT_HAS(error_of(json::parse(R"({"fp16": {"enabled": true, "loss_scale_window": -1}})")), "fp16.loss_scale_window");
  EXPECT_HAS(error_of(json::parse(R"({"fp16": {"enabled": true, "initial_scale_power": 200}})")),
             "fp16.initial_scale_power = 200");
  EXPECT_HAS(error_of(json::parse(R"({"fp16": {"enabled": true, "loss_scale": -1}})")), "fp16.loss_scale = -1");
  EXPECT_HAS(error_of(json::parse(R"({"fp16": {"enabled": true, "min_loss_scale": 0}})")), "fp16.min_loss_scale = 0");
  m = error_of(json::parse(R"({"fp16": {"enabled": true, "initial_scale_power": 2, "min_loss_scale": 8}})"));
  EXPECT_HAS(m, "fp16.min_loss_scale = 8");
  EXPECT_HAS(m, "lower min_loss_scale or raise initial_scale_power");
}

TEST(Config, CheckpointEveryNeedsADirectory) {
  std::string m = error_of(json::parse(R"({"strata": {"checkpoint_every": 10}})"));
  EXPECT_HAS(m, "strata.checkpoint_every = 10");
  EXPECT_HAS(m, "set strata.checkpoint_dir");
}

TEST(Config, TrainBatchSizeMustMatchTheWorld) {
  Config c = parse_config(json::parse(
      R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})"));
  EXPECT_EQ(world_error(c, 4), "");
  std::string m = world_error(c, 2);
  EXPECT_HAS(m, "train_batch_size = 32");
  EXPECT_HAS(m, "4 * 2 * 2 = 16");
  EXPECT_HAS(m, "set gradient_accumulation_steps to 4");
  c.train_batch_size = 30;
  m = world_error(c, 2);
  EXPECT_HAS(m, "4 * 2 * 2 = 16");
  EXPECT_HAS(m, "multiple of train_micro_batch_size_per_gpu * world size (8)");
  // Without train_batch_size there is nothing to check.
  c.train_batch_size.reset();
  EXPECT_EQ(world_error(c, 7), "");
}

// ---- sizes --------------------------------------------------------------------------------

TEST(Config, ParseBytes) {
  EXPECT_EQ(parse_bytes(4096, "k"), 4096u);
  EXPECT_EQ(parse_bytes(1e9, "k"), 1'000'000'000u);
  EXPECT_EQ(parse_bytes("512MiB", "k"), 512ull << 20);
  EXPECT_EQ(parse_bytes("2GB", "k"), 2'000'000'000u);
  EXPECT_EQ(parse_bytes("1.5GiB", "k"), 3ull << 29);
  EXPECT_EQ(parse_bytes("1e9", "k"), 1'000'000'000u);
  EXPECT_EQ(parse_bytes("64 KiB", "k"), 65536u);
  EXPECT_EQ(parse_bytes("3tib", "k"), 3ull << 40);
  EXPECT_EQ(parse_bytes("100B", "k"), 100u);
  EXPECT_EQ(parse_bytes(".5KB", "k"), 500u);
  for (json bad : {json("12XB"), json("MiB"), json("-1GiB"), json(""), json("1.5.2GB"), json("1e"), json(-5),
                   json(1.5), json(true), json("20000000TiB"), json::array({1})}) {
    try {
      parse_bytes(bad, "strata.pinned_budget");
      ADD_FAILURE() << "accepted " << bad.dump();
    } catch (const ConfigError& e) {
      std::string m = e.what();
      EXPECT_HAS(m, "strata.pinned_budget = " + bad.dump());
    }
  }
  std::string m;
  try {
    parse_bytes("12XB", "strata.device_budget");
  } catch (const ConfigError& e) {
    m = e.what();
  }
  EXPECT_HAS(m, "\"512MiB\"");
}

// ---- overrides ----------------------------------------------------------------------------

TEST(Config, OverridesWalkAndCreateThePath) {
  json j = json::parse(R"({"zero_optimization": {"stage": 3}})");
  apply_override(j, "zero_optimization.stage=2");
  EXPECT_EQ(j["zero_optimization"]["stage"], 2);
  apply_override(j, "zero_optimization.offload_optimizer.device=cpu");  // not JSON: a string
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  apply_override(j, "bf16.enabled=true");
  EXPECT_EQ(j["bf16"]["enabled"], true);
  apply_override(j, "strata.pinned_budget=2GiB");
  apply_override(j, "strata.model.d_model=256");
  apply_override(j, R"(strata.checkpoint_dir="123")");  // quoted: stays a string
  apply_override(j, "optimizer.params.betas=[0.8,0.9]");
  apply_override(j, "strata.trace=a=b");  // only the first '=' splits
  Config c = parse_config(j);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::Cpu);
  EXPECT_TRUE(c.bf16);
  EXPECT_EQ(c.strata.pinned_budget, 2ull << 30);
  EXPECT_EQ(c.strata.model.d_model, 256);
  EXPECT_EQ(c.strata.checkpoint_dir, "123");
  EXPECT_FLOAT_EQ(c.optimizer.beta1, 0.8f);
  EXPECT_EQ(c.strata.trace, "a=b");

  json empty;
  apply_override(empty, "train_micro_batch_size_per_gpu=8");
  EXPECT_EQ(parse_config(empty).train_micro_batch_size_per_gpu, 8);
}

TEST(Config, BadOverridesAreConfigErrors) {
  json j = json::parse(R"({"train_batch_size": 32})");
  auto error = [&](const std::string& a) {
    try {
      apply_override(j, a);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string m = error("zero_optimization.stage");
  EXPECT_HAS(m, "'zero_optimization.stage' has no '='");
  EXPECT_HAS(m, "key=value");
  EXPECT_HAS(error("=3"), "empty key name");
  EXPECT_HAS(error("a..b=3"), "empty key name");
  m = error("train_batch_size.x=1");
  EXPECT_HAS(m, "'train_batch_size' is 32, not a section");
  // Not UTF-8 (found by tests/fuzz/fuzz_set.cpp: the raw string reached an error
  // message's json::dump, which threw json::type_error): refused before it is stored.
  m = error("scheduler.params={\"war\x9d\x8a\x8f\xa0num_steps\": 6}");
  EXPECT_HAS(m, "is not UTF-8 text: its byte 23 cannot begin a UTF-8 character");
  EXPECT_HAS(error("strata.trace=a\xc3"), "byte 15 begins a UTF-8 character cut off by the end");
  // An override with a misspelt key is caught by parse_config like the file's own.
  apply_override(j, "zero_optimization.stag=2");
  EXPECT_HAS(error_of(j), "unknown config key 'zero_optimization.stag'");
  EXPECT_HAS(error_of(j), "did you mean 'stage'");
}

// ---- files --------------------------------------------------------------------------------

TEST_F(ConfigTest, LoadConfigReadsTheFileAndKeepsItRaw) {
  std::string p = write("run.json", R"({"train_micro_batch_size_per_gpu": 3, "strata": {"seed": 9}})");
  Config c = load_config(p);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 3);
  EXPECT_EQ(c.strata.seed, 9u);
  EXPECT_EQ(c.raw["strata"]["seed"], 9);
}

TEST_F(ConfigTest, FileErrorsNameThePath) {
  std::string missing = dir_ + "/missing.json";
  std::string m = load_error(missing);
  EXPECT_HAS(m, "config file '" + missing + "' cannot be opened");
  EXPECT_HAS(m, "No such file or directory");

  m = load_error(dir_);
  EXPECT_HAS(m, "config file '" + dir_ + "'");
  EXPECT_HAS(m, "is not a regular file (it is a directory)");

  std::string empty = write("empty.json", "");
  m = load_error(empty);
  EXPECT_HAS(m, "config file '" + empty + "' is empty");
  EXPECT_HAS(load_error(write("blank.json", "  \n\t\n")), "is empty");
}

// A FIFO with no writer or a device would block or never end: refused before a byte is
// read (core/safe_io.hpp). The FIFO is this test's own; O_NONBLOCK means no wait.
TEST_F(ConfigTest, NonRegularFilesAreRefusedWithoutBlocking) {
  const std::string fifo = dir_ + "/config.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string m = load_error(fifo);
  EXPECT_HAS(m, "config file '" + fifo + "' is not a regular file (it is a FIFO (named pipe))");
  m = load_error("/dev/zero");
  EXPECT_HAS(m, "config file '/dev/zero' is not a regular file (it is a character device)");
}

TEST_F(ConfigTest, ConfigFilesAreBoundedInSize) {
  const std::string big = write("big.json", "{}");
  std::filesystem::resize_file(big, kMaxConfigBytes + 1);  // sparse: nothing is written
  const std::string m = load_error(big);
  EXPECT_HAS(m, "config file '" + big + "' is 16.00 MiB, more than the 16.00 MiB a config file may be");
}

// Numbers beyond a double and nesting beyond 64 are ConfigErrors, not an abort or a
// stack overflow.
TEST_F(ConfigTest, HugeNumbersAndDeepNestingAreConfigErrors) {
  std::string m = load_error(write("huge.json", R"({"train_micro_batch_size_per_gpu": 1e400})"));
  EXPECT_HAS(m, "number overflow parsing '1e400'");
  EXPECT_HAS(m, "numbers must fit a double");
  m = load_error(write("deep.json", std::string(100000, '[') + std::string(100000, ']')));
  EXPECT_HAS(m, "nests objects and arrays more than 64 deep (at line 1, column 65)");
  std::string deep_obj;
  for (int i = 0; i < 100000; ++i) deep_obj += "{\"a\":";
  deep_obj += "1" + std::string(100000, '}');
  EXPECT_HAS(load_error(write("deep_obj.json", deep_obj)), "more than 64 deep");
  // Brackets inside strings are not nesting.
  Config c = load_config(write("brackets.json", R"({"strata": {"trace": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[.json"}})"));
  EXPECT_EQ(c.strata.trace.size(), 77u);
  // An override parsed as JSON is bounded too; 1e400 there is a string (not a number).
  json j = json::object();
  EXPECT_THROW(apply_override(j, "strata.seed=" + std::string(100, '[') + std::string(100, ']')), ConfigError);
  apply_override(j, "strata.trace=1e400");
  EXPECT_EQ(j["strata"]["trace"], "1e400");
}

// Shapes beyond the limits (model/gpt_layout.hpp) are refused before any allocation.
TEST_F(ConfigTest, ModelSizesAreBounded) {
  std::string m = error_of(json::parse(R"({"strata": {"model": {"d_model": 2147483647}}})"));
  EXPECT_HAS(m, "strata.model.d_model = 2147483647 is invalid: expected");
  m = error_of(json::parse(R"({"strata": {"model": {"layers": 16384, "d_model": 131072, "heads": 1}}})"));
  EXPECT_HAS(m, "parameters is more than Strata's limit of 1e+15");
}

TEST_F(ConfigTest, MalformedJsonGivesLineAndColumn) {
  // Line 3 lacks the comma after 4; the parser stops at the end of the unexpected key
  // on line 4 (its closing quote, column 19), as nlohmann's own message says.
  std::string p = write("bad.json",
                        "{\n"
                        "  \"train_micro_batch_size_per_gpu\": 1,\n"
                        "  \"gradient_accumulation_steps\": 4\n"
                        "  \"steps_per_print\": 10\n"
                        "}\n");
  std::string m = load_error(p);
  EXPECT_HAS(m, "config file '" + p + "' is not valid JSON at line 4, column 19");
  EXPECT_HAS(m, "syntax error");
  EXPECT_EQ(m.find("[json.exception"), std::string::npos) << m;

  // Truncated: the error is at the end of the file.
  m = load_error(write("cut.json", "{\n  \"zero_optimization\": {\"stage\": 3\n"));
  EXPECT_HAS(m, "at line 3, column 1");
}

TEST_F(ConfigTest, ErrorsInsideAFileNameTheFileAndTheKey) {
  std::string p = write("typo.json", R"({"zero_optimization": {"stage": 3, "sub_group_sise": 1e9}})");
  std::string m = load_error(p);
  EXPECT_HAS(m, "config file '" + p + "'");
  EXPECT_HAS(m, "unknown config key 'zero_optimization.sub_group_sise'");
  EXPECT_HAS(m, "did you mean 'sub_group_size'");
}

TEST_F(ConfigTest, DuplicateKeysAreRefused) {
  std::string p = write("dup.json", R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                          "stage": 2}})");
  std::string m = load_error(p);
  EXPECT_HAS(m, "key 'zero_optimization.stage' appears twice");
  // The same name in different sections is not a duplicate.
  std::string ok = write("ok.json", R"({"bf16": {"enabled": true}, "fp16": {"enabled": false}})");
  EXPECT_NO_THROW(load_config(ok));
}

// ---- the documentation's example ----------------------------------------------------------

TEST_F(ConfigTest, TheDocumentedExampleParses) {
  std::ifstream f(std::string(STRATA_DOCS_DIR) + "/configuration.md");
  ASSERT_TRUE(f) << "cannot open docs/configuration.md";
  std::string doc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t begin = doc.find("```json\n");
  ASSERT_NE(begin, std::string::npos);
  begin += 8;
  size_t end = doc.find("\n```", begin);
  ASSERT_NE(end, std::string::npos);
  json j = json::parse(doc.substr(begin, end - begin));
  // The example's /local_nvme* directories do not exist here; point them at real ones.
  std::string a = mkdir("nvme0"), b = mkdir("nvme1");
  apply_override(j, "zero_optimization.offload_param.nvme_path=[\"" + a + "\",\"" + b + "\"]");
  apply_override(j, "zero_optimization.offload_optimizer.nvme_path=" + a);
  Config c = parse_config(j);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::Nvme);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::Nvme);
  EXPECT_EQ(c.zero.offload_param.nvme_path.size(), 2u);
  EXPECT_EQ(c.strata.nvme_budget, 2'000'000'000'000ull);
  EXPECT_EQ(c.scheduler.type, LrScheduleType::WarmupCosineLR);
  EXPECT_EQ(c.scheduler.total_num_steps, c.strata.steps);
  EXPECT_NO_THROW(validate_for_world(c, 4));  // the page says 4 * 4 * 4 = 64
  EXPECT_TRUE(c.warnings.empty()) << "the page says every key of its example acts: "
                                  << ::testing::PrintToString(c.warnings);
}

// ZeRO++'s quantized collectives: qgZ at stage 1 and with MiCS is refused; a block size
// without its collective would act on nothing and is refused too; with it, both parse.
TEST(Config, QuantizedCollectivesRefuseWhatCannotWork) {
  EXPECT_HAS(error_of(json::parse(R"({"zero_optimization": {"stage": 1, "zero_quantized_gradients": true}})")),
             "zero_optimization.zero_quantized_gradients quantizes the gradient reduce-scatters of stages 2 and 3");
  EXPECT_HAS(error_of(json::parse(
                 R"({"zero_optimization": {"stage": 3, "zero_quantized_gradients": true, "mics_shard_size": 2}})")),
             "remove one of them");
  EXPECT_HAS(error_of(json::parse(R"({"strata": {"quantized_gradients_block": 64}})")),
             "strata.quantized_gradients_block sizes the blocks of zero_optimization.zero_quantized_gradients, which "
             "is off: set zero_optimization.zero_quantized_gradients to true, or remove strata.quantized_gradients_block");
  EXPECT_HAS(error_of(json::parse(R"({"strata": {"quantized_weights_block": 64}})")),
             "strata.quantized_weights_block sizes the blocks of zero_optimization.zero_quantized_weights, which is off");
  EXPECT_HAS(error_of(json::parse(R"({"zero_optimization": {"stage": 3, "zero_quantized_gradients": true},
                                      "strata": {"quantized_gradients_block": 8}})")),
             "strata.quantized_gradients_block");
  const Config c = parse_config(json::parse(R"({"zero_optimization": {"stage": 2, "zero_quantized_gradients": true},
                                                 "strata": {"quantized_gradients_block": 64}})"));
  EXPECT_TRUE(c.zero.zero_quantized_gradients);
  EXPECT_EQ(c.strata.quantized_gradients_block, 64);
  EXPECT_EQ(EngineOptions::from_config(c).quantized_gradients_block, 64);
}
