// `strata train`'s loop (runtime/train.hpp) end to end on the cpu backend, with real
// data files, NVMe swap files and checkpoints:
//  - save at step 10, resume: steps 11-20 give the losses of the uninterrupted run, in
//    fp32, bf16 and fp16;
//  - bf16 follows fp32's loss curve over 200 steps on text;
//  - model states 100x the device budget and 4x the pinned budget train with falling
//    loss, and no tier's peak exceeds its budget;
//  - bad data and a checkpoint of another model shape are clear errors, and the
//    existing checkpoint's bytes are untouched;
//  - on a GPU, the cuda backend gives the cpu backend's losses (skipped without one);
//  - one run per checkpoint_dir (a second is refused naming the holder's pid; a holder
//    killed with SIGKILL blocks nothing), --resume-from, and the start-up checks: a
//    checkpoint in the way of the run's saves, a checkpoint_dir that is a checkpoint or
//    cannot be written, all refused before the first step.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "strata/collectives/communicator.hpp"
#include "strata/core/error.hpp"
#include "strata/runtime/formats/checkpoint.hpp"
#include "strata/runtime/train/rank.hpp"
#include "strata/runtime/train/train.hpp"
#include "strata/runtime/engine/zero_engine.hpp"

#include "config_errors.hpp"

namespace fs = std::filesystem;
using namespace strata;

namespace {

struct Dir {
  fs::path p;
  explicit Dir(const std::string& tag) {
    p = fs::temp_directory_path() / ("strata-train-" + tag + "-" + std::to_string(::getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(p, ec);
  }
};

// Sentences from a small grammar: structure a byte-level model learns in a few steps.
std::string corpus(int sentences) {
  const char* words[] = {"the", "cat", "dog", "sat", "on", "a", "mat", "ran", "to", "red", "big", "house"};
  std::mt19937 rng(9);
  std::string s;
  for (int i = 0; i < sentences; ++i) {
    const int n = 4 + static_cast<int>(rng() % 5);
    for (int w = 0; w < n; ++w) s += std::string(words[rng() % 12]) + (w + 1 < n ? " " : ". ");
  }
  return s;
}

std::string write_file(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

Config config(const Dir& d, const std::string& data, nlohmann::json shape, int steps, int micro = 4) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", micro},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}},
      {"zero_optimization",
       {{"stage", 3},
        {"offload_param", {{"device", "nvme"}, {"nvme_path", d.p.string()}}},
        {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", d.p.string()}}}}},
      {"strata",
       {{"device_budget", "8MiB"},
        {"pinned_budget", "8MiB"},
        {"model", shape},
        {"data", {{"path", data}, {"format", "text"}}},
        {"steps", steps}}}};
  return parse_config(j);
}

nlohmann::json small_shape() { return {{"layers", 2}, {"d_model", 32}, {"heads", 2}, {"seq_len", 32}, {"vocab", 256}}; }

// small_shape as a Llama with grouped-query attention (one key/value head).
nlohmann::json small_llama() {
  nlohmann::json j = small_shape();
  j["arch"] = "llama";
  j["kv_heads"] = 1;
  return j;
}

// A cuda-against-cpu case: the model, its precision and the relative loss tolerance.
struct Case {
  const char* name;
  nlohmann::json shape;
  bool bf16;
  double tol;
};

std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) {
      std::ostringstream s;
      s << std::ifstream(e.path(), std::ios::binary).rdbuf();
      files[e.path().string()] = s.str();
    }
  return files;
}

TrainOptions quiet() {
  TrainOptions o;
  o.quiet = true;
  return o;
}

// Every step's loss of `got` within rel x |want's| at that step; the worst relative
// difference, for the test to print.
double expect_losses_near(const TrainResult& got, const TrainResult& want, double rel) {
  EXPECT_EQ(got.steps.size(), want.steps.size());
  double worst = 0;
  for (size_t s = 0; s < std::min(got.steps.size(), want.steps.size()); ++s) {
    const double a = want.steps[s].loss, b = got.steps[s].loss;
    worst = std::max(worst, std::abs(b - a) / std::abs(a));
    EXPECT_NEAR(b, a, rel * std::abs(a)) << "step " << s + 1;
  }
  return worst;
}

// Trains `c` to step 5 with a checkpoint in `ckpt`, resumes it to step 10, and expects the
// uninterrupted run's losses of steps 6-10 (`whole`), to 1e-4 relative (on cuda the
// embedding gradient's atomics may reorder sums between runs).
void expect_resume_continues(Config c, const fs::path& ckpt, const TrainResult& whole) {
  c.strata.steps = 5;
  c.strata.checkpoint_every = 5;
  c.strata.checkpoint_dir = ckpt.string();
  train(c, quiet());
  c.strata.steps = 10;
  TrainOptions resume = quiet();
  resume.resume = true;
  const TrainResult rest = train(c, resume);
  ASSERT_EQ(rest.first_step, 5);
  ASSERT_EQ(rest.steps.size(), 5u);
  for (int s = 0; s < 5; ++s)
    EXPECT_NEAR(rest.steps[s].loss, whole.steps[5 + s].loss, 1e-4 * std::abs(whole.steps[5 + s].loss))
        << "step " << 6 + s;
}

}  // namespace

// In fp32, bf16 and fp16 (dynamic loss scaling, its scaler state in the checkpoint).
TEST(Train, SaveAtStepTenThenResumeGivesTheUninterruptedLosses) {
  for (const char* precision : {"f32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    Dir d(std::string("resume-") + precision);
    auto with_precision = [&](Config c) {
      c.bf16 = std::string(precision) == "bf16";
      c.fp16.enabled = std::string(precision) == "fp16";
      return c;
    };
    const std::string data = write_file(d.p / "corpus.txt", corpus(2000));
    TrainResult full = train(with_precision(config(d, data, small_shape(), 20)), quiet());
    ASSERT_EQ(full.steps.size(), 20u);
    EXPECT_LT(full.steps.back().loss, full.steps.front().loss);

    Config c10 = with_precision(config(d, data, small_shape(), 10));
  c10.strata.checkpoint_every = 10;
  c10.strata.checkpoint_dir = (d.p / "ckpt").string();
  TrainResult first = train(c10, quiet());
  ASSERT_FALSE(first.last_checkpoint.empty());
  Config c20 = c10;
  c20.strata.steps = 20;
  TrainOptions resume = quiet();
  resume.resume = true;
  TrainResult rest = train(c20, resume);
  ASSERT_EQ(rest.first_step, 10);
  ASSERT_EQ(rest.steps.size(), 10u);
  for (int s = 0; s < 10; ++s) {
    EXPECT_EQ(first.steps[s].loss, full.steps[s].loss) << "step " << s + 1;
    EXPECT_EQ(rest.steps[s].loss, full.steps[10 + s].loss) << "step " << 11 + s;
  }
  }
}

// strata.speculative_optimizer under `strata train`: with a warmup schedule (a new
// learning rate every step, set before the backward pass) and clipping that triggers on
// some steps, bf16, states on NVMe, the losses are the plain run's to the bit, some
// steps commit and some are undone; a resume from its checkpoint continues exactly.
TEST(Train, SpeculativeOptimizerGivesThePlainLossesWithAScheduleAndClipping) {
  Dir d("speculative");
  const std::string data = write_file(d.p / "corpus.txt", corpus(2000));
  auto with = [&](int steps, bool speculative) {
    Config c = config(d, data, small_shape(), steps);
    c.bf16 = true;
    c.gradient_clipping = 1.85f;  // the norms run 1.7-3.0 here: the first steps clip, about half the later ones
    c.scheduler = parse_config(nlohmann::json::parse(
                                   R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0,
                                       "warmup_max_lr": 0.003, "warmup_num_steps": 30}}})"))
                      .scheduler;
    c.strata.speculative_optimizer = speculative;
    return c;
  };
  TrainResult plain = train(with(20, false), quiet());
  TrainResult spec = train(with(20, true), quiet());
  ASSERT_EQ(spec.steps.size(), 20u);
  for (int s = 0; s < 20; ++s) {
    EXPECT_EQ(spec.steps[s].loss, plain.steps[s].loss) << "step " << s + 1;
    EXPECT_EQ(spec.steps[s].lr, plain.steps[s].lr) << "step " << s + 1;
  }
  EXPECT_EQ(spec.stats.speculation_commits + spec.stats.speculation_rollbacks, 20u);
  EXPECT_GT(spec.stats.speculation_commits, 0u) << "no step committed: the learning rate or the scale differed";
  EXPECT_GT(spec.stats.speculation_rollbacks, 0u) << "clipping never triggered: the test lost its point";
  EXPECT_EQ(plain.stats.speculation_commits + plain.stats.speculation_rollbacks, 0u);

  Config c10 = with(10, true);
  c10.strata.checkpoint_every = 10;
  c10.strata.checkpoint_dir = (d.p / "ckpt").string();
  ASSERT_FALSE(train(c10, quiet()).last_checkpoint.empty());
  Config c20 = c10;
  c20.strata.steps = 20;
  TrainOptions resume = quiet();
  resume.resume = true;
  TrainResult rest = train(c20, resume);
  ASSERT_EQ(rest.steps.size(), 10u);
  for (int s = 0; s < 10; ++s) EXPECT_EQ(rest.steps[s].loss, plain.steps[10 + s].loss) << "step " << 11 + s;
}

// 200 steps on text in bf16 follow the fp32 run: same model, data and schedule, parameters
// and optimizer on NVMe. Band, on the mean loss of each 10 steps: within 3% of fp32's
// everywhere and within 1.5% over the last 50 steps (measured 1.34% and 0.4%).
TEST(Train, Bf16FollowsTheFp32LossCurveFor200StepsOnText) {
  Dir d("bf16-curve");
  const std::string data = write_file(d.p / "corpus.txt", corpus(6000));
  const int steps = 200;
  Config c = config(d, data, small_shape(), steps);
  c.optimizer.lr = 2e-3f;
  TrainResult f32 = train(c, quiet());
  c.bf16 = true;
  TrainResult b16 = train(c, quiet());
  ASSERT_EQ(f32.steps.size(), static_cast<size_t>(steps));
  ASSERT_EQ(b16.steps.size(), static_cast<size_t>(steps));
  double worst = 0, first32 = 0, last32 = 0, last16 = 0;
  for (int w = 0; w < steps / 10; ++w) {
    double a = 0, b = 0;
    for (int s = 10 * w; s < 10 * w + 10; ++s) a += f32.steps[s].loss / 10, b += b16.steps[s].loss / 10;
    worst = std::max(worst, std::abs(b - a) / a);
    if (w == 0) first32 = a;
  }
  for (int s = steps - 50; s < steps; ++s) last32 += f32.steps[s].loss / 50, last16 += b16.steps[s].loss / 50;
  std::printf("200 steps on text: fp32 %.4f -> %.4f, bf16 -> %.4f (last 50 steps' mean); worst 10-step window %.2f%%\n",
              first32, last32, last16, 100 * worst);
  EXPECT_LT(last32, 0.7 * first32) << "the model does not learn: the comparison would prove little";
  EXPECT_LT(worst, 0.03);
  EXPECT_LT(std::abs(last16 - last32) / last32, 0.015);
}

TEST(Train, StatesHundredTimesTheDeviceBudgetAndFourTimesPinnedTrain) {
  Dir d("beyond");
  const std::string data = write_file(d.p / "corpus.txt", corpus(4000));
  // 128 blocks of d_model 32: 1.63M parameters, 20 bytes each in model states = 32.6 MB;
  // the device budget (326 KB) holds the engine's minimum: about two blocks in flight.
  nlohmann::json shape = {{"layers", 128}, {"d_model", 32}, {"heads", 2}, {"seq_len", 32}, {"vocab", 256}};
  Config c = config(d, data, shape, 25);
  const uint64_t states = gpt_param_count(c.strata.model) * 20;
  c.strata.device_budget = states / 100;
  c.strata.pinned_budget = states / 4 / 4096 * 4096;  // whole pages: the pool rounds up to them
  c.zero.sub_group_size = 200'000;
  c.zero.stage3_prefetch_bucket_size = 20'000;
  c.zero.stage3_param_persistence_threshold = 0;
  c.optimizer.lr = 2e-3f;
  TrainResult r = train(c, quiet());
  ASSERT_EQ(r.steps.size(), 25u);
  double first = 0, last = 0;
  for (int s = 0; s < 5; ++s) first += r.steps[s].loss / 5, last += r.steps[20 + s].loss / 5;
  EXPECT_LT(last, 0.8 * first) << "loss " << first << " -> " << last;
  const auto& t = r.stats.store.tiers;
  EXPECT_LE(t[0].budget, states / 100);  // the tier rounds its region down to its alignment
  EXPECT_LE(t[1].budget, states / 4);
  EXPECT_LE(t[0].peak, t[0].budget);
  EXPECT_LE(t[1].peak, t[1].budget);
  EXPECT_GT(t[0].peak, t[0].budget / 2) << "the device tier was barely used: the test would prove little";
  EXPECT_GE(t[2].used, states * 3 / 4) << "most of the states must live on NVMe";
  std::printf("states %.1f MB, device budget %.2f MB (peak %.2f), pinned %.2f MB (peak %.2f); loss %.3f -> %.3f\n",
              states / 1e6, t[0].budget / 1e6, t[0].peak / 1e6, t[1].budget / 1e6, t[1].peak / 1e6, first, last);
}

// The device budget the engine asks for at start-up (its homes plus the working set of
// one group) is enough to train: with small blocks that stay gathered
// (stage3_param_persistence_threshold) and without, with checkpointing and without. (The
// prefetch once started every persistent group's first gather at once, each passing its
// shard through the device, and a run at that budget failed at its first step.)
TEST(Train, TheStartUpMinimumDeviceBudgetTrains) {
  Dir d("minimum");
  const std::string data = write_file(d.p / "corpus.txt", corpus(600));
  nlohmann::json shape = {{"layers", 8}, {"d_model", 64}, {"heads", 2}, {"seq_len", 128}, {"vocab", 256}};
  std::vector<GroupSize> sizes;
  for (const GroupSpec& g : gpt_group_specs(parse_config({{"strata", {{"model", shape}}}}).strata.model))
    sizes.push_back({g.name, g.numel});
  for (uint64_t persistence : {uint64_t{100'000}, uint64_t{0}})  // every block persistent (50K elements), none
    for (bool ckpt : {false, true}) {
      SCOPED_TRACE("persistence threshold " + std::to_string(persistence) + (ckpt ? ", checkpointing" : ""));
      Config c = config(d, data, shape, 3);
      c.zero.stage3_param_persistence_threshold = persistence;
      c.activation_checkpointing.enabled = ckpt;
      EngineOptions eo = EngineOptions::from_config(c);
      if (ckpt) eo.checkpoints = {.count = 9, .bytes = 4ull * 128 * 64 * sizeof(float)};
      const ShardLayout L = make_shard_layout(sizes, eo.shard_strategy(1));
      c.strata.device_budget = L.need[int(Tier::Device)].homes() + L.device_working;
      const TrainResult r = train(c, quiet());
      ASSERT_EQ(r.steps.size(), 3u);
      EXPECT_LE(r.stats.store.tiers[int(Tier::Device)].peak, r.stats.store.tiers[int(Tier::Device)].budget);
    }
}

// With activation checkpointing the engine holds the checkpoints, and its device budget
// counts them. A budget one byte short of what they need on the device is a clear error
// naming cpu_checkpointing; with it the same budget trains (3 of 9 checkpoints on the
// device at a time, the rest in pinned memory, or on NVMe when pinned is short too), and
// the losses are those of the run with room for them on the device, bit for bit.
TEST(Train, CpuCheckpointingTrainsWhereTheCheckpointsDoNotFitTheDevice) {
  Dir d("cpuckpt");
  const std::string data = write_file(d.p / "corpus.txt", corpus(600));
  nlohmann::json shape = {{"layers", 8}, {"d_model", 64}, {"heads", 2}, {"seq_len", 128}, {"vocab", 256}};
  Config c = config(d, data, shape, 6);
  c.activation_checkpointing.enabled = true;
  c.gradient_clipping = 1.0f;
  // The engine's own rule for the device: homes (the checkpoints among them) plus the
  // working set of the largest group.
  const uint64_t cp = 4ull * 128 * 64 * sizeof(float);
  EngineOptions eo = EngineOptions::from_config(c);
  eo.checkpoints = {.count = 9, .bytes = cp};
  std::vector<GroupSize> sizes;
  for (const GroupSpec& g : gpt_group_specs(c.strata.model)) sizes.push_back({g.name, g.numel});
  const ShardLayout L = make_shard_layout(sizes, eo.shard_strategy(1));
  const uint64_t need = L.need[int(Tier::Device)].homes() + L.device_working;
  ASSERT_EQ(L.need[int(Tier::Device)].activations, 9 * cp);

  c.strata.device_budget = need;  // the start-up minimum
  const TrainResult roomy = train(c, quiet());
  EXPECT_EQ(roomy.stats.store.tiers[int(Tier::Device)].peak_by_owner.at("activations"), 9 * cp);
  c.strata.device_budget = need - 1;
  const std::string m = test::error_of<OutOfBudget>([&] { train(c, quiet()); });
  EXPECT_NE(m.find("the resident bytes include 9 activation checkpoints"), std::string::npos) << m;
  EXPECT_NE(m.find("activation_checkpointing.cpu_checkpointing moves them off the device"), std::string::npos) << m;
  c.activation_checkpointing.cpu_checkpointing = true;
  for (uint64_t pinned : {8ull << 20, 2560ull << 10}) {  // room for the checkpoints in pinned memory, then not
    SCOPED_TRACE("pinned budget " + std::to_string(pinned));
    c.strata.pinned_budget = pinned;
    const TrainResult r = train(c, quiet());
    ASSERT_EQ(r.steps.size(), roomy.steps.size());
    for (size_t i = 0; i < r.steps.size(); ++i) EXPECT_EQ(r.steps[i].loss, roomy.steps[i].loss) << "step " << i;
    const StoreStats& st = r.stats.store;
    EXPECT_LE(st.tiers[int(Tier::Device)].peak_by_owner.at("activations"), 3 * cp);
    EXPECT_LE(st.tiers[int(Tier::Device)].peak, st.tiers[int(Tier::Device)].budget);
    const int home = pinned == (8ull << 20) ? int(Tier::Pinned) : int(Tier::Nvme);
    EXPECT_EQ(st.tiers[home].by_owner.at("activations"), 9 * cp);
  }
}

// Memory-centric tiling: a block larger than the whole device budget trains when its
// linears are tiled (strata.tile_factor) and its tensors gathered one part at a time
// (stage3_prefetch_bucket_size below a block), with the losses of the untiled run on a
// budget that holds the block, within rounding (tiles sum a linear's input gradient in
// four pieces). Untiled, the same budget is refused at start-up. A checkpoint saved by the
// tiled run resumes untiled (the parts map back onto the blocks).
TEST(Train, TilingTrainsABlockLargerThanTheDeviceBudget) {
  Dir d("tiling");
  const std::string data = write_file(d.p / "corpus.txt", corpus(600));
  nlohmann::json shape = {{"layers", 2}, {"d_model", 256}, {"heads", 4}, {"seq_len", 32}, {"vocab", 256}};
  Config c = config(d, data, shape, 8);
  c.zero.stage3_param_persistence_threshold = 0;
  const uint64_t block_bytes = 4 * gpt_groups(c.strata.model)[1].numel;  // 789,760 fp32 elements
  c.strata.device_budget = 32 << 20;  // a block's working set: 15 MiB
  c.strata.pinned_budget = 32 << 20;  // the optimizer's staging of whole-block sub-groups
  const TrainResult untiled = train(c, quiet());
  Config t = c;
  t.strata.tile_factor = 4;
  t.zero.stage3_prefetch_bucket_size = 65'536;  // a tile of the MLP (256 x 1024 / 4)
  std::vector<GroupSize> sizes;
  for (const GroupSpec& g : gpt_group_specs(t.strata.model, gpt_parts(t.strata.model, 65'536, 4)))
    sizes.push_back({g.name, g.numel});
  const ShardLayout L = make_shard_layout(sizes, EngineOptions::from_config(t).shard_strategy(1));
  t.strata.device_budget = L.need[int(Tier::Device)].homes() + L.device_working;  // the start-up minimum
  ASSERT_LT(t.strata.device_budget, block_bytes);
  const TrainResult tiled = train(t, quiet());
  ASSERT_EQ(tiled.steps.size(), untiled.steps.size());
  for (size_t i = 0; i < tiled.steps.size(); ++i)
    EXPECT_NEAR(tiled.steps[i].loss, untiled.steps[i].loss, 1e-5 * untiled.steps[i].loss) << "step " << i;
  EXPECT_LT(tiled.steps.back().loss, tiled.steps.front().loss);
  const StoreStats& st = tiled.stats.store;
  EXPECT_LE(st.tiers[int(Tier::Device)].peak, t.strata.device_budget);
  EXPECT_LT(st.tiers[int(Tier::Device)].peak_by_owner.at("gathered"), block_bytes / 4);
  std::printf("device budget %llu bytes for blocks of %llu: gathered peak %llu, device peak %llu\n",
              static_cast<unsigned long long>(t.strata.device_budget), static_cast<unsigned long long>(block_bytes),
              static_cast<unsigned long long>(st.tiers[int(Tier::Device)].peak_by_owner.at("gathered")),
              static_cast<unsigned long long>(st.tiers[int(Tier::Device)].peak));

  Config whole = c;  // untiled on the tiled run's budget
  whole.strata.device_budget = t.strata.device_budget;
  const std::string m = test::error_of<OutOfBudget>([&] { train(whole, quiet()); });
  EXPECT_NE(m.find("device"), std::string::npos) << m;

  // Saved tiled at step 4, resumed untiled: steps 5-8 as the tiled run had them.
  Config save = t;
  save.strata.steps = 4;
  save.strata.checkpoint_every = 4;
  save.strata.checkpoint_dir = (d.p / "ckpt").string();
  train(save, quiet());
  Config resume = c;
  resume.strata.checkpoint_dir = save.strata.checkpoint_dir;
  TrainOptions o = quiet();
  o.resume = true;
  const TrainResult rest = train(resume, o);
  ASSERT_EQ(rest.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(rest.steps[i].loss, tiled.steps[4 + i].loss, 1e-5 * tiled.steps[4 + i].loss) << "step " << 5 + i;
}

// strata.tile_size: only the linears larger than it are tiled, each into the fewest tiles
// of whole output rows that hold at most that many elements (at least tile_factor); the
// losses are the untiled run's within rounding, and a size below one row is refused.
TEST(Train, TileSizeTilesTheLinearsLargerThanIt) {
  Dir d("tile-size");
  const std::string data = write_file(d.p / "corpus.txt", corpus(300));
  nlohmann::json shape = {{"layers", 2}, {"d_model", 64}, {"heads", 2}, {"seq_len", 32}, {"vocab", 256}};
  Config c = config(d, data, shape, 6);
  c.zero.stage3_prefetch_bucket_size = 4096;  // gathers (and look-ahead) of one tensor, or one tile
  c.zero.stage3_max_reuse_distance = 0;       // released when the model lets go, not kept for reuse
  const GptShape& s = c.strata.model;
  // Tiles of each linear of block 0, counted from the part boundaries inside it.
  auto tiles = [&](int tile_factor, uint64_t tile_size) {
    const std::vector<uint64_t> begins = gpt_parts(s, UINT64_MAX, tile_factor, tile_size)[1];
    std::map<std::string, int> n;
    const std::vector<GptGroup> groups = gpt_groups(s);
    for (const GptTensor& t : groups[1].tensors) {
      if (t.shape.size() != 2) continue;
      int inside = 1;
      for (uint64_t b : begins) inside += b > t.offset && b < t.offset + t.numel();
      n[t.name.substr(t.name.find('.', 2) + 1)] = inside;
    }
    return n;
  };
  // qkv [192, 64], the attention's projection [64, 64], the MLP's [256, 64] and [64, 256].
  std::map<std::string, int> n = tiles(1, 4096);
  EXPECT_EQ(n["attn.c_attn.weight"], 3) << "192 rows: 64 rows of 64 per tile";
  EXPECT_EQ(n["attn.c_proj.weight"], 1) << "4096 elements: not larger than the size";
  EXPECT_EQ(n["mlp.c_fc.weight"], 4);
  EXPECT_EQ(n["mlp.c_proj.weight"], 4);
  n = tiles(2, 4096);  // with a tile factor as well: at least 2 each
  EXPECT_EQ(n["attn.c_attn.weight"], 3);
  EXPECT_EQ(n["attn.c_proj.weight"], 2);
  EXPECT_EQ(n["mlp.c_fc.weight"], 4);
  n = tiles(1, 0);
  EXPECT_EQ(n["mlp.c_fc.weight"], 1) << "0: no size limit";

  const TrainResult untiled = train(c, quiet());
  Config t = c;
  t.strata.tile_size = 4096;
  const TrainResult tiled = train(t, quiet());
  ASSERT_EQ(tiled.steps.size(), untiled.steps.size());
  for (size_t i = 0; i < tiled.steps.size(); ++i)
    EXPECT_NEAR(tiled.steps[i].loss, untiled.steps[i].loss, 1e-5 * untiled.steps[i].loss) << "step " << i;
  EXPECT_LT(tiled.steps.back().loss, tiled.steps.front().loss);
  // The run was tiled: each block gathered in more, smaller parts (8 more: qkv's 3 tiles,
  // the MLP's 4 and 4, against one gather of each matrix), every pass.
  const auto blocks = [&](const std::vector<std::vector<uint64_t>>& parts) {
    uint64_t n = 0;
    for (size_t g = 1; g + 1 < parts.size(); ++g) n += parts[g].size();
    return n;
  };
  const uint64_t more = blocks(gpt_parts(s, 4096, 1, 4096)) - blocks(gpt_parts(s, 4096, 1, 0));
  EXPECT_EQ(more, 2u * 8u);
  EXPECT_GT(tiled.stats.gathers, untiled.stats.gathers);
  EXPECT_EQ((tiled.stats.gathers - untiled.stats.gathers) % more, 0u)
      << tiled.stats.gathers << " against " << untiled.stats.gathers;

  t.strata.tile_size = 200;  // below one row of the MLP's projection (256)
  const std::string m = test::error_of<ConfigError>([&] { train(t, quiet()); });
  EXPECT_NE(m.find("strata.tile_size = 200 is smaller than one output row"), std::string::npos) << m;
  EXPECT_NE(m.find("give at least 256"), std::string::npos) << m;
}

// Bad parts: a tile factor that does not divide every linear's rows, a bucket of 0, and
// stage3_max_live_parameters below the largest part are refused at start-up, naming the
// key and what works.
TEST(Train, BadTileFactorBucketAndLiveParametersAreRefusedAtStartUp) {
  Dir d("badtiles");
  const std::string data = write_file(d.p / "corpus.txt", corpus(100));
  Config c = config(d, data, small_shape(), 1);  // d_model 32: linears of 96, 32 and 128 rows
  c.strata.tile_factor = 3;
  std::string m = test::error_of<ConfigError>([&] { train(c, quiet()); });
  EXPECT_NE(m.find("strata.tile_factor = 3 does not divide every linear"), std::string::npos) << m;
  EXPECT_NE(m.find("give one of 1, 2, 4, 8, 16, 32"), std::string::npos) << m;
  EXPECT_NE(m.find("the smallest workable value is 1"), std::string::npos) << m;
  m = test::error_of<ConfigError>([&] {
    parse_config({{"zero_optimization", {{"stage3_prefetch_bucket_size", 0}}}});
  });
  EXPECT_NE(m.find("stage3_prefetch_bucket_size"), std::string::npos) << m;
  c.strata.tile_factor = 4;  // blocks in parts of at most a quarter of the MLP's 128 x 32
  c.zero.stage3_prefetch_bucket_size = 1;
  uint64_t largest = 0;  // the embeddings, gathered whole
  for (const GroupSpec& g : gpt_group_specs(c.strata.model, gpt_parts(c.strata.model, 1, 4)))
    largest = std::max(largest, g.numel);
  ASSERT_EQ(largest, (256u + 32u) * 32u);
  c.zero.stage3_max_live_parameters = largest - 1;
  m = test::error_of<ConfigError>([&] { train(c, quiet()); });
  EXPECT_NE(m.find("stage3_max_live_parameters = " + std::to_string(largest - 1)), std::string::npos) << m;
  EXPECT_NE(m.find("give at least " + std::to_string(largest)), std::string::npos) << m;
  c.zero.stage3_max_live_parameters = largest;
  EXPECT_EQ(train(c, quiet()).steps.size(), 1u);
}

TEST(Train, BadDataIsAClearErrorBeforeAnythingIsAllocated) {
  Dir d("baddata");
  try {
    train(config(d, (d.p / "missing.txt").string(), small_shape(), 2), quiet());
    FAIL() << "a missing data file trained";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.txt"), std::string::npos) << e.what();
  }
  const std::string empty = write_file(d.p / "empty.txt", "");
  EXPECT_THROW(train(config(d, empty, small_shape(), 2), quiet()), ConfigError);
  const std::string binary = write_file(d.p / "binary.txt", std::string("abc\0def", 7) + corpus(100));
  EXPECT_THROW(train(config(d, binary, small_shape(), 2), quiet()), ConfigError);
}

TEST(Train, ResumingWithAnotherModelShapeIsRefusedAndTouchesNothing) {
  Dir d("othershape");
  const std::string data = write_file(d.p / "corpus.txt", corpus(500));
  Config c = config(d, data, small_shape(), 2);
  c.strata.checkpoint_every = 2;
  c.strata.checkpoint_dir = (d.p / "ckpt").string();
  train(c, quiet());
  const auto before = snapshot(d.p / "ckpt");
  ASSERT_FALSE(before.empty());
  nlohmann::json other = small_shape();
  other["d_model"] = 64;
  Config c2 = config(d, data, other, 4);
  c2.strata.checkpoint_every = 2;
  c2.strata.checkpoint_dir = c.strata.checkpoint_dir;
  TrainOptions resume = quiet();
  resume.resume = true;
  try {
    train(c2, resume);
    FAIL() << "resumed a checkpoint of another shape";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
  }
  EXPECT_EQ(snapshot(d.p / "ckpt"), before);
}

// One rule for --resume, --resume-from and --init-from: every field that changes what the
// model computes must match, and each that differs is named with both values. Most
// changes below keep every parameter count (heads with d_model fixed, rope_theta,
// norm_eps), which a check of group sizes cannot see. Llama's context is no such field:
// its rotary positions hold no weights, so a longer one starts from the checkpoint.
TEST(Train, ResumeAndInitFromRefuseAnotherModelNamingEveryField) {
  Dir d("identity");
  const std::string data = write_file(d.p / "corpus.txt", corpus(300));
  nlohmann::json llama = small_shape();
  llama["arch"] = "llama";
  llama["kv_heads"] = 2;  // = heads: heads 4 with kv_heads 4 keeps every size
  struct Change {
    nlohmann::json base;
    std::vector<std::pair<const char*, nlohmann::json>> set;  // null: the key removed
    std::vector<std::string> named;  // every one must be in the message
  };
  const std::vector<Change> changes = {
      {small_shape(), {{"heads", 4}}, {"heads is 2 in the checkpoint, 4 here", "head_dim is 16 in the checkpoint, 8 here"}},
      {small_shape(), {{"heads", 8}, {"vocab", 300}}, {"heads is 2 in the checkpoint, 8 here", "vocab is 256 in the checkpoint, 300 here"}},
      {small_shape(), {{"seq_len", 16}}, {"seq_len is 32 in the checkpoint, 16 here"}},
      {llama, {{"heads", 4}, {"kv_heads", 4}}, {"heads is 2 in the checkpoint, 4 here", "kv_heads is 2 in the checkpoint, 4 here"}},
      {llama, {{"rope_theta", 5e5}}, {"rope_theta is 10000 in the checkpoint, 500000 here"}},
      {llama, {{"norm_eps", 0.1}}, {"norm_eps is 1e-05 in the checkpoint, 0.1 here"}},
      {llama, {{"tied_head", true}}, {"tied_head is false in the checkpoint, true here"}},
      {llama, {{"arch", "gpt2"}, {"kv_heads", nullptr}}, {"arch is llama in the checkpoint, gpt2 here"}},
  };
  std::map<std::string, std::string> saved;  // base model's dump -> its checkpoint_dir
  for (const nlohmann::json& base : {small_shape(), llama}) {
    Config c = config(d, data, base, 1);
    c.strata.checkpoint_every = 1;
    c.strata.checkpoint_dir = (d.p / ("ckpt-" + std::to_string(saved.size()))).string();
    train(c, quiet());
    saved[base.dump()] = c.strata.checkpoint_dir;
  }
  for (const Change& ch : changes) {
    nlohmann::json other = ch.base;
    for (const auto& [k, v] : ch.set) {
      if (v.is_null())
        other.erase(k);
      else
        other[k] = v;
    }
    const std::string dir = saved.at(ch.base.dump());
    const auto before = snapshot(dir);
    for (const char* how : {"--resume", "--resume-from", "--init-from"}) {
      Config c = config(d, data, other, 2);
      c.strata.checkpoint_every = 1;
      TrainOptions o = quiet();
      if (std::string(how) == "--resume") {
        c.strata.checkpoint_dir = dir;
        o.resume = true;
      } else if (std::string(how) == "--resume-from") {
        o.resume_from = (fs::path(dir) / "step-00000001").string();
      } else {
        o.init_from = dir;
      }
      const std::string msg = test::error_of<ConfigError>([&] { train(c, o); });
      EXPECT_EQ(msg.rfind(how, 0), 0u) << other.dump() << ": " << msg;
      for (const std::string& n : ch.named) EXPECT_NE(msg.find(n), std::string::npos) << other.dump() << ": " << msg;
      EXPECT_NE(msg.find("Fix: set strata.model to the checkpoint's"), std::string::npos) << msg;
    }
    EXPECT_EQ(snapshot(dir), before) << other.dump();
  }
  // Llama with a longer context: the same function on the positions both have, so its
  // weights start the run (--resume would refuse the data position: its windows changed).
  nlohmann::json longer = llama;
  longer["seq_len"] = 64;
  TrainOptions o = quiet();
  o.init_from = saved.at(llama.dump());
  EXPECT_EQ(train(config(d, data, longer, 1), o).steps.size(), 1u);
}

// A loss that goes non-finite (here: a learning rate of 1e30) says what to lower, and,
// with NVMe offload and checksums off, that damaged swap data looks the same and how to
// turn checksums on; with checksums on, or without NVMe, it does not.
TEST(Train, ANonFiniteLossWithNvmeAndNoChecksumsNamesCorruptedOffloadData) {
  Dir d("nonfinite-loss");
  const std::string data = write_file(d.p / "corpus.txt", corpus(300));
  struct Case {
    bool nvme, checksums, hint;
  };
  for (const Case k : {Case{true, false, true}, Case{true, true, false}, Case{false, false, false}}) {
    for (float lr : {1e30f, 1e35f}) {
      Config c = config(d, data, small_shape(), 4);
      c.optimizer.lr = lr;
      c.scheduler.optimizer_lr = lr;  // as parse_config sets both
      c.strata.checksums = k.checksums;
      if (!k.nvme) {
        c.zero.offload_param.device = OffloadDevice::None;
        c.zero.offload_optimizer.device = OffloadDevice::None;
      }
      const std::string m = test::error_of<Error>([&] { train(c, quiet()); });
      const std::string what = std::string(k.nvme ? "nvme" : "in memory") + (k.checksums ? ", checksums" : "");
      EXPECT_NE(m.find("the loss is"), std::string::npos) << what << ": " << m;
      EXPECT_NE(m.find("lower the learning rate"), std::string::npos) << what << ": " << m;
      EXPECT_EQ(m.find("corrupted offload data") != std::string::npos, k.hint) << what << ": " << m;
      EXPECT_EQ(m.find("--set strata.checksums=true") != std::string::npos, k.hint) << what << ": " << m;
    }
  }
}

// `strata train` on the cuda backend (GptCuda, NCCL over one GPU, device buffers from the
// engine) against the cpu backend on the same data, seed and configuration: the losses of
// 10 steps agree to fp32 rounding carried through AdamW (relative 2e-3 per step: summation
// orders differ, and the embedding gradient's atomics make the GPU run non-deterministic),
// the loss falls, and a save at step 5 resumed to step 10 continues the run. Stage 3 with
// parameters and optimizer on NVMe, and stage 2 with the optimizer in pinned memory.
// Needs a GPU: skipped with the reason elsewhere (CI); passed on an H100 (docs/training.md).
// MFU's peak is measured once per GPU: with ranks taking GPU local_rank % gpus, the first
// of each GPU's ranks measures and the rest add nothing (two ranks timing one H200 at once
// summed 1.48 PFLOP/s, each timing the whole GPU between the other's time slices).
TEST(Train, OneRankPerGpuMeasuresTheMatmulPeak) {
  for (int gpus : {1, 2, 8}) {
    for (int world : {1, 2, 4, 8, 16}) {
      std::vector<int> measuring(gpus, 0);
      for (int local = 0; local < world; ++local)
        if (first_rank_on_its_gpu(local, gpus)) ++measuring[local % gpus];
      for (int g = 0; g < gpus; ++g)
        EXPECT_EQ(measuring[g], g < world ? 1 : 0) << gpus << " GPUs, " << world << " ranks, GPU " << g;
    }
  }
  EXPECT_TRUE(first_rank_on_its_gpu(3, 0));  // no GPU: make_device refuses, nothing is shared
}

TEST(Train, CudaBackendMatchesTheCpuBackend) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no cuda backend here: " << why;
  Dir d("cuda");
  const std::string data = write_file(d.p / "corpus.txt", corpus(2000));
  for (int stage : {3, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Config cpu = config(d, data, small_shape(), 10);
    cpu.zero.stage = stage;
    if (stage == 2) cpu.zero.offload_optimizer.device = OffloadDevice::Cpu;
    Config gpu = cpu;
    gpu.strata.backend = Backend::Cuda;
    const TrainResult a = train(cpu, quiet());
    const TrainResult b = train(gpu, quiet());
    ASSERT_EQ(a.steps.size(), 10u);
    ASSERT_EQ(b.steps.size(), 10u);
    expect_losses_near(b, a, 2e-3);
    EXPECT_LT(b.steps.back().loss, b.steps.front().loss);
    EXPECT_GT(b.peak_flops, 0.0);
    expect_resume_continues(gpu, d.p / ("ckpt" + std::to_string(stage)), b);
  }
}

// The paths CudaBackendMatchesTheCpuBackend leaves out, on cuda against the cpu backend in
// the same precision: bf16 (16-bit parameters and gradients through every tier, cuBLAS on
// the tensor cores), Llama in fp32 and bf16 (RMSNorm, rotary, grouped-query attention,
// SwiGLU kernels), and the speculative optimizer on cuda against the plain step on cuda
// with a schedule and clipping. Tolerances: fp32 as above; bf16 5e-4 relative, about 13x
// the worst difference measured on an H200 (3.7e-5 for GPT-2, 1.5e-5 for Llama:
// both backends round at the same points, so only sums that land on opposite sides of a
// bf16 step differ). Speculation on cuda gave the plain step's losses bit for bit there
// (20 steps, 12 commits, 8 rollbacks); it is held to 1e-4, as the embedding gradient's
// atomics may reorder sums between runs. Every step commits or rolls back, some commit.
TEST(Train, CudaBf16LlamaAndSpeculationMatchTheCpuBackend) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no cuda backend here: " << why;
  Dir d("cuda-more");
  const std::string data = write_file(d.p / "corpus.txt", corpus(2000));
  const nlohmann::json llama = small_llama();
  for (const Case& k : {Case{"gpt2 bf16", small_shape(), true, 5e-4}, Case{"llama fp32", llama, false, 2e-3},
                        Case{"llama bf16", llama, true, 5e-4}}) {
    SCOPED_TRACE(k.name);
    Config cpu = config(d, data, k.shape, 10);
    cpu.bf16 = k.bf16;
    Config gpu = cpu;
    gpu.strata.backend = Backend::Cuda;
    const TrainResult a = train(cpu, quiet());
    const TrainResult b = train(gpu, quiet());
    ASSERT_EQ(a.steps.size(), 10u);
    ASSERT_EQ(b.steps.size(), 10u);
    const double worst = expect_losses_near(b, a, k.tol);
    std::printf("%s: cuda vs cpu, worst relative loss difference over 10 steps %.2e (loss %.4f -> %.4f)\n", k.name,
                worst, b.steps.front().loss, b.steps.back().loss);
    EXPECT_LT(b.steps.back().loss, b.steps.front().loss);
  }

  auto with = [&](bool speculative) {
    Config c = config(d, data, small_shape(), 20);
    c.strata.backend = Backend::Cuda;
    c.bf16 = true;
    c.gradient_clipping = 1.85f;
    c.scheduler = parse_config(nlohmann::json::parse(
                                   R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0,
                                       "warmup_max_lr": 0.003, "warmup_num_steps": 30}}})"))
                      .scheduler;
    c.strata.speculative_optimizer = speculative;
    return c;
  };
  const TrainResult plain = train(with(false), quiet());
  const TrainResult spec = train(with(true), quiet());
  ASSERT_EQ(spec.steps.size(), 20u);
  const double worst = expect_losses_near(spec, plain, 1e-4);
  std::printf("speculative vs plain on cuda (bf16, clipping): worst relative difference %.2e; %llu commits, %llu "
              "rollbacks, %llu sub-groups on the optimizer lane\n",
              worst, static_cast<unsigned long long>(spec.stats.speculation_commits),
              static_cast<unsigned long long>(spec.stats.speculation_rollbacks),
              static_cast<unsigned long long>(spec.stats.lane_sub_groups));
  EXPECT_EQ(spec.stats.speculation_commits + spec.stats.speculation_rollbacks, 20u);
  EXPECT_GT(spec.stats.speculation_commits, 0u);
  EXPECT_GT(spec.stats.lane_sub_groups, 0u) << "stage 3 steps its speculative CPU Adam on the optimizer lane";
}

// The GPU optimizer (offload_optimizer none on cuda: the states in GPU memory, each
// sub-group stepped by one kernel running core/math/adam.hpp) against CpuAdam over pinned
// states, the same cuda model otherwise: the same losses (the kernel's bits are CpuAdam's,
// StreamAdamStep in test_cpu_adam.cpp; the model's embedding atomics may reorder sums, so
// 1e-4 relative), in stages 3 and 1, fp32 and bf16, plain and speculative with clipping,
// and a save and resume continues the run.
TEST(Train, CudaGpuOptimizerMatchesCpuAdam) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no cuda backend here: " << why;
  Dir d("cuda-gpu-optimizer");
  const std::string data = write_file(d.p / "corpus.txt", corpus(2000));
  // Parameters on the GPU and CPU Adam over pinned states, clipping: the reference of both loops.
  auto cpu_adam = [&](int stage, bool bf16, bool speculative) {
    Config c = config(d, data, small_shape(), 10);
    c.strata.backend = Backend::Cuda;
    c.zero.stage = stage;
    c.zero.offload_param.device = OffloadDevice::None;
    c.zero.offload_optimizer.device = OffloadDevice::Cpu;
    c.bf16 = bf16;
    c.gradient_clipping = 1.85f;
    c.strata.speculative_optimizer = speculative;
    return c;
  };
  for (int stage : {3, 1})
    for (bool bf16 : {false, true})
      for (bool speculative : {false, true}) {
        const std::string label = "stage " + std::to_string(stage) + (bf16 ? ", bf16" : ", fp32") +
                                  (speculative ? ", speculative" : "");
        SCOPED_TRACE(label);
        const Config cpu = cpu_adam(stage, bf16, speculative);
        Config gpu = cpu;
        gpu.zero.offload_optimizer.device = OffloadDevice::None;
        const TrainResult a = train(cpu, quiet());
        const TrainResult b = train(gpu, quiet());
        ASSERT_EQ(b.steps.size(), 10u);
        const double worst = expect_losses_near(b, a, 1e-4);
        std::printf("GPU optimizer vs CPU Adam on cuda, %s: worst relative loss difference %.2e (loss %.4f -> %.4f)\n",
                    label.c_str(), worst, b.steps.front().loss, b.steps.back().loss);
        EXPECT_LT(b.steps.back().loss, b.steps.front().loss);
        if (speculative) {
          EXPECT_GT(b.stats.speculation_commits, 0u);
        }
      }
  // offload_optimizer.ratio 0.5: the later half of the groups on the GPU, the rest with CPU
  // Adam, at the same time; plain, and speculative with clipping (stage 3: CPU Adam's share
  // on the optimizer lane while the GPU's share steps on its stream).
  for (int stage : {3, 1})
    for (bool speculative : {false, true}) {
      SCOPED_TRACE("ratio 0.5, stage " + std::to_string(stage) + (speculative ? ", speculative" : ""));
      const Config cpu = cpu_adam(stage, true, speculative);
      Config split = cpu;
      split.zero.offload_optimizer.ratio = 0.5f;
      const TrainResult a = train(cpu, quiet());
      const TrainResult b = train(split, quiet());
      ASSERT_EQ(b.steps.size(), 10u);
      const double worst = expect_losses_near(b, a, 1e-4);
      std::printf("ratio 0.5 vs CPU Adam on cuda, stage %d%s: worst relative loss difference %.2e; %llu commits, "
                  "%llu rollbacks, %llu sub-groups on the lane\n",
                  stage, speculative ? ", speculative" : "", worst,
                  static_cast<unsigned long long>(b.stats.speculation_commits),
                  static_cast<unsigned long long>(b.stats.speculation_rollbacks),
                  static_cast<unsigned long long>(b.stats.lane_sub_groups));
      if (speculative) {
        EXPECT_GT(b.stats.speculation_commits, 0u);
      }
    }
  // Save at 5 with the states on the GPU, resume to 10: the uninterrupted run's losses.
  Config c = config(d, data, small_shape(), 10);
  c.strata.backend = Backend::Cuda;
  c.zero.offload_param.device = OffloadDevice::None;
  c.zero.offload_optimizer.device = OffloadDevice::None;
  c.bf16 = true;
  expect_resume_continues(c, d.p / "ckpt", train(c, quiet()));
}

// Per-tensor gathers and tiled linears on cuda: the cuda model reads a block through its
// views (group_view.hpp), a matmul per tile, and waits for its kernels before each part
// goes back to the engine. Against the cpu backend with the same parts and settings (tiles
// of 2, a gather per tensor or tile, activation checkpoints in pinned memory): GPT-2 and
// Llama, fp32 and bf16, the tolerances of the whole-block tests above; the loss falls; and
// the run gathers more often than the cuda run with whole blocks, every part. Needs a GPU;
// it has not been run on one (docs/training.md).
TEST(Train, CudaPerTensorGathersAndTilesMatchTheCpuBackend) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no cuda backend here: " << why;
  Dir d("cuda-parts");
  const std::string data = write_file(d.p / "corpus.txt", corpus(2000));
  const nlohmann::json llama = small_llama();
  for (const Case& k : {Case{"gpt2 fp32", small_shape(), false, 2e-3}, Case{"gpt2 bf16", small_shape(), true, 5e-4},
                        Case{"llama fp32", llama, false, 2e-3}, Case{"llama bf16", llama, true, 5e-4}}) {
    SCOPED_TRACE(k.name);
    Config whole = config(d, data, k.shape, 10);
    whole.strata.backend = Backend::Cuda;
    whole.bf16 = k.bf16;
    whole.activation_checkpointing.enabled = true;
    whole.activation_checkpointing.cpu_checkpointing = true;
    Config gpu = whole;
    gpu.strata.tile_factor = 2;
    gpu.zero.stage3_prefetch_bucket_size = 1024;  // one tensor or tile per gather (d_model 32)
    gpu.zero.stage3_max_reuse_distance = 0;       // released when the model lets go
    Config cpu = gpu;
    cpu.strata.backend = Backend::Cpu;
    const TrainResult a = train(cpu, quiet());
    const TrainResult b = train(gpu, quiet());
    const TrainResult w = train(whole, quiet());
    ASSERT_EQ(b.steps.size(), 10u);
    const double worst = expect_losses_near(b, a, k.tol);
    std::printf("%s: cuda with parts vs cpu with parts, worst relative loss difference over 10 steps %.2e (loss "
                "%.4f -> %.4f); gathers %llu against %llu with whole blocks\n",
                k.name, worst, b.steps.front().loss, b.steps.back().loss,
                static_cast<unsigned long long>(b.stats.gathers), static_cast<unsigned long long>(w.stats.gathers));
    EXPECT_LT(b.steps.back().loss, b.steps.front().loss);
    EXPECT_EQ(b.stats.gathers, a.stats.gathers) << "the same parts, gathered as often as on cpu";
    EXPECT_GT(b.stats.gathers, w.stats.gathers);
    expect_losses_near(b, w, k.tol);
    const TierUsage& dev = b.stats.store.tiers[int(Tier::Device)];
    EXPECT_LE(dev.peak, dev.budget);
  }
}

// Where there is no GPU, `strata.backend: cuda` is a clear error naming the fix, before
// any data or swap file is touched.
TEST(Train, CudaWithoutAGpuIsAClearError) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "a GPU is present: CudaBackendMatchesTheCpuBackend runs instead";
  Dir d("nocuda");
  const std::string data = write_file(d.p / "corpus.txt", corpus(100));
  Config c = config(d, data, small_shape(), 2);
  c.strata.backend = Backend::Cuda;
  try {
    train(c, quiet());
    FAIL() << "trained on cuda without a GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu backend"), std::string::npos) << msg;
  }
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(d.p)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u) << "only the corpus: no swap file was created";
}

namespace {

using strata::test::error_of;

bool has(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

// A run of 20 steps saved at 10 and 20 into d/ckpt: its config, result and checkpoints.
struct SavedRun {
  Config cfg;
  TrainResult res;
  fs::path ckpt;
  SavedRun(const Dir& d, const std::string& data) : cfg(config(d, data, small_shape(), 20)), ckpt(d.p / "ckpt") {
    cfg.strata.checkpoint_every = 10;
    cfg.strata.checkpoint_dir = ckpt.string();
    res = train(cfg, quiet());
  }
};

}  // namespace

// --resume-from names a checkpoint: step-10 of a run that went on to 20, resumed into a
// new checkpoint_dir, gives steps 11-20 with that run's losses, bit for bit.
TEST(Train, ResumeFromANamedCheckpointGivesTheUninterruptedLosses) {
  Dir d("resume-from");
  const SavedRun run(d, write_file(d.p / "corpus.txt", corpus(2000)));
  ASSERT_EQ(run.res.steps.size(), 20u);
  Config c = run.cfg;
  c.strata.checkpoint_dir = (d.p / "ckpt2").string();
  TrainOptions o = quiet();
  o.resume_from = (run.ckpt / "step-00000010").string();
  const TrainResult rest = train(c, o);
  ASSERT_EQ(rest.first_step, 10);
  ASSERT_EQ(rest.steps.size(), 10u);
  for (int s = 0; s < 10; ++s) EXPECT_EQ(rest.steps[s].loss, run.res.steps[10 + s].loss) << "step " << 11 + s;
  EXPECT_TRUE(fs::exists(d.p / "ckpt2" / "step-00000020" / "manifest.json"));
  // Both flags at once is refused.
  o.resume = true;
  EXPECT_TRUE(has(error_of<ConfigError>([&] { train(c, o); }), "--resume and --resume-from"));
  // A path that is not there, or a directory that is not a checkpoint: clear errors, and
  // the saved checkpoints are untouched.
  o.resume = false;
  const auto before = snapshot(run.ckpt);
  o.resume_from = (d.p / "nowhere" / "step-00000010").string();
  EXPECT_TRUE(has(error_of<ConfigError>([&] { train(c, o); }), "is not a directory: give a step-<N> directory"));
  fs::create_directories(d.p / "empty");
  o.resume_from = (d.p / "empty").string();
  EXPECT_TRUE(has(error_of<CorruptionError>([&] { train(c, o); }), "has no manifest.json"));
  EXPECT_EQ(snapshot(run.ckpt), before);
}

// Resuming from step 10 (--resume-from, or --resume after the latest is damaged) into a
// checkpoint_dir that holds step-20 would stop at the save of step 20 ("exists
// already"), all of steps 11-20 lost: refused at start, naming step-20 and the fix, with
// no step trained and nothing touched. A fresh run into it is refused the same way.
TEST(Train, CheckpointsBeyondTheStartAreRefusedBeforeTheFirstStep) {
  Dir d("beyond");
  const SavedRun run(d, write_file(d.p / "corpus.txt", corpus(2000)));
  const auto before = snapshot(run.ckpt);
  TrainOptions o = quiet();
  o.metrics_path = (d.p / "metrics.jsonl").string();

  o.resume_from = (run.ckpt / "step-00000010").string();
  std::string msg = error_of<ConfigError>([&] { train(run.cfg, o); });
  EXPECT_TRUE(has(msg, "step-00000020") && has(msg, "beyond step 10") && has(msg, "Move it out of") &&
              has(msg, "--resume (")) << msg;

  TrainOptions fresh = quiet();
  fresh.metrics_path = o.metrics_path;
  msg = error_of<ConfigError>([&] { train(run.cfg, fresh); });
  EXPECT_TRUE(has(msg, "step-00000020, step-00000010") && has(msg, "starts from step 0") && has(msg, "--resume"))
      << msg;

  // The latest damaged: --resume falls back to step 10, and is refused there.
  write_file(run.ckpt / "step-00000020" / "manifest.json", "{ damaged");
  const auto damaged = snapshot(run.ckpt);
  TrainOptions resume = quiet();
  resume.resume = true;
  resume.metrics_path = o.metrics_path;
  msg = error_of<ConfigError>([&] { train(run.cfg, resume); });
  EXPECT_TRUE(has(msg, "step-00000020 (damaged:") && has(msg, "where this run resumes") && has(msg, "Move it out of"))
      << msg;
  EXPECT_FALSE(has(msg, "--resume (")) << "step-10 is the latest complete one already: " << msg;
  EXPECT_EQ(fs::file_size(o.metrics_path), 0u) << "a step was trained";
  EXPECT_EQ(snapshot(run.ckpt), damaged);
  EXPECT_NE(before, damaged);

  // The fix the message names: move it away, and --resume trains 11-20 as before.
  fs::rename(run.ckpt / "step-00000020", d.p / "damaged-step-20");
  const TrainResult rest = train(run.cfg, resume);
  ASSERT_EQ(rest.first_step, 10);
  ASSERT_EQ(rest.steps.size(), 10u);
  EXPECT_EQ(rest.steps.back().loss, run.res.steps.back().loss);
}

// A CorruptionError found while loading names --resume-from and the complete checkpoints
// to choose from.
TEST(Train, ACorruptCheckpointNamesTheOthersAndResumeFrom) {
  Dir d("corrupt-hint");
  const SavedRun run(d, write_file(d.p / "corpus.txt", corpus(2000)));
  {  // a flipped byte in step-20's shards: its manifest stays whole, the load finds it
    std::fstream f(run.ckpt / "step-00000020" / "rank-0.bin", std::ios::in | std::ios::out | std::ios::binary);
    char ch = 0;
    f.seekg(100);
    f.read(&ch, 1);
    ch = static_cast<char>(ch ^ 0x10);
    f.seekp(100);
    f.write(&ch, 1);
  }
  Config c = run.cfg;
  c.strata.steps = 30;
  TrainOptions resume = quiet();
  resume.resume = true;
  const std::string msg = error_of<CorruptionError>([&] { train(c, resume); });
  EXPECT_TRUE(has(msg, "is corrupt") && has(msg, "complete checkpoints in") && has(msg, ": step-00000010;") &&
              has(msg, "--resume-from " + (run.ckpt / "step-00000010").string()))
      << msg;
}

// checkpoint_dir set to a checkpoint (or a directory inside one) would nest new
// checkpoints in it and start from scratch: refused, naming the parent and --resume-from.
TEST(Train, CheckpointDirThatIsACheckpointIsRefused) {
  Dir d("ckpt-is-step");
  const SavedRun run(d, write_file(d.p / "corpus.txt", corpus(2000)));
  const auto before = snapshot(run.ckpt);
  Config c = run.cfg;
  c.strata.checkpoint_dir = (run.ckpt / "step-00000020").string();
  std::string msg = error_of<ConfigError>([&] { train(c, quiet()); });
  EXPECT_TRUE(has(msg, "is a checkpoint") && has(msg, "'" + run.ckpt.string() + "'") && has(msg, "--resume-from"))
      << msg;
  c.strata.checkpoint_dir = (run.ckpt / "step-00000020" / "more").string();
  msg = error_of<ConfigError>([&] { train(c, quiet()); });
  EXPECT_TRUE(has(msg, "inside the checkpoint")) << msg;
  EXPECT_EQ(snapshot(run.ckpt), before);
}

// A checkpoint_dir that cannot be written is an error at start-up, not at the first save.
// Under a regular file it cannot even be created (this holds for root too, which ignores
// permissions); a read-only directory (next test) is tried only when not running as root.
TEST(Train, UnwritableCheckpointDirIsRefusedAtStart) {
  Dir d("unwritable");
  const std::string data = write_file(d.p / "corpus.txt", corpus(200));
  Config c = config(d, data, small_shape(), 2);
  c.strata.checkpoint_every = 1;
  c.strata.checkpoint_dir = (d.p / "corpus.txt" / "ckpt").string();
  TrainOptions o = quiet();
  o.metrics_path = (d.p / "metrics.jsonl").string();
  std::string msg = error_of<ConfigError>([&] { train(c, o); });
  EXPECT_TRUE(has(msg, "cannot create strata.checkpoint_dir") && has(msg, "Not a directory")) << msg;
  EXPECT_EQ(fs::file_size(o.metrics_path), 0u) << "a step was trained";
}

// A trace that cannot be written was found only when the run ended (after all its work,
// with exit 0 and an error line, #16 class 8): now it is refused before the first step,
// and nothing is left at the trace's path.
TEST(Train, UnwritableTraceIsRefusedAtStart) {
  Dir d("trace");
  const std::string data = write_file(d.p / "corpus.txt", corpus(200));
  Config c = config(d, data, small_shape(), 2);
  c.strata.trace = (d.p / "no-such-dir" / "trace.json").string();
  TrainOptions o = quiet();
  o.metrics_path = (d.p / "metrics.jsonl").string();
  std::string msg = error_of<ConfigError>([&] { train(c, o); });
  EXPECT_TRUE(has(msg, "strata.trace '" + c.strata.trace + "' cannot be written (No such file or directory)")) << msg;
  EXPECT_FALSE(fs::exists(o.metrics_path) && fs::file_size(o.metrics_path) > 0) << "a step was trained";
  // A writable one is not created by the check, only by the run's end.
  c.strata.trace = (d.p / "trace.json").string();
  c.strata.steps = 1;
  train(c, quiet());
  EXPECT_TRUE(fs::exists(c.strata.trace));
}

TEST(Train, ReadOnlyCheckpointDirIsRefusedAtStart) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: a read-only directory is writable to root";
  Dir d("readonly");
  const std::string data = write_file(d.p / "corpus.txt", corpus(200));
  Config c = config(d, data, small_shape(), 2);
  c.strata.checkpoint_every = 1;
  TrainOptions o = quiet();
  o.metrics_path = (d.p / "metrics.jsonl").string();
  const fs::path ro = d.p / "readonly";
  fs::create_directories(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  c.strata.checkpoint_dir = ro.string();
  const std::string msg = error_of<ConfigError>([&] { train(c, o); });
  fs::permissions(ro, fs::perms::owner_all);
  EXPECT_TRUE(has(msg, "is not writable") && has(msg, "Permission denied")) << msg;
  EXPECT_EQ(fs::file_size(o.metrics_path), 0u) << "a step was trained";
}

// Two runs, one checkpoint_dir: while a process holds its lock (a forked child here, as
// a second `strata train` would), a run into it is refused naming the holder's pid and
// host. A holder killed with SIGKILL leaves no stale lock: the kernel released it.
TEST(Train, SecondRunIntoALockedCheckpointDirIsRefusedNamingThePid) {
  Dir d("lock");
  const std::string data = write_file(d.p / "corpus.txt", corpus(500));
  Config c = config(d, data, small_shape(), 2);
  c.strata.checkpoint_every = 2;
  c.strata.checkpoint_dir = (d.p / "ckpt").string();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    auto self = coll::make_host_communicator(coll::HostBackend::Self);
    CheckpointDirLock lock = lock_checkpoint_dir(*self, c.strata.checkpoint_dir);
    const char ok = lock.held() ? 'y' : 'n';
    if (::write(ready[1], &ok, 1) != 1) ::_exit(3);
    for (;;) ::pause();  // held until killed
  }
  ::close(ready[1]);
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(ok, 'y');
  const std::string msg = error_of<ConfigError>([&] { train(c, quiet()); });
  EXPECT_TRUE(has(msg, "checkpoint_dir " + c.strata.checkpoint_dir + " is in use by another strata train (pid " +
                           std::to_string(child) + " on host ") &&
              has(msg, "wait for it or choose another checkpoint_dir"))
      << msg;
  EXPECT_FALSE(fs::exists(fs::path(c.strata.checkpoint_dir) / "step-00000002"));

  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  const TrainResult r = train(c, quiet());
  EXPECT_EQ(r.steps.size(), 2u);
  EXPECT_TRUE(fs::exists(fs::path(c.strata.checkpoint_dir) / "step-00000002" / "manifest.json"));
}
