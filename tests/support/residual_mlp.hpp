// A small residual MLP: the engine tests' model (test support; no part of the Strata
// libraries). Block b maps h to
//   h + tanh(h W_b^T + c_b),   W_b [width, width], c_b [width], fp32,
// so parameter group b holds width*width + width elements (W row-major, then c).
// Loss: 0.5 * mean over the batch and features of (h_L - y)^2.
// It asks a WeightSource for each block's weights and hands back each block's
// gradient, exactly as the GPT does, so every ZeRO stage and offload setting runs it.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/model/weight_source.hpp"

namespace strata {

class ResidualMlp {
 public:
  ResidualMlp(int layers, int width);
  int layers() const { return layers_; }
  int width() const { return width_; }
  uint64_t group_numel() const { return static_cast<uint64_t>(width_) * width_ + width_; }
  // The order in which forward_backward acquires groups: 0..L-1, then L-1..0.
  std::vector<int> schedule() const;

  // x, y: [batch, width]. Returns the loss of this batch; gradients (of that loss) go
  // to the weight source group by group during backward.
  double forward_backward(WeightSource& ws, const float* x, const float* y, int batch);
  double forward(WeightSource& ws, const float* x, const float* y, int batch);

 private:
  double run(WeightSource& ws, const float* x, const float* y, int batch, bool backward);
  int layers_, width_;
  std::vector<std::vector<float>> h_;  // [layers+1][batch*width] block inputs (h_L: output)
  std::vector<std::vector<float>> a_;  // [layers][batch*width] tanh outputs
};

}  // namespace strata
