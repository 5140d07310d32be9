#include <string>

#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/model/gpt.hpp"

namespace strata {

HostWeights::HostWeights(std::vector<std::vector<float>> groups, DType dtype) : dtype_(dtype) {
  if (!is_working_dtype(dtype)) throw Error(std::string("HostWeights: ") + to_string(dtype) + " is not f32, bf16 or fp16");
  const size_t es = dtype_size(dtype);
  for (auto& g : groups) {
    numel_.push_back(g.size());
    params_.emplace_back(g.size() * es);
    convert_from_f32(params_.back().data(), dtype, g.data(), g.size());
    std::vector<float>().swap(g);
  }
  grads_.resize(numel_.size());
  held_.assign(numel_.size(), 0);
}

const void* HostWeights::acquire_params(int g) {
  ++held_.at(g);
  return params_.at(g).data();
}

void HostWeights::release_params(int g) {
  if (held_.at(g) <= 0) throw Error("release_params: group " + std::to_string(g) + " is not acquired");
  --held_[g];
}

void* HostWeights::gradient_buffer(int g) {
  // NaN in every element, whatever the type: the model must overwrite each one.
  grads_.at(g).assign(numel_.at(g) * dtype_size(dtype_), std::byte{0xff});
  return grads_[g].data();
}

std::vector<float> HostWeights::grads(int g) const {
  std::vector<float> out(grads_.at(g).size() / dtype_size(dtype_));
  convert_to_f32(out.data(), grads_[g].data(), dtype_, out.size());
  return out;
}

void HostWeights::grads_ready(int) {}

}  // namespace strata
