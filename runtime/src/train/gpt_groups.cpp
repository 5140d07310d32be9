#include "strata/runtime/train/train.hpp"

#include <algorithm>
#include <cstdint>

#include "strata/core/error.hpp"

namespace strata {

std::vector<GroupSpec> gpt_group_specs(const GptShape& shape, float init_std) {
  std::vector<GroupSpec> specs;
  for (const GptGroup& g : gpt_groups(shape)) {
    GroupSpec s{g.name, g.numel, InitKind::Normal, init_std, {}};
    // With LoRA the base is frozen and only the adapter groups train.
    s.frozen = shape.has_lora() && g.name.rfind("lora.", 0) != 0;
    for (const GptTensor& t : g.tensors) {
      if (t.init == GptInit::Normal) continue;
      // A LoRA A starts at zero here and is written after the engine is made
      // (lora_init_values: peft's kaiming-uniform, or a peft adapter's).
      s.constants.push_back({t.offset, t.offset + t.numel(), t.init == GptInit::Ones ? 1.0f : 0.0f});
    }
    specs.push_back(std::move(s));
  }
  return specs;
}

std::vector<GroupSpec> gpt_group_specs(const GptShape& shape, const std::vector<std::vector<uint64_t>>& parts,
                                       float init_std) {
  const std::vector<GroupSpec> whole = gpt_group_specs(shape, init_std);
  STRATA_CHECK(parts.size() == whole.size(), "gpt_group_specs: parts for another shape");
  std::vector<GroupSpec> specs;
  for (size_t g = 0; g < whole.size(); ++g) {
    const GroupSpec& w = whole[g];
    const std::vector<uint64_t>& b = parts[g];
    for (size_t p = 0; p < b.size(); ++p) {
      const uint64_t lo = b[p], hi = p + 1 < b.size() ? b[p + 1] : w.numel;
      GroupSpec s{b.size() == 1 ? w.name : w.name + "@" + std::to_string(lo), hi - lo, w.init, w.init_std, {}};
      for (const GroupSpec::Constant& c : w.constants) {
        const uint64_t cb = std::max(c.begin, lo), ce = std::min(c.end, hi);
        if (cb < ce) s.constants.push_back({cb - lo, ce - lo, c.value});
      }
      s.frozen = w.frozen;
      s.init_group = static_cast<int>(g);
      s.init_offset = lo;
      specs.push_back(std::move(s));
    }
  }
  return specs;
}

}  // namespace strata
