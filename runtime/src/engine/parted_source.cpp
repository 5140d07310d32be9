#include "strata/runtime/engine/parted_source.hpp"

#include "strata/core/error.hpp"

namespace strata {

PartedSource::PartedSource(WeightSource& inner, std::vector<std::vector<uint64_t>> parts)
    : inner_(inner), parts_(std::move(parts)) {
  int next = 0;
  for (size_t g = 0; g < parts_.size(); ++g) {
    const std::vector<uint64_t>& b = parts_[g];
    STRATA_CHECK(!b.empty() && b[0] == 0, "PartedSource: group " + std::to_string(g) + " has no part at 0");
    first_.push_back(next);
    uint64_t n = 0;
    for (size_t p = 0; p < b.size(); ++p) {
      STRATA_CHECK(next < inner.num_groups(), "PartedSource: more parts than the inner source has groups");
      const uint64_t size = inner.group_numel(next);
      STRATA_CHECK(b[p] == n && size > 0, "PartedSource: part " + std::to_string(p) + " of group " + std::to_string(g) +
                                              " does not start where the one before ends");
      n += size;
      ++next;
    }
    numel_.push_back(n);
  }
  STRATA_CHECK(next == inner.num_groups(), "PartedSource: the parts do not cover the inner source's groups");
}

int PartedSource::inner(int g, int p) const {
  STRATA_CHECK(g >= 0 && static_cast<size_t>(g) < parts_.size() && p >= 0 && p < num_parts(g),
               "PartedSource: no part " + std::to_string(p) + " of group " + std::to_string(g));
  return first_[static_cast<size_t>(g)] + p;
}

bool PartedSource::any_parted() const {
  for (const auto& b : parts_)
    if (b.size() > 1) return true;
  return false;
}

int PartedSource::whole(int g, const char* what) const {
  if (num_parts(g) != 1)
    throw Error(std::string(what) + ": group " + std::to_string(g) + " is gathered in " +
                std::to_string(num_parts(g)) + " parts; read it with acquire_part");
  return inner(g, 0);
}

PartName parse_part_name(const std::string& name) {
  const size_t at = name.rfind('@');
  if (at == std::string::npos || at + 1 == name.size()) return {name, 0};
  uint64_t off = 0;
  for (size_t i = at + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || off > (UINT64_MAX - 9) / 10) return {name, 0};
    off = off * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  return {name.substr(0, at), off};
}


}  // namespace strata
