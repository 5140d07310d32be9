// The GPT against PyTorch (tests/model/gpt_reference.py, a CTest fixture that runs first
// and writes $STRATA_GPT_REFERENCE and the 16-bit references). The reference is float64
// torch.nn modules on the same weights and tokens; Strata computes in float32. Compared:
// logits at several positions (across the 64-row attention tile edge), the loss, every
// parameter's gradient, and the losses of 10 AdamW steps through the ZeRO engine. The
// bf16 and fp16 models are compared with references that round where
// docs/mixed-precision.md says (tolerances with the 16-bit tests below).
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

#include "gemm_cpu.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/core/device.hpp"
#include "strata/model/gpt.hpp"
#include "strata/runtime/engine/zero_engine.hpp"

namespace strata {
namespace {

struct Reference {
  GptShape shape;
  int batch = 0, steps = 0;
  DType precision = DType::F32;
  float loss_scale = 1;
  std::vector<int32_t> positions;
  std::vector<int32_t> tokens;  // [steps][batch][T+1]
  std::vector<std::vector<float>> params, grads;  // per group
  std::vector<float> logits;    // [batch][npos][V]
  double loss = 0;
  std::vector<double> losses;   // f32 only: AdamW
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, wd = 0;

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

Reference load_reference(const char* var, DType precision) {
  const char* env = std::getenv(var);
  if (!env)
    throw std::runtime_error(std::string(var) + " is not set: run through ctest, which writes it with "
                             "tests/model/gpt_reference.py first");
  const std::string path = env;
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open (written by tests/model/gpt_reference.py)");
  Reference r;
  int32_t h[11];
  read(f, h, 11, path);
  if (h[0] != 0x53475054 || (h[1] != 2 && h[1] != 3))
    throw std::runtime_error(path + ": not a version-2 or -3 GPT reference");
  r.shape = {h[2], h[3], h[4], h[5], h[6]};
  if (h[1] == 3) {  // the architecture's fields (llama_reference.py)
    int32_t arch[4];
    double theta_eps[2];
    read(f, arch, 4, path);
    read(f, theta_eps, 2, path);
    r.shape.arch = static_cast<Arch>(arch[0]);
    r.shape.kv_heads = arch[1];
    r.shape.ffn = arch[2];
    r.shape.tied_head = arch[3] != 0;
    r.shape.rope_theta = theta_eps[0];
    r.shape.norm_eps = theta_eps[1];
  }
  r.batch = h[7];
  r.steps = h[8];
  r.positions.resize(h[9]);
  const DType types[] = {DType::F32, DType::BF16, DType::F16};
  if (h[10] < 0 || h[10] > 2 || types[h[10]] != precision)
    throw std::runtime_error(path + ": not the " + to_string(precision) + " reference");
  r.precision = precision;
  read(f, &r.loss_scale, 1, path);
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
  if (precision != DType::F32) return r;
  r.losses.resize(r.steps);
  read(f, r.losses.data(), r.losses.size(), path);
  float opt[5];
  read(f, opt, 5, path);
  r.lr = opt[0], r.beta1 = opt[1], r.beta2 = opt[2], r.eps = opt[3], r.wd = opt[4];
  return r;
}

const Reference& reference() {
  static const Reference ref = load_reference("STRATA_GPT_REFERENCE", DType::F32);
  return ref;
}

// Compares next_token_logits at the reference's positions: every |diff| <= tol * (1 +
// max|logit|) at each position. Returns the worst |diff| / (1 + max|logit|).
double check_logits_with(const Reference& ref, DType precision, const char* what, double tol) {
  Gpt model(ref.shape, {1, ActivationCheckpointing::None, precision});
  HostWeights w(ref.params, precision);
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
        const double d = std::abs(static_cast<double>(out[v]) - r[v]);
        maxdiff = std::isnan(d) ? INFINITY : std::max(maxdiff, d);
      }
      EXPECT_LE(maxdiff, tol * (1 + maxref)) << what << ": sequence " << b << ", position " << pos;
      worst = std::max(worst, maxdiff / (1 + maxref));
    }
  std::printf("%s logits: worst |diff| / (1 + max|logit|) = %.3g\n", what, worst);
  return worst;
}

double check_logits(const Reference& ref, const char* what, double tol) {
  return check_logits_with(ref, ref.precision, what, tol);
}

TEST(GptNumerics, LogitsMatchPyTorch) { check_logits(reference(), "f32", 5e-6); }

// Per tensor: max|diff| <= max_tol * max|ref|, and, where norm_tol > 0, the whole
// tensor's ||diff|| <= norm_tol * ||ref|| (2-norms); the tensor is not all zeros.
void check_grads(const Reference& ref, HostWeights& w, const std::string& what, double max_tol, double norm_tol = 0) {
  double worst = 0, worst_norm = 0;
  for (const GptGroup& g : gpt_groups(ref.shape))
    for (const GptTensor& t : g.tensors) {
      const std::vector<float> group_grads = w.grads(t.group);
      const float* ours = group_grads.data() + t.offset;
      const float* theirs = ref.grads[t.group].data() + t.offset;
      double maxref = 0, maxdiff = 0, maxours = 0, ref2 = 0, diff2 = 0;
      for (uint64_t i = 0; i < t.numel(); ++i) {
        maxref = std::max(maxref, std::abs(static_cast<double>(theirs[i])));
        maxours = std::max(maxours, std::abs(static_cast<double>(ours[i])));
        const double d = std::abs(static_cast<double>(ours[i]) - theirs[i]);
        maxdiff = std::isnan(d) ? INFINITY : std::max(maxdiff, d);
        ref2 += static_cast<double>(theirs[i]) * theirs[i];
        diff2 += d * d;
      }
      ASSERT_GT(maxref, 0.0) << t.name << ": the reference gradient is all zeros; the test would prove nothing";
      EXPECT_GT(maxours, 0.0) << what << ": " << t.name << " gradient is all zeros";
      EXPECT_LE(maxdiff, max_tol * maxref) << what << ": " << t.name << " max|diff| " << maxdiff << ", max|ref| "
                                           << maxref;
      const double norm = std::sqrt(diff2 / ref2);
      if (norm_tol > 0) {
        EXPECT_LE(norm, norm_tol) << what << ": " << t.name << " ||diff|| / ||ref|| " << norm;
      }
      worst = std::max(worst, maxdiff / maxref);
      worst_norm = std::max(worst_norm, norm);
    }
  std::printf("%s gradients: worst max|diff| / max|ref| over tensors = %.3g, worst ||diff|| / ||ref|| = %.3g\n",
              what.c_str(), worst, worst_norm);
}

void check_loss_and_grads(const Reference& ref) {
  std::vector<int32_t> x, y;
  ref.inputs(0, x, y);
  for (auto ck : {ActivationCheckpointing::None, ActivationCheckpointing::PerBlock}) {
    Gpt model(ref.shape, {ref.batch, ck});
    HostWeights w(ref.params);
    const double loss = model.forward_backward(w, x.data(), y.data());
    const char* what = ck == ActivationCheckpointing::None ? "stored activations" : "recomputed activations";
    EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss) << what;
    std::printf("%s: loss %.8f, torch %.8f\n", what, loss, ref.loss);
    check_grads(ref, w, what, 1e-5);
    // Evaluation gives the same loss as training's forward.
    EXPECT_NEAR(model.forward_loss(w, x.data(), y.data()), loss, 1e-6 * loss);
  }
}

TEST(GptNumerics, LossAndEveryGradientMatchPyTorch) { check_loss_and_grads(reference()); }

void check_adamw_steps(const Reference& ref) {
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

TEST(GptNumerics, TenAdamWStepsThroughTheEngineMatchPyTorch) { check_adamw_steps(reference()); }

// ---- Llama: against Hugging Face's LlamaForCausalLM equations (tests/model/llama_reference.py,
// which also checks them against transformers' own model where it imports) ----
//
// Grouped-query attention (4 heads, 2 kv heads), rope_theta 500000, rms_norm_eps 1e-6, an
// untied head (and a tied one), seq_len 80 across the 64-row attention tile. The same
// tolerances as GPT-2's, for the same reason (fp32 rounding through two blocks); measured
// against the float64 reference (untied, tied): logits 2.9e-7, 4.6e-7; loss 5e-9, 7e-9
// relative; gradients 1.4e-6, 1.0e-6 (max over tensors of max|diff| / max|ref|); AdamW
// losses 1.6e-8, 8.7e-8.
const Reference& llama_reference(bool tied) {
  static const Reference untied = load_reference("STRATA_LLAMA_REFERENCE", DType::F32);
  static const Reference tied_ref = load_reference("STRATA_LLAMA_REFERENCE_TIED", DType::F32);
  return tied ? tied_ref : untied;
}

TEST(LlamaNumerics, TheReferenceIsLlamaWithGqaAnUntiedHeadAndRopeTheta) {
  const GptShape& s = llama_reference(false).shape;
  EXPECT_TRUE(s.llama());
  EXPECT_LT(s.kv(), s.heads);
  EXPECT_FALSE(s.tied());
  EXPECT_NE(s.rope_theta, GptShape{}.rope_theta);
  EXPECT_TRUE(llama_reference(true).shape.tied());
}

TEST(LlamaNumerics, LogitsMatchPyTorch) {
  check_logits(llama_reference(false), "llama f32", 5e-6);
  check_logits(llama_reference(true), "llama f32 tied", 5e-6);
}

TEST(LlamaNumerics, LossAndEveryGradientMatchPyTorch) {
  check_loss_and_grads(llama_reference(false));
  check_loss_and_grads(llama_reference(true));
}

TEST(LlamaNumerics, TenAdamWStepsThroughTheEngineMatchPyTorch) {
  check_adamw_steps(llama_reference(false));
  check_adamw_steps(llama_reference(true));
}

// CTest runs the bf16 tests again with each matmul path forced (STRATA_CPU_GEMM_BF16,
// gemm_cpu.hpp); oneDNN's exists only on a CPU with bf16 instructions.
// Why this process cannot run: the path forced does not exist here (empty when it can).
// Where a path is forced and exists, it is the one the model takes.
std::string forced_path_missing() {
  const char* forced = std::getenv("STRATA_CPU_GEMM_BF16");
  if (!forced) return {};
  const std::string path = forced;
  std::string why;
  if (path == "onednn" && detail::gemm16_native_impl(DType::BF16, &why).empty())
    return "STRATA_CPU_GEMM_BF16=onednn, and oneDNN has no bf16 matmul here: " + why;
  if (path == "onednn" || path == "sgemm")
    EXPECT_EQ(detail::gemm16_choice(DType::BF16).native, path == "onednn") << "STRATA_CPU_GEMM_BF16=" << path;
  return {};
}

// The bf16 Llama against the float64 reference: no rounding reference is written for
// Llama, so this holds the 16-bit path to what bf16 storage of weights and activations
// costs (a few u), which a wrong rounding point (an fp32 value read as bf16 bits, a
// missing conversion) exceeds by orders of magnitude. Measured: logits 0.0071 (bf16's u
// is 0.0039), gradients 0.021 (max|diff| / max|ref| over tensors).
TEST(LlamaNumerics, Bf16FollowsTheReferenceWithinBf16Rounding) {
  if (const std::string why = forced_path_missing(); !why.empty()) GTEST_SKIP() << why;
  const Reference& ref = llama_reference(false);
  check_logits_with(ref, DType::BF16, "llama bf16", 0.02);
  std::vector<int32_t> x, y;
  ref.inputs(0, x, y);
  Gpt model(ref.shape, {ref.batch, ActivationCheckpointing::PerBlock, DType::BF16});
  HostWeights w(ref.params, DType::BF16);
  const double loss = model.forward_backward(w, x.data(), y.data());
  EXPECT_NEAR(loss, ref.loss, 2e-3 * ref.loss);
  check_grads(ref, w, "llama bf16", 0.08);
}

// ---- 16 bits: against references that round where docs/mixed-precision.md says ----
//
// Tolerances are in units of the type's unit roundoff u (2^-8 bf16, 2^-11 fp16). Strata
// sums in fp32 and the reference in float64, so now and then a value lands on the other
// side of a rounding boundary (most often among attention's many probabilities); a
// flipped last bit changes what later roundings see, and the flips cascade through the
// model. The reference computed in float32 instead of float64 (same rounding points)
// differs from itself by as much: that spread, not fp32 error, is what the model can be
// held to. Measured, Strata (and the float32 reference) against the float64 reference:
//                              bf16                  fp16
//  logits |diff|/(1+max|z|)    0.49u (0.64u)         0.70u (1.29u)
//  loss, relative              0.003u (0.0009u)      0.0014u (0.0036u)
//  gradient max|diff|/max|ref| 1.9u (1.9u)           1.5u (1.6u)      per tensor
//  gradient ||diff||/||ref||   0.95u (0.84u)         1.2u (1.25u)     per tensor
//  ln_f.bias ||diff||/||ref||  0.095u (0.027u)       0.43u (0.44u)
// ln_f.bias is the first gradient backward computes (column sums of round(dlogits) wte):
// in bf16 few flips reach it, and perturbing the reference moves it 0.26-0.79u (dY not
// rounded before the matmuls, the gradients not rounded once at the end, the
// activations not rounded, fc rounded), so its bf16 tolerance catches a rounding point
// in the wrong place. fp16's finer grid flips 8x as often, and it is held to the spread
// (0.48u in the Debug sanitizer build, whose fp32 sums run in another order).

struct Tolerances16 {
  double logits;     // |diff| / (1 + max|logit|), at every position
  double loss;       // relative
  double grad_max;   // max|diff| / max|ref|, per tensor
  double grad_norm;  // ||diff|| / ||ref||, per tensor
  double head_norm;  // ||diff|| / ||ref|| of ln_f.bias
};
constexpr Tolerances16 kBf16Tolerances{1.5, 0.02, 4, 2, 0.2};  // in units of u
constexpr Tolerances16 kFp16Tolerances{3, 0.02, 4, 2.5, 1};

void check_16bit(const Reference& ref, const Tolerances16& tol) {
  const double u = ref.precision == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const std::string type = to_string(ref.precision);
  check_logits(ref, type.c_str(), tol.logits * u);
  std::vector<int32_t> x, y;
  ref.inputs(0, x, y);
  const GptTensor lnf_b = gpt_groups(ref.shape).back().tensors.at(1);
  ASSERT_EQ(lnf_b.name, "ln_f.bias");
  for (auto ck : {ActivationCheckpointing::None, ActivationCheckpointing::PerBlock}) {
    Gpt model(ref.shape, {ref.batch, ck, ref.precision});
    HostWeights w(ref.params, ref.precision);
    const double loss = model.forward_backward(w, x.data(), y.data(), ref.loss_scale);
    const std::string what =
        type + (ck == ActivationCheckpointing::None ? ", stored activations" : ", recomputed activations");
    EXPECT_NEAR(loss, ref.loss, tol.loss * u * ref.loss) << what;
    std::printf("%s: loss %.8f, torch %.8f (relative %.3g u)\n", what.c_str(), loss, ref.loss,
                std::abs(loss - ref.loss) / ref.loss / u);
    check_grads(ref, w, what, tol.grad_max * u, tol.grad_norm * u);
    const std::vector<float> ours = w.grads(lnf_b.group);
    double diff2 = 0, ref2 = 0;
    for (uint64_t i = lnf_b.offset; i < lnf_b.offset + lnf_b.numel(); ++i) {
      const double r = ref.grads[lnf_b.group][i];
      diff2 += (ours[i] - r) * (ours[i] - r);
      ref2 += r * r;
    }
    EXPECT_LE(std::sqrt(diff2 / ref2), tol.head_norm * u) << what << ": ln_f.bias";
    std::printf("%s: ln_f.bias ||diff|| / ||ref|| = %.3g u\n", what.c_str(), std::sqrt(diff2 / ref2) / u);
    EXPECT_NEAR(model.forward_loss(w, x.data(), y.data()), loss, 1e-6 * loss);
  }
}

TEST(GptNumerics, Bf16LogitsLossAndEveryGradientMatchTheRoundingReference) {
  if (const std::string why = forced_path_missing(); !why.empty()) GTEST_SKIP() << why;
  check_16bit(load_reference("STRATA_GPT_REFERENCE_BF16", DType::BF16), kBf16Tolerances);
}

// fp16 with loss scaling (the reference's gradients are of loss x 1024). On a CPU without
// fp16 matmul instructions this is the converting path (model/src/gemm_cpu.hpp).
TEST(GptNumerics, Fp16WithALossScaleMatchesTheRoundingReference) {
  check_16bit(load_reference("STRATA_GPT_REFERENCE_FP16", DType::F16), kFp16Tolerances);
}

TEST(GptNumerics, ABf16ModelRefusesAnF32WeightSource) {
  const Reference& ref = reference();
  Gpt model(ref.shape, {ref.batch, ActivationCheckpointing::None, DType::BF16});
  HostWeights w(ref.params);
  std::vector<int32_t> x, y;
  ref.inputs(0, x, y);
  try {
    model.forward_backward(w, x.data(), y.data());
    FAIL() << "a bf16 model ran over fp32 weights";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("built for bfloat16"), std::string::npos) << msg;
    EXPECT_NE(msg.find("holds float"), std::string::npos) << msg;
  }
  std::vector<float> logits(ref.shape.vocab);
  EXPECT_THROW(model.next_token_logits(w, x.data(), 1, logits.data()), Error);
}

}  // namespace
}  // namespace strata
