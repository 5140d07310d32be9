// Helpers for the C API tests: configurations, a toy model driven through the C API,
// and a reference AdamW to check it against.
//
// The toy model: group g's loss is 0.5 * sum_i (w_i - t_i)^2 * s, so its gradient is
// (w - t) * s, computed from the parameters strata_acquire hands out. It depends only on
// that group's own parameters, so any acquire order gives the same results, and a
// reference AdamW over plain vectors predicts every value.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "strata/strata.h"

namespace capi_test {

#define EXPECT_STRATA_OK(call) EXPECT_EQ((call), STRATA_OK) << strata_last_error()
#define ASSERT_STRATA_OK(call) ASSERT_EQ((call), STRATA_OK) << strata_last_error()
// A call that must fail with `status` and a message containing `text`.
#define EXPECT_STRATA_FAILS(call, status, text)                                                          \
  do {                                                                                                   \
    strata_status s_ = (call);                                                                           \
    EXPECT_EQ(s_, status) << #call << " gave " << strata_status_name(s_) << ": " << strata_last_error(); \
    EXPECT_NE(std::string(strata_last_error()).find(text), std::string::npos)                           \
        << #call << ": message '" << strata_last_error() << "' lacks '" << text << "'";                 \
  } while (0)

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> n{0};
    path = std::filesystem::temp_directory_path() /
           ("strata-capi-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

struct ConfigSpec {
  int stage = 3;
  int accum = 1;
  std::string offload = "none";  // for both params (stage 3) and optimizer: none, cpu, nvme
  std::string nvme_dir;
  double lr = 0.01, weight_decay = 0.01;
  double clip = 0.0;
  std::string extra;  // more top-level members, e.g. "\"bf16\": {\"enabled\": true}"
  int hpz = 1;        // zero_optimization.zero_hpz_partition_size (1: absent)
};

inline std::string config_json(const ConfigSpec& c) {
  std::string off;
  auto section = [&](const char* key) {
    std::string s = std::string("\"") + key + "\": {\"device\": \"" + c.offload + "\"";
    if (c.offload == "nvme") s += ", \"nvme_path\": \"" + c.nvme_dir + "\"";
    return s + "}";
  };
  off = ", " + section("offload_optimizer");
  if (c.stage == 3) off += ", " + section("offload_param");
  return "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": " + std::to_string(c.accum) +
         ", \"gradient_clipping\": " + std::to_string(c.clip) + (c.extra.empty() ? "" : ", " + c.extra) +
         ", \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": " + std::to_string(c.lr) +
         ", \"weight_decay\": " + std::to_string(c.weight_decay) + "}}" +
         ", \"zero_optimization\": {\"stage\": " + std::to_string(c.stage) +
         (c.stage == 3 ? ", \"stage3_param_persistence_threshold\": 0" : "") +
         (c.hpz > 1 ? ", \"zero_hpz_partition_size\": " + std::to_string(c.hpz) : std::string()) + off + "}" +
         ", \"strata\": {\"backend\": \"cpu\", \"device_budget\": \"16MiB\", \"pinned_budget\": \"16MiB\", "
         "\"checksums\": true}}";
}

// Group g of the toy model: shape and initial values.
struct ToyGroup {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};

inline std::vector<ToyGroup> toy_groups(int n) {
  std::vector<ToyGroup> gs;
  for (int g = 0; g < n; ++g) gs.push_back({"block." + std::to_string(g), {8 + 4 * g, 33 + g}});
  return gs;
}

inline float initial_value(int g, uint64_t i) { return 0.05f * std::cos(0.11f * static_cast<float>(i) + g); }
inline float target_value(int g, uint64_t i, int step) {
  return 0.3f * std::sin(0.37f * static_cast<float>(i) + 0.5f * g + 0.01f * step);
}
// A group's description: `name` of `shape` (which must outlive the call that takes it).
inline strata_group_desc group_desc(const char* name, const std::vector<int64_t>& shape, strata_dtype t,
                                    strata_init_kind init, float init_std) {
  strata_group_desc d{};
  d.struct_size = sizeof d;
  d.name = name;
  d.ndim = static_cast<int32_t>(shape.size());
  d.shape = shape.data();
  d.dtype = t;
  d.init = init;
  d.init_std = init_std;
  return d;
}

// Gradient scale of micro-batch m on rank r (several ranks hand in different gradients).
inline float grad_scale(int micro, int rank) { return 1.0f + 0.25f * micro + 0.5f * rank; }

inline std::vector<int32_t> register_toy(strata_runtime rt, const std::vector<ToyGroup>& gs) {
  std::vector<int32_t> ids;
  for (size_t g = 0; g < gs.size(); ++g) {
    std::vector<float> data(gs[g].numel());
    for (uint64_t i = 0; i < data.size(); ++i) data[i] = initial_value(static_cast<int>(g), i);
    strata_group_desc d = group_desc(gs[g].name.c_str(), gs[g].shape, STRATA_F32, STRATA_INIT_DATA, 0.0f);
    d.data = data.data();
    int32_t id = -1;
    EXPECT_EQ(strata_register_group(rt, &d, &id), STRATA_OK) << strata_last_error();
    ids.push_back(id);
  }
  return ids;
}

// One micro-batch of the toy model: acquires groups in `order` (a group may appear
// twice: forward and backward), computes each group's gradient at its last acquire and
// hands it in right after releasing it. Returns the loss. Failures are gtest failures.
inline double toy_micro_step(strata_runtime rt, const std::vector<ToyGroup>& gs, const std::vector<int>& order,
                             int step, int micro, int rank) {
  EXPECT_STRATA_OK(strata_begin_micro_step(rt));
  std::vector<int> last(gs.size(), -1);
  for (size_t k = 0; k < order.size(); ++k) last[order[k]] = static_cast<int>(k);
  double loss = 0;
  const float s = grad_scale(micro, rank);
  for (size_t k = 0; k < order.size(); ++k) {
    const int g = order[k];
    strata_buffer b{};
    EXPECT_STRATA_OK(strata_acquire(rt, g, &b));
    if (b.data == nullptr) return NAN;
    EXPECT_EQ(b.numel, gs[g].numel());
    const float* w = static_cast<const float*>(b.data);
    if (static_cast<int>(k) == last[g]) {
      std::vector<float> grad(b.numel);
      for (uint64_t i = 0; i < b.numel; ++i) {
        const float d = w[i] - target_value(g, i, step);
        grad[i] = d * s;
        loss += 0.5 * d * d * s;
      }
      EXPECT_STRATA_OK(strata_release(rt, g));
      EXPECT_STRATA_OK(strata_grad_submit(rt, g, grad.data(), STRATA_F32, grad.size()));
    } else {
      EXPECT_STRATA_OK(strata_release(rt, g));
    }
  }
  return loss;
}

inline std::vector<std::vector<float>> read_all(strata_runtime rt, const std::vector<ToyGroup>& gs) {
  std::vector<std::vector<float>> out;
  for (size_t g = 0; g < gs.size(); ++g) {
    out.emplace_back(gs[g].numel());
    EXPECT_STRATA_OK(strata_read_params(rt, static_cast<int32_t>(g), out.back().data(), STRATA_F32, out.back().size()));
  }
  return out;
}

inline std::vector<int> forward_backward(int n) {
  std::vector<int> o;
  for (int g = 0; g < n; ++g) o.push_back(g);
  for (int g = n - 1; g >= 0; --g) o.push_back(g);
  return o;
}

// AdamW over plain vectors (torch.optim.AdamW's formula), in double.
struct ReferenceAdamW {
  double lr, wd, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  std::vector<std::vector<double>> w, m, v;
  int64_t t = 0;
  ReferenceAdamW(const std::vector<ToyGroup>& gs, double lr_, double wd_) : lr(lr_), wd(wd_) {
    for (size_t g = 0; g < gs.size(); ++g) {
      w.emplace_back(gs[g].numel());
      for (uint64_t i = 0; i < w.back().size(); ++i) w.back()[i] = initial_value(static_cast<int>(g), i);
      m.emplace_back(gs[g].numel(), 0.0);
      v.emplace_back(gs[g].numel(), 0.0);
    }
  }
  // The averaged gradient of the toy model over `accum` micro-batches and `world` ranks.
  void step(int step_index, int accum, int world) {
    ++t;
    for (size_t g = 0; g < w.size(); ++g)
      for (size_t i = 0; i < w[g].size(); ++i) {
        double scale = 0;
        for (int mi = 0; mi < accum; ++mi)
          for (int r = 0; r < world; ++r) scale += grad_scale(mi, r);
        const double d = static_cast<float>(w[g][i]) - target_value(static_cast<int>(g), i, step_index);
        const double grad = d * scale / (accum * world);
        w[g][i] *= 1 - lr * wd;
        m[g][i] = b1 * m[g][i] + (1 - b1) * grad;
        v[g][i] = b2 * v[g][i] + (1 - b2) * grad * grad;
        const double mh = m[g][i] / (1 - std::pow(b1, t)), vh = v[g][i] / (1 - std::pow(b2, t));
        w[g][i] -= lr * mh / (std::sqrt(vh) + eps);
      }
  }
};

// RAII over a runtime for tests.
struct RuntimeHandle {
  strata_runtime rt{0};
  explicit RuntimeHandle(const std::string& json) {
    EXPECT_EQ(strata_runtime_create(STRATA_API_VERSION, json.c_str(), &rt), STRATA_OK) << strata_last_error();
  }
  ~RuntimeHandle() {
    if (rt.id) strata_runtime_destroy(rt);
  }
  RuntimeHandle(const RuntimeHandle&) = delete;
  RuntimeHandle& operator=(const RuntimeHandle&) = delete;
};

// Trains 4 toy groups for 8 steps through `micro_step(rt, groups, order, step, micro)`
// (toy_micro_step or a variant: it returns the micro-batch's loss) under the runtime of
// `json`, and checks the loss falls and the parameters match ReferenceAdamW (lr and
// weight decay 0.01) to 2e-5: fp32 against a double reference, where Adam's update
// lr * m / sqrt(v) moves each step by a relative 1e-6 or so for rounding in the gradient.
// Returns the runtime's statistics at the end.
template <typename MicroStep>
strata_stats train_toy_against_reference(const std::string& json, int accum, MicroStep micro_step) {
  RuntimeHandle h(json);
  auto gs = toy_groups(4);
  register_toy(h.rt, gs);
  ReferenceAdamW ref(gs, 0.01, 0.01);
  std::vector<double> losses;
  const int steps = 8;
  strata_stats st{};
  st.struct_size = sizeof st;
  for (int s = 0; s < steps; ++s) {
    double loss = 0;
    for (int m = 0; m < accum; ++m) loss += micro_step(h.rt, gs, forward_backward(4), s, m);
    losses.push_back(loss);
    int32_t stepped = 0;
    EXPECT_STRATA_OK(strata_step(h.rt, &stepped));
    if (stepped != 1) {
      ADD_FAILURE() << "step " << s << " was not taken";
      return st;
    }
    ref.step(s, accum, 1);
  }
  EXPECT_LT(losses.back(), 0.8 * losses.front()) << "the toy model did not train";
  auto got = read_all(h.rt, gs);
  double worst = 0;
  for (size_t g = 0; g < gs.size(); ++g)
    for (size_t i = 0; i < got[g].size(); ++i) worst = std::max(worst, std::abs(got[g][i] - ref.w[g][i]));
  EXPECT_LT(worst, 2e-5);
  EXPECT_STRATA_OK(strata_get_stats(h.rt, &st));
  EXPECT_EQ(st.optimizer_steps, static_cast<uint64_t>(steps));
  return st;
}

}  // namespace capi_test
