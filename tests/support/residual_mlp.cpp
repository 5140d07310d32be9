#include "support/residual_mlp.hpp"

#include <cmath>

#include "strata/core/error.hpp"
#include "strata/model/cpu_sgemm.hpp"

namespace strata {

ResidualMlp::ResidualMlp(int layers, int width) : layers_(layers), width_(width) {
  if (layers < 1 || width < 1) throw Error("ResidualMlp needs at least one layer and one feature");
}

std::vector<int> ResidualMlp::schedule() const {
  std::vector<int> s;
  for (int b = 0; b < layers_; ++b) s.push_back(b);
  for (int b = layers_ - 1; b >= 0; --b) s.push_back(b);
  return s;
}

double ResidualMlp::forward_backward(WeightSource& ws, const float* x, const float* y, int batch) {
  return run(ws, x, y, batch, true);
}
double ResidualMlp::forward(WeightSource& ws, const float* x, const float* y, int batch) {
  return run(ws, x, y, batch, false);
}

double ResidualMlp::run(WeightSource& ws, const float* x, const float* y, int batch, bool backward) {
  STRATA_CHECK(ws.num_groups() == layers_, "weight source has a different number of groups");
  const int B = batch, D = width_;
  const size_t n = static_cast<size_t>(B) * D;
  h_.assign(layers_ + 1, std::vector<float>(n));
  a_.assign(layers_, std::vector<float>(n));
  std::copy(x, x + n, h_[0].begin());
  for (int b = 0; b < layers_; ++b) {
    const float* w = ws.acquire_f32(b);
    const float* c = w + static_cast<size_t>(D) * D;
    float* z = a_[b].data();
    for (int i = 0; i < B; ++i) std::copy(c, c + D, z + static_cast<size_t>(i) * D);
    // z[B,D] += h[B,D] * W^T
    cpu_sgemm(false, true, B, D, D, 1.0f, h_[b].data(), D, w, D, 1.0f, z, D);
    ws.release_params(b);
    for (size_t i = 0; i < n; ++i) {
      z[i] = std::tanh(z[i]);
      h_[b + 1][i] = h_[b][i] + z[i];
    }
  }
  double loss = 0;
  std::vector<float> dh(n);
  const double inv = 1.0 / static_cast<double>(n);
  for (size_t i = 0; i < n; ++i) {
    double d = static_cast<double>(h_[layers_][i]) - y[i];
    loss += 0.5 * d * d;
    dh[i] = static_cast<float>(d * inv);
  }
  loss *= inv;
  if (!backward) return loss;
  std::vector<float> dz(n), dh_prev(n);
  for (int b = layers_ - 1; b >= 0; --b) {
    const float* w = ws.acquire_f32(b);
    float* g = ws.gradient_f32(b);
    const float* a = a_[b].data();
    for (size_t i = 0; i < n; ++i) dz[i] = dh[i] * (1.0f - a[i] * a[i]);
    // dW[D,D] = dz^T[D,B] h[B,D]; dc = column sums of dz; dh_prev = dh + dz W
    cpu_sgemm(true, false, D, D, B, 1.0f, dz.data(), D, h_[b].data(), D, 0.0f, g, D);
    float* gc = g + static_cast<size_t>(D) * D;
    for (int j = 0; j < D; ++j) gc[j] = 0.0f;
    for (int i = 0; i < B; ++i)
      for (int j = 0; j < D; ++j) gc[j] += dz[static_cast<size_t>(i) * D + j];
    dh_prev = dh;
    cpu_sgemm(false, false, B, D, D, 1.0f, dz.data(), D, w, D, 1.0f, dh_prev.data(), D);
    ws.release_params(b);
    ws.grads_ready(b);
    dh.swap(dh_prev);
  }
  return loss;
}

}  // namespace strata
