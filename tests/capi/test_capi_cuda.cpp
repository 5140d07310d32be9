// The C API on the cuda backend: strata_acquire hands out device buffers of GPU 0, a
// caller hands gradients in from device memory (strata_grad_submit) or writes them into
// strata_grad_buffer, and the toy model of capi_harness.hpp trains exactly as the
// reference AdamW predicts, for ZeRO-3 with states on NVMe, ZeRO-3 in pinned memory and
// ZeRO-2. The gradients are computed on the host from a copy of the acquired parameters,
// so what is checked is the runtime's device side: gathers, releases, gradient hand-in,
// the reduce over NCCL and the optimizer round trip.
//
// Needs a GPU: skips with the reason where there is none, or where Strata was built
// without the cuda backend (CI). Run on an H100 by hand (docs/embedding.md says when).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "capi_harness.hpp"

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace capi_test {
namespace {

// config_json on the cuda backend.
std::string cuda_config(const ConfigSpec& c) {
  std::string j = config_json(c);
  const std::string cpu = "\"backend\": \"cpu\"";
  j.replace(j.find(cpu), cpu.size(), "\"backend\": \"cuda\"");
  return j;
}

#ifdef STRATA_HAVE_CUDA

#define EXPECT_CUDA_OK(call) EXPECT_EQ((call), cudaSuccess) << #call

// toy_micro_step with device buffers: the parameters are copied to the host, the
// gradient computed there and handed in from device memory, through strata_grad_submit
// for even groups and written into strata_grad_buffer for odd ones.
double cuda_toy_micro_step(strata_runtime rt, const std::vector<ToyGroup>& gs, const std::vector<int>& order,
                           int step, int micro) {
  EXPECT_STRATA_OK(strata_begin_micro_step(rt));
  std::vector<int> last(gs.size(), -1);
  for (size_t k = 0; k < order.size(); ++k) last[order[k]] = static_cast<int>(k);
  double loss = 0;
  const float s = grad_scale(micro, 0);
  for (size_t k = 0; k < order.size(); ++k) {
    const int g = order[k];
    strata_buffer b{};
    EXPECT_STRATA_OK(strata_acquire(rt, g, &b));
    if (b.data == nullptr) return NAN;
    EXPECT_EQ(b.device_type, STRATA_DEVICE_CUDA);
    EXPECT_EQ(b.ready_event, nullptr);
    cudaPointerAttributes attr{};
    EXPECT_CUDA_OK(cudaPointerGetAttributes(&attr, b.data));
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice) << "group " << g << ": acquire handed out non-device memory";
    if (static_cast<int>(k) != last[g]) {
      EXPECT_STRATA_OK(strata_release(rt, g));
      continue;
    }
    std::vector<float> w(b.numel), grad(b.numel);
    EXPECT_CUDA_OK(cudaMemcpy(w.data(), b.data, b.numel * sizeof(float), cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < b.numel; ++i) {
      const float d = w[i] - target_value(g, i, step);
      grad[i] = d * s;
      loss += 0.5 * d * d * s;
    }
    EXPECT_STRATA_OK(strata_release(rt, g));
    if (g % 2 == 0) {
      void* dev = nullptr;
      EXPECT_CUDA_OK(cudaMalloc(&dev, grad.size() * sizeof(float)));
      EXPECT_CUDA_OK(cudaMemcpy(dev, grad.data(), grad.size() * sizeof(float), cudaMemcpyHostToDevice));
      EXPECT_STRATA_OK(strata_grad_submit(rt, g, dev, STRATA_F32, grad.size()));
      EXPECT_CUDA_OK(cudaFree(dev));
    } else {
      strata_buffer gb{};
      EXPECT_STRATA_OK(strata_grad_buffer(rt, g, &gb));
      EXPECT_EQ(gb.device_type, STRATA_DEVICE_CUDA);
      EXPECT_CUDA_OK(cudaMemcpy(gb.data, grad.data(), grad.size() * sizeof(float), cudaMemcpyHostToDevice));
      EXPECT_STRATA_OK(strata_grad_ready(rt, g));
    }
  }
  return loss;
}

TEST(CApiCuda, TrainingMatchesAReferenceAdamW) {
  int gpus = 0;
  const cudaError_t rc = cudaGetDeviceCount(&gpus);
  if (rc != cudaSuccess || gpus == 0)
    GTEST_SKIP() << "no GPU: " << (rc != cudaSuccess ? cudaGetErrorString(rc) : "no devices");
  struct Case {
    int stage;
    std::string offload;
    int accum;
  };
  for (const Case& c : {Case{3, "nvme", 1}, Case{3, "cpu", 2}, Case{2, "nvme", 2}}) {
    SCOPED_TRACE("stage " + std::to_string(c.stage) + ", offload " + c.offload + ", accum " + std::to_string(c.accum));
    TempDir dir("cuda");
    const strata_stats st = train_toy_against_reference(
        cuda_config({.stage = c.stage, .accum = c.accum, .offload = c.offload, .nvme_dir = dir.path.string()}),
        c.accum, cuda_toy_micro_step);
    EXPECT_LE(st.tiers[STRATA_TIER_DEVICE].peak, st.tiers[STRATA_TIER_DEVICE].budget);
    EXPECT_GT(st.tiers[STRATA_TIER_DEVICE].peak, 0u) << "nothing was ever held in device memory";
  }
}

#else  // no cuda backend in this build

TEST(CApiCuda, TrainingMatchesAReferenceAdamW) {
  strata_runtime rt{};
  EXPECT_EQ(strata_runtime_create(STRATA_API_VERSION, cuda_config({}).c_str(), &rt), STRATA_ERR_UNAVAILABLE);
  GTEST_SKIP() << "built without the cuda backend: " << strata_last_error();
}

#endif

}  // namespace
}  // namespace capi_test
