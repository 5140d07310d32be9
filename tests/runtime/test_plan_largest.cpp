// `strata plan --largest` (plan.hpp: largest_fit): the answer fits and the next rung does
// not, each checked against make_plan on its own; a ladder whose every rung fits is a
// bound; one whose first rung does not fit has no answer; bad ladders are refused with
// the flag and the valid range.
#include <gtest/gtest.h>

#include <string>

#include "strata/core/error.hpp"
#include "strata/runtime/plan/plan.hpp"

using namespace strata;
using namespace strata::plan;

namespace {

Strategy offload_bf16(OffloadDevice param, OffloadDevice opt) {
  Strategy st;
  st.stage = 3;
  st.offload_param = param;
  st.offload_optimizer = opt;
  st.precision = DType::BF16;
  st.micro_batch = 1;
  st.checkpointing = true;
  return st;
}

// The invariant: the answer's plan fits, the next rung's does not, both as make_plan says
// for that shape alone, and the answer is the probed rung with the most layers that fits.
void expect_largest(const GptShape& width, const ClusterSpec& c, const Strategy& st, int step) {
  const LargestFit f = largest_fit(width, c, st, step);
  ASSERT_GE(f.largest, 0) << "nothing fits";
  ASSERT_GE(f.next, 0) << "every rung fits up to " << f.max_layers;
  const LadderRung& ans = f.probed[f.largest];
  const LadderRung& next = f.probed[f.next];
  EXPECT_EQ(next.rung, ans.rung + 1);
  EXPECT_EQ(ans.shape.layers, ans.rung * step);
  GptShape s = width;
  s.layers = ans.shape.layers;
  const Plan fits = make_plan(s, c, st);
  EXPECT_TRUE(fits.fits) << fits.problems.front();
  EXPECT_EQ(fits.params, ans.params);
  s.layers += step;
  const Plan over = make_plan(s, c, st);
  EXPECT_FALSE(over.fits);
  EXPECT_GT(over.params, fits.params);
  EXPECT_FALSE(next.binding.empty());
  // The binding tier of the answer is named with its share of the budget.
  EXPECT_NE(ans.binding.find('%'), std::string::npos) << ans.binding;
  // Every other probed rung agrees with the answer: below it fits, above it does not.
  for (const LadderRung& r : f.probed) EXPECT_EQ(r.fits, r.rung <= ans.rung) << "rung " << r.rung;
  // Everything on the width is kept but the depth.
  EXPECT_EQ(ans.shape.d_model, width.d_model);
  EXPECT_EQ(ans.shape.arch, width.arch);
  EXPECT_EQ(ans.shape.ffn, width.ffn);
}

}  // namespace

TEST(PlanLargest, H200PresetIsTheLentMachine) {
  const ClusterSpec c = find_cluster_preset("h200-1");
  EXPECT_EQ(c.world(), 1);
  EXPECT_DOUBLE_EQ(c.hbm, 139.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(c.host_ram, 128.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(c.nvme_capacity, 64.0 * (1 << 30));
  validate(c);
}

TEST(PlanLargest, GptOnNvmeFitsAndNextRungDoesNot) {
  GptShape w = find_model_preset("gpt-6.7b").shape;
  w.seq_len = 1024;
  expect_largest(w, find_cluster_preset("h200-1"), offload_bf16(OffloadDevice::Nvme, OffloadDevice::Nvme), 4);
}

TEST(PlanLargest, LlamaInPinnedMemoryFitsAndNextRungDoesNot) {
  GptShape w = find_model_preset("llama2-7b").shape;
  w.seq_len = 1024;
  expect_largest(w, find_cluster_preset("h200-1"), offload_bf16(OffloadDevice::Cpu, OffloadDevice::Cpu), 1);
}

TEST(PlanLargest, MoreRoomFitsMoreLayers) {
  GptShape w = find_model_preset("gpt-6.7b").shape;
  w.seq_len = 1024;
  const Strategy st = offload_bf16(OffloadDevice::Nvme, OffloadDevice::Nvme);
  ClusterSpec c = find_cluster_preset("h200-1");
  const LargestFit small = largest_fit(w, c, st, 2);
  c.nvme_capacity *= 2;
  c.host_ram *= 2;
  const LargestFit big = largest_fit(w, c, st, 2);
  ASSERT_GE(small.largest, 0);
  ASSERT_GE(big.largest, 0);
  EXPECT_GT(big.probed[big.largest].params, small.probed[small.largest].params);
}

TEST(PlanLargest, EveryRungFittingIsABound) {
  const GptShape w = find_model_preset("gpt-125m").shape;
  const LargestFit f =
      largest_fit(w, find_cluster_preset("h200-1"), offload_bf16(OffloadDevice::None, OffloadDevice::Cpu), 2, 8);
  ASSERT_GE(f.largest, 0);
  EXPECT_TRUE(f.bounded());
  EXPECT_EQ(f.probed[f.largest].shape.layers, 8);
}

TEST(PlanLargest, NothingFitsHasNoAnswer) {
  ClusterSpec c = find_cluster_preset("h200-1");
  c.host_ram = 1 << 30;
  c.nvme_capacity = 0;
  const LargestFit f =
      largest_fit(find_model_preset("gpt-175b").shape, c, offload_bf16(OffloadDevice::Cpu, OffloadDevice::Cpu), 8);
  EXPECT_EQ(f.largest, -1);
  ASSERT_EQ(f.probed.size(), 1u);
  EXPECT_FALSE(f.probed.front().fits);
  EXPECT_NE(f.probed.front().binding.find("short by"), std::string::npos) << f.probed.front().binding;
}

TEST(PlanLargest, BadLaddersAreRefused) {
  const GptShape w = find_model_preset("gpt-125m").shape;
  const ClusterSpec c = find_cluster_preset("h200-1");
  const Strategy st = offload_bf16(OffloadDevice::Cpu, OffloadDevice::Cpu);
  auto message = [&](int step, int max) {
    try {
      largest_fit(w, c, st, step, max);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(0, 100).find("--layer-step is 0: give 1 or more layers"), std::string::npos);
  EXPECT_NE(message(4, 2).find("--max-layers is 2: give from --layer-step (4) to 16384"), std::string::npos);
  EXPECT_NE(message(1, 20000).find("--max-layers is 20000"), std::string::npos);
}
