#include "strata/runtime/train.hpp"

namespace strata {

std::vector<GroupSpec> gpt_group_specs(const GptShape& shape, float init_std) {
  std::vector<GroupSpec> specs;
  for (const GptGroup& g : gpt_groups(shape)) {
    GroupSpec s{g.name, g.numel, InitKind::Normal, init_std, {}};
    for (const GptTensor& t : g.tensors) {
      if (t.init == GptInit::Normal) continue;
      s.constants.push_back({t.offset, t.offset + t.numel(), t.init == GptInit::Ones ? 1.0f : 0.0f});
    }
    specs.push_back(std::move(s));
  }
  return specs;
}

}  // namespace strata
