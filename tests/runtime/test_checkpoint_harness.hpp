// A residual-MLP training run that can stop, save, and be rebuilt from a checkpoint, so
// that "save at step k, resume" can be compared with an uninterrupted run
// (test_checkpoint.cpp on one process, test_checkpoint_mpi.cpp across ranks).
#pragma once

#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine_harness.hpp"
#include "strata/runtime/formats/checkpoint.hpp"

namespace strata::testing_checkpoint {

using testing_engine::kGlobalBatch;
using testing_engine::kLayers;
using testing_engine::kWidth;
using testing_engine::RunSpec;

// One training run: the engine settings are those of engine_harness.hpp.
struct Trainer {
  coll::Communicator& comm;
  std::unique_ptr<Device> device = make_device({});
  ResidualMlp model;
  std::unique_ptr<ZeroEngine> engine;
  int layers;

  Trainer(coll::Communicator& c, const RunSpec& spec, const std::string& nvme_dir, uint64_t seed = 42,
          int layers_ = kLayers, int width = kWidth)
      : comm(c), model(layers_, width), layers(layers_) {
    EngineOptions o = test_engine_options(spec, model.group_numel(), nvme_dir, seed);
    std::vector<GroupSpec> groups;
    for (int b = 0; b < layers; ++b)
      groups.push_back({"block." + std::to_string(b), model.group_numel(), InitKind::Normal, 0.1f, {}});
    engine = std::make_unique<ZeroEngine>(*device, comm, comm, o, groups, test_engine_ablation(spec));
    engine->set_schedule(model.schedule());
  }

  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (int b = 0; b < layers; ++b) n.push_back("block." + std::to_string(b));
    return n;
  }

  // One optimizer step on the batch of global step `step` (the engine's own count):
  // returns the global mean loss.
  double step(int accum = 1) {
    const int s = static_cast<int>(engine->optimizer_steps());
    const int world = comm.size(), rank = comm.rank();
    const int local = kGlobalBatch / world;
    std::vector<float> x(static_cast<size_t>(local) * model.width()), y(x.size());
    double loss = 0;
    for (int m = 0; m < accum; ++m) {
      for (int i = 0; i < local; ++i)
        testing_engine::make_row(s, m, rank * local + i, &x[static_cast<size_t>(i) * kWidth],
                                 &y[static_cast<size_t>(i) * kWidth]);
      engine->begin_micro_step();
      loss += model.forward_backward(*engine, x.data(), y.data(), local);
    }
    comm.all_reduce(std::span<double>(&loss, 1)).wait();
    engine->step();
    return loss / (world * accum);
  }

  std::vector<std::vector<float>> weights() {
    std::vector<std::vector<float>> w;
    for (int g = 0; g < engine->num_groups(); ++g) w.push_back(engine->gather_full_params(g));
    return w;
  }
};

// Every file under dir (recursively) and the xxh3 of its bytes: to show nothing changed.
inline std::map<std::string, uint64_t> snapshot(const std::filesystem::path& dir) {
  std::map<std::string, uint64_t> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) {
      out[e.path().string()] = 0;
      continue;
    }
    std::ifstream f(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string s = ss.str();
    out[e.path().string()] = XXH3_64bits(s.data(), s.size()) ^ s.size();
  }
  return out;
}

inline double max_abs_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t g = 0; g < a.size(); ++g)
    for (size_t i = 0; i < a[g].size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(a[g][i] - b[g][i])));
  return worst;
}

}  // namespace strata::testing_checkpoint
