// LoRA in the cpu GPT (GptShape::lora): the adapters' gradients from forward_backward
// against central differences of forward_loss, for Llama (q, v, o and down: row ranges
// of the fused q/k/v matmul and whole linears) and GPT-2 (c_attn, c_proj, c_fc), with two
// blocks so that the second block's adapters' share of dx reaches the first's gradients.
// The base is frozen: the model must ask for no gradient buffer of it (HostWeights makes
// one only when asked). peft itself is the reference in
// tests/runtime/test_lora_peft.py; this checks the math alone, on every adapted linear.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "strata/model/gpt.hpp"
#include "strata/model/gpt_layout.hpp"

namespace strata {
namespace {

void check_adapter_gradients(const GptShape& s) {
  const std::vector<GptGroup> groups = gpt_groups(s);
  ASSERT_EQ(groups.size(), static_cast<size_t>(2 * s.layers + 2));
  std::mt19937 rng(7);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<std::vector<float>> w;
  for (const GptGroup& g : groups) {
    std::vector<float> v(g.numel);
    for (const GptTensor& t : g.tensors)
      for (uint64_t i = 0; i < t.numel(); ++i)
        v[t.offset + i] = t.init == GptInit::Ones ? 1.0f + 0.1f * n01(rng) : 0.2f * n01(rng);  // B != 0
    w.push_back(std::move(v));
  }
  const GptOptions o{2};
  Gpt model(s, o);
  std::vector<int32_t> x(2 * s.seq_len), y(x.size());
  std::uniform_int_distribution<int> tok(0, s.vocab - 1);
  for (auto& t : x) t = tok(rng);
  for (auto& t : y) t = tok(rng);

  HostWeights hw(w);
  model.forward_backward(hw, x.data(), y.data());
  for (int g = 0; g <= gpt_final_group(s); ++g)  // frozen: its gradient buffer is never asked for
    EXPECT_TRUE(hw.grads(g).empty()) << "the model asked for the frozen group " << g << "'s gradient";

  // Central differences in fp32: the loss (about 3.5) carries ~3e-7 relative rounding, so
  // a step of 1e-2 resolves gradients to ~1e-4; 3% plus that covers the curvature.
  const float h = 1e-2f;
  double largest = 0;
  int checked = 0;
  for (int l = 0; l < s.layers; ++l) {
    const int g = gpt_lora_group(s, l);
    const std::vector<float> grad = hw.grads(g);
    for (const GptTensor& t : groups[static_cast<size_t>(g)].tensors)
      for (int k = 0; k < 6; ++k) {
        const uint64_t i = t.offset + static_cast<uint64_t>(k) * 7919 % t.numel();
        auto loss_at = [&](float delta) {
          std::vector<std::vector<float>> p = w;
          p[static_cast<size_t>(g)][i] += delta;
          HostWeights pw(p);
          return model.forward_loss(pw, x.data(), y.data());
        };
        const double fd = (loss_at(h) - loss_at(-h)) / (2.0 * h);
        EXPECT_NEAR(grad[i], fd, 2e-4 + 0.03 * std::fabs(fd)) << t.name << " element " << i - t.offset;
        largest = std::max(largest, std::fabs(fd));
        ++checked;
      }
  }
  EXPECT_GT(checked, 0);
  EXPECT_GT(largest, 1e-3) << "every adapter gradient checked is ~0: the test cannot tell";
}

TEST(LoraCpu, LlamaAdapterGradientsMatchFiniteDifferences) {
  GptShape s;
  s.arch = Arch::Llama;
  s.layers = 2;
  s.d_model = 16;
  s.heads = 4;
  s.kv_heads = 2;
  s.ffn = 24;
  s.seq_len = 8;
  s.vocab = 32;
  s.lora = {2, 4.0, (1u << 0) | (1u << 2) | (1u << 3) | (1u << 6)};  // q, v, o, down
  check_adapter_gradients(s);
}

TEST(LoraCpu, Gpt2AdapterGradientsMatchFiniteDifferences) {
  GptShape s;
  s.layers = 2;
  s.d_model = 16;
  s.heads = 2;
  s.seq_len = 8;
  s.vocab = 32;
  s.lora = {3, 3.0, 0b111};  // c_attn, c_proj (both), c_fc
  check_adapter_gradients(s);
}

TEST(LoraCpu, ZeroBIsTheBaseModel) {
  GptShape s;
  s.layers = 1;
  s.d_model = 16;
  s.heads = 2;
  s.seq_len = 8;
  s.vocab = 32;
  GptShape with = s;
  with.lora = {2, 16.0, 0b111};
  std::mt19937 rng(3);
  std::normal_distribution<float> n01(0.0f, 0.2f);
  std::vector<std::vector<float>> base, lora;
  for (const GptGroup& g : gpt_groups(with)) {
    std::vector<float> v(g.numel);
    for (const GptTensor& t : g.tensors)
      for (uint64_t i = 0; i < t.numel(); ++i)
        v[t.offset + i] = t.init == GptInit::Zeros && t.name.find("lora_B") != std::string::npos ? 0.0f : n01(rng);
    if (g.name.rfind("lora.", 0) != 0) base.push_back(v);
    lora.push_back(std::move(v));
  }
  std::vector<int32_t> x(s.seq_len), y(s.seq_len);
  for (int i = 0; i < s.seq_len; ++i) x[i] = i, y[i] = (i * 5) % s.vocab;
  Gpt a(s, GptOptions{1}), b(with, GptOptions{1});
  HostWeights wa(base), wb(lora);
  EXPECT_EQ(a.forward_loss(wa, x.data(), y.data()), b.forward_loss(wb, x.data(), y.data()));
}

}  // namespace
}  // namespace strata
