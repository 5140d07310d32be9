// For test_export.py: `test_export_fixture WORKDIR` trains nothing; it builds the engine
// of a small GPT at world 1 (every element drawn from a normal distribution, layer norms
// included, so that a swapped or untransposed tensor cannot pass), runs 2 optimizer
// steps on a synthetic gradient so the master weights are not the initial ones, saves a
// checkpoint to WORKDIR/ckpt and writes what the engine holds, by another path
// (gather_full_params), to WORKDIR/ref/group-<g>.f32 (raw little-endian float32) and
// WORKDIR/ref/shape.json.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "strata/collectives/communicator.hpp"
#include "strata/core/device.hpp"
#include "strata/model/gpt_layout.hpp"
#include "strata/runtime/formats/checkpoint.hpp"
#include "strata/runtime/config/config.hpp"

using namespace strata;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s WORKDIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path work(argv[1]);
  std::filesystem::create_directories(work / "ref");
  const GptShape shape{.layers = 2, .d_model = 16, .heads = 2, .seq_len = 8, .vocab = 40};
  const nlohmann::json config = {
      {"train_micro_batch_size_per_gpu", 1},
      {"strata",
       {{"model",
         {{"layers", shape.layers}, {"d_model", shape.d_model}, {"heads", shape.heads}, {"seq_len", shape.seq_len},
          {"vocab", shape.vocab}}}}}};
  auto comm = coll::make_host_communicator(coll::HostBackend::Self);
  auto device = make_device({});
  std::vector<GroupSpec> specs;
  std::vector<std::string> names;
  for (const GptGroup& g : gpt_groups(shape)) {
    specs.push_back({g.name, g.numel, InitKind::Normal, 0.5f, {}});
    names.push_back(g.name);
  }
  EngineOptions o;
  o.stage = 3;
  o.optimizer.lr = 1e-2f;
  o.optimizer_threads = 1;
  o.store.device_budget = 8 << 20;
  o.store.pinned_budget = 8 << 20;
  ZeroEngine engine(*device, *comm, *comm, o, specs);
  std::vector<int> order;
  for (int g = 0; g < engine.num_groups(); ++g) order.push_back(g);
  engine.set_schedule(order);
  for (int step = 0; step < 2; ++step) {
    engine.begin_micro_step();
    for (int g = 0; g < engine.num_groups(); ++g) {
      const float* p = engine.acquire_f32(g);
      float* grad = engine.gradient_f32(g);
      for (uint64_t i = 0; i < engine.group_numel(g); ++i) grad[i] = std::sin(p[i] * 3.0f + static_cast<float>(i));
      engine.release_params(g);
      engine.grads_ready(g);
    }
    engine.step();
  }
  const std::string ck = save_checkpoint(engine, *comm, (work / "ckpt").string(), config, {}, names);
  for (int g = 0; g < engine.num_groups(); ++g) {
    const std::vector<float> w = engine.gather_full_params(g);
    std::ofstream((work / "ref" / ("group-" + std::to_string(g) + ".f32")), std::ios::binary)
        .write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(w.size() * 4));
  }
  std::ofstream(work / "ref" / "shape.json") << model_json(parse_config(config).strata.model).dump() << "\n";
  std::printf("%s\n", ck.c_str());
  return 0;
}
