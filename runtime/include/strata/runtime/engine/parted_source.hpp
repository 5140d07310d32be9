// A model's view of an engine whose groups are parts of the model's groups (gpt_parts:
// per-tensor gathers and tiles). The engine shards, gathers, releases and reduce-scatters
// each part as a group of its own (one layout for all of it, shard_layout.hpp); the model
// asks for its groups' parts through WeightSource's part calls (group_view.hpp). With one
// part per group it is the engine itself, group for group.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/model/weight_source.hpp"

namespace strata {

// An engine group's name for a part of a model group: "block.3@1536" is part of "block.3"
// from element 1536; a name without '@' is a whole group (offset 0). Checkpoints merge
// parts back into model groups by it.
struct PartName {
  std::string group;
  uint64_t offset = 0;
};
PartName parse_part_name(const std::string& name);

class PartedSource final : public WeightSource {
 public:
  // parts[g]: the first element of each part of model group g (gpt_parts); the inner
  // source's groups are those parts, in order, each of the part's size.
  PartedSource(WeightSource& inner, std::vector<std::vector<uint64_t>> parts);

  int num_groups() const override { return static_cast<int>(parts_.size()); }
  uint64_t group_numel(int g) const override { return numel_.at(static_cast<size_t>(g)); }
  DType dtype() const override { return inner_.dtype(); }
  // Whole groups only (one part); a group in parts is read part by part.
  const void* acquire_params(int g) override { return inner_.acquire_params(whole(g, "acquire_params")); }
  void release_params(int g) override { inner_.release_params(whole(g, "release_params")); }
  void* gradient_buffer(int g) override { return inner_.gradient_buffer(whole(g, "gradient_buffer")); }
  void grads_ready(int g) override { inner_.grads_ready(whole(g, "grads_ready")); }
  void release_params_after(int g, const Event& after) override {
    inner_.release_params_after(whole(g, "release_params"), after);
  }
  void grads_ready_after(int g, const Event& after) override {
    inner_.grads_ready_after(whole(g, "grads_ready"), after);
  }
  ActivationStore* activation_store() override { return inner_.activation_store(); }

  int num_parts(int g) const override { return static_cast<int>(parts_.at(static_cast<size_t>(g)).size()); }
  uint64_t part_begin(int g, int p) const override { return parts_.at(static_cast<size_t>(g)).at(static_cast<size_t>(p)); }
  const void* acquire_part(int g, int p) override { return inner_.acquire_params(inner(g, p)); }
  void release_part(int g, int p) override { inner_.release_params(inner(g, p)); }
  void* part_gradient(int g, int p) override { return inner_.gradient_buffer(inner(g, p)); }
  void part_grads_ready(int g, int p) override { inner_.grads_ready(inner(g, p)); }
  void release_part_after(int g, int p, const Event& after) override {
    inner_.release_params_after(inner(g, p), after);
  }
  void part_grads_ready_after(int g, int p, const Event& after) override {
    inner_.grads_ready_after(inner(g, p), after);
  }

  // The inner group of part p of model group g.
  int inner(int g, int p) const;
  bool any_parted() const;

 private:
  int whole(int g, const char* what) const;
  WeightSource& inner_;
  std::vector<std::vector<uint64_t>> parts_;
  std::vector<int> first_;       // inner index of each model group's first part
  std::vector<uint64_t> numel_;  // model groups' elements
};

}  // namespace strata
