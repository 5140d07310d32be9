// Stream::adam_step's host form: the element-wise step of the engine's GPU optimizer, run
// by the cpu backend's stream (and by tests beside CpuAdam). Built with -ffp-contract=off
// like every host file that computes with core/math/adam.hpp, so its bits are the
// scalar CpuAdam's and the cuda kernel's.
#include <cstdint>

#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/core/math/half.hpp"

namespace strata {

namespace {

float load(const void* g, DType t, size_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(g)[i];
    case DType::BF16: return math::bf16_to_float(static_cast<const uint16_t*>(g)[i]);
    case DType::F16: return math::fp16_to_float(static_cast<const uint16_t*>(g)[i]);
    default: return 0.0f;  // refused by adam_step_host before the loop
  }
}

}  // namespace

void adam_step_host(const AdamStepArgs& a) {
  if (a.grad_t != DType::F32 && a.grad_t != DType::BF16 && a.grad_t != DType::F16)
    throw Error(std::string("adam_step: gradient type ") + to_string(a.grad_t) + " is not f32, bf16 or fp16");
  if (a.half_t != DType::F32 && a.half_t != DType::BF16 && a.half_t != DType::F16)
    throw Error(std::string("adam_step: working-copy type ") + to_string(a.half_t) + " is not bf16 or fp16");
  auto* half = static_cast<uint16_t*>(a.half_out);
  for (size_t i = 0; i < a.n; ++i) {
    float p = a.p_in[i], m = a.m_in[i], v = a.v_in[i];
    const float g = math::adam_scaled_grad(load(a.grad, a.grad_t, i), a.grad_scale);
    math::adam_update(a.s, p, g, m, v);
    a.p_out[i] = p;
    a.m_out[i] = m;
    a.v_out[i] = v;
    if (a.half_t == DType::BF16) half[i] = math::float_to_bf16(p);
    if (a.half_t == DType::F16) half[i] = math::float_to_fp16(p);
  }
}

}  // namespace strata
