// The GPT against PyTorch (tests/model/gpt_reference.py, a CTest fixture that runs first
// and writes $STRATA_GPT_REFERENCE). The reference is float64 torch.nn modules on the
// same weights and tokens; Strata computes in float32. Compared: logits at several
// positions (across the 64-row attention tile edge), the loss, every parameter's
// gradient, and the losses of 10 AdamW steps through the ZeRO engine.
//
// Tolerances, each about float32 rounding over this model's depth:
//  - logits: |diff| <= 5e-6 * (1 + max|logit|): fp32 dot products of length <= 4d with
//    inputs of order 1 carry ~1e-7 relative error per layer (measured: 3.4e-7).
//  - loss: relative 1e-5.
//  - gradients, per tensor: max|diff| <= 1e-5 * max|ref| (gradient entries near zero
//    lose relative precision, so scale by the tensor's largest entry; measured: 5.4e-7)
//    and the tensor is not all zeros when the reference is not.
//  - 10 AdamW steps: relative 1e-6 per loss (measured: 1.3e-8). Adam's update divides by
//    sqrt(v) + eps and so amplifies tiny gradient differences in near-zero entries; the
//    margin is for that.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/core/device.hpp"
#include "strata/model/gpt.hpp"
#include "strata/runtime/zero_engine.hpp"

namespace strata {
namespace {

struct Reference {
  GptShape shape;
  int batch = 0, steps = 0;
  std::vector<int32_t> positions;
  std::vector<int32_t> tokens;  // [steps][batch][T+1]
  std::vector<std::vector<float>> params, grads;  // per group
  std::vector<float> logits;    // [batch][npos][V]
  double loss = 0;
  std::vector<double> losses;
  float lr, beta1, beta2, eps, wd;

  void inputs(int step, std::vector<int32_t>& x, std::vector<int32_t>& y) const {
    const int T = shape.seq_len;
    x.resize(static_cast<size_t>(batch) * T);
    y.resize(x.size());
    for (int b = 0; b < batch; ++b)
      for (int t = 0; t < T; ++t) {
        const int32_t* row = tokens.data() + (static_cast<size_t>(step) * batch + b) * (T + 1);
        x[b * T + t] = row[t];
        y[b * T + t] = row[t + 1];
      }
  }
};

template <class T>
void read(std::ifstream& f, T* p, size_t n, const std::string& path) {
  f.read(reinterpret_cast<char*>(p), static_cast<std::streamsize>(n * sizeof(T)));
  if (!f) throw std::runtime_error(path + ": truncated reference file");
}

const Reference& reference() {
  static const Reference ref = [] {
    const char* env = std::getenv("STRATA_GPT_REFERENCE");
    if (!env)
      throw std::runtime_error("STRATA_GPT_REFERENCE is not set: run through ctest, which writes it with "
                               "tests/model/gpt_reference.py first");
    const std::string path = env;
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error(path + ": cannot open (written by tests/model/gpt_reference.py)");
    Reference r;
    int32_t h[10];
    read(f, h, 10, path);
    if (h[0] != 0x53475054 || h[1] != 1) throw std::runtime_error(path + ": not a version-1 GPT reference");
    r.shape = {h[2], h[3], h[4], h[5], h[6]};
    r.batch = h[7];
    r.steps = h[8];
    r.positions.resize(h[9]);
    read(f, r.positions.data(), r.positions.size(), path);
    r.tokens.resize(static_cast<size_t>(r.steps) * r.batch * (r.shape.seq_len + 1));
    read(f, r.tokens.data(), r.tokens.size(), path);
    for (const GptGroup& g : gpt_groups(r.shape)) {
      r.params.emplace_back(g.numel);
      read(f, r.params.back().data(), g.numel, path);
    }
    r.logits.resize(static_cast<size_t>(r.batch) * r.positions.size() * r.shape.vocab);
    read(f, r.logits.data(), r.logits.size(), path);
    read(f, &r.loss, 1, path);
    for (const GptGroup& g : gpt_groups(r.shape)) {
      r.grads.emplace_back(g.numel);
      read(f, r.grads.back().data(), g.numel, path);
    }
    r.losses.resize(r.steps);
    read(f, r.losses.data(), r.losses.size(), path);
    float opt[5];
    read(f, opt, 5, path);
    r.lr = opt[0], r.beta1 = opt[1], r.beta2 = opt[2], r.eps = opt[3], r.wd = opt[4];
    return r;
  }();
  return ref;
}

TEST(GptNumerics, LogitsMatchPyTorch) {
  const Reference& ref = reference();
  Gpt model(ref.shape, {1, ActivationCheckpointing::None});
  HostWeights w(ref.params);
  std::vector<int32_t> x, y;
  ref.inputs(0, x, y);
  const int V = ref.shape.vocab, T = ref.shape.seq_len;
  std::vector<float> out(V);
  double worst = 0;
  for (int b = 0; b < ref.batch; ++b)
    for (size_t p = 0; p < ref.positions.size(); ++p) {
      const int pos = ref.positions[p];
      model.next_token_logits(w, x.data() + b * T, pos + 1, out.data());
      const float* r = ref.logits.data() + (static_cast<size_t>(b) * ref.positions.size() + p) * V;
      double maxref = 0, maxdiff = 0;
      for (int v = 0; v < V; ++v) {
        maxref = std::max(maxref, std::abs(static_cast<double>(r[v])));
        maxdiff = std::max(maxdiff, std::abs(static_cast<double>(out[v]) - r[v]));
      }
      EXPECT_LE(maxdiff, 5e-6 * (1 + maxref)) << "sequence " << b << ", position " << pos;
      worst = std::max(worst, maxdiff / (1 + maxref));
    }
  std::printf("logits: worst |diff| / (1 + max|logit|) = %.3g\n", worst);
}

void check_grads(const Reference& ref, HostWeights& w, const char* what) {
  double worst = 0;
  for (const GptGroup& g : gpt_groups(ref.shape))
    for (const GptTensor& t : g.tensors) {
      const std::vector<float> group_grads = w.grads(t.group);
      const float* ours = group_grads.data() + t.offset;
      const float* theirs = ref.grads[t.group].data() + t.offset;
      double maxref = 0, maxdiff = 0, maxours = 0;
      for (uint64_t i = 0; i < t.numel(); ++i) {
        maxref = std::max(maxref, std::abs(static_cast<double>(theirs[i])));
        maxours = std::max(maxours, std::abs(static_cast<double>(ours[i])));
        const double d = std::abs(static_cast<double>(ours[i]) - theirs[i]);
        maxdiff = std::isnan(d) ? INFINITY : std::max(maxdiff, d);
      }
      ASSERT_GT(maxref, 0.0) << t.name << ": the reference gradient is all zeros; the test would prove nothing";
      EXPECT_GT(maxours, 0.0) << what << ": " << t.name << " gradient is all zeros";
      EXPECT_LE(maxdiff, 1e-5 * maxref) << what << ": " << t.name << " max|diff| " << maxdiff << ", max|ref| " << maxref;
      worst = std::max(worst, maxdiff / maxref);
    }
  std::printf("%s gradients: worst max|diff| / max|ref| over tensors = %.3g\n", what, worst);
}

TEST(GptNumerics, LossAndEveryGradientMatchPyTorch) {
  const Reference& ref = reference();
  std::vector<int32_t> x, y;
  ref.inputs(0, x, y);
  for (auto ck : {ActivationCheckpointing::None, ActivationCheckpointing::PerBlock}) {
    Gpt model(ref.shape, {ref.batch, ck});
    HostWeights w(ref.params);
    const double loss = model.forward_backward(w, x.data(), y.data());
    const char* what = ck == ActivationCheckpointing::None ? "stored activations" : "recomputed activations";
    EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss) << what;
    std::printf("%s: loss %.8f, torch %.8f\n", what, loss, ref.loss);
    check_grads(ref, w, what);
    // Evaluation gives the same loss as training's forward.
    EXPECT_NEAR(model.forward_loss(w, x.data(), y.data()), loss, 1e-6 * loss);
  }
}

TEST(GptNumerics, TenAdamWStepsThroughTheEngineMatchPyTorch) {
  const Reference& ref = reference();
  auto device = make_device({});
  auto comm = coll::make_host_communicator(coll::HostBackend::Self);
  EngineOptions o;
  o.stage = 3;
  o.optimizer = {OptimizerKind::AdamW, ref.lr, ref.beta1, ref.beta2, ref.eps, ref.wd};
  o.optimizer_threads = 1;
  o.store.device_budget = 64 << 20;
  o.store.pinned_budget = 64 << 20;
  std::vector<GroupSpec> specs;
  for (const GptGroup& g : gpt_groups(ref.shape)) specs.push_back({g.name, g.numel, InitKind::Zeros, 0, {}});
  ZeroEngine engine(*device, *comm, *comm, o, specs);
  engine.set_schedule(gpt_schedule(ref.shape));
  for (int g = 0; g < engine.num_groups(); ++g) {
    std::vector<float> master(engine.shard_numel(g), 0.0f), zeros(master.size(), 0.0f);
    std::copy(ref.params[g].begin(), ref.params[g].end(), master.begin());
    engine.write_optimizer_shard(g, master.data(), zeros.data(), zeros.data(), 0);
  }
  Gpt model(ref.shape, {ref.batch, ActivationCheckpointing::None});
  std::vector<int32_t> x, y;
  double worst = 0;
  for (int s = 0; s < ref.steps; ++s) {
    ref.inputs(s, x, y);
    engine.begin_micro_step();
    const double loss = model.forward_backward(engine, x.data(), y.data());
    ASSERT_TRUE(engine.step());
    EXPECT_NEAR(loss, ref.losses[s], 1e-6 * ref.losses[s]) << "step " << s;
    worst = std::max(worst, std::abs(loss - ref.losses[s]) / ref.losses[s]);
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  std::printf("AdamW: worst relative loss difference over %d steps = %.3g\n", ref.steps, worst);
}

}  // namespace
}  // namespace strata
