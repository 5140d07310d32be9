// The engine's states from and to host memory, outside the step: each rank's initial
// shards (computed from (seed, group, element) alone, so that the initial model is the
// same for every world size and no rank materialises a whole group), and the shards and
// optimizer states that checkpoints, export and tests read and write.
#pragma once

#include <cstdint>
#include <vector>

#include "engine_state.hpp"
#include "gatherer.hpp"

namespace strata::engine {

void init_shards(EngineCore& c);
// Group g's full working parameters, widened to fp32 on the host.
std::vector<float> gather_full_params(EngineCore& c, Gatherer& gatherer, int g);
void read_optimizer_shard(EngineCore& c, int g, float* master, float* exp_avg, float* exp_avg_sq);
void write_optimizer_shard(EngineCore& c, Gatherer& gatherer, int g, const float* master, const float* exp_avg,
                           const float* exp_avg_sq);

}  // namespace strata::engine
