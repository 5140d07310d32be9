// `strata export --checkpoint DIR --out FILE [--force]`: a checkpoint's weights as one
// safetensors file with GPT-2 tensor names (runtime/export.hpp).
#include <cstdio>
#include <memory>

#include "cli.hpp"
#include "strata/runtime/export.hpp"

namespace strata::cli {

namespace {
struct ExportArgs {
  std::string checkpoint;
  std::string out;
  bool force = false;
};
}  // namespace

void add_export(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  auto* e = app.add_subcommand("export", "Write a checkpoint's weights as one safetensors file with GPT-2 tensor names");
  e->add_option("--checkpoint", a->checkpoint,
                "a step-<N> checkpoint directory, or a checkpoint_dir (its latest complete checkpoint)")
      ->required();
  e->add_option("--out", a->out, "the safetensors file to write")->required();
  e->add_flag("--force", a->force, "replace --out when it exists");
  e->callback([a] {
    selected() = [a] {
      const ExportSummary s = export_safetensors(a->checkpoint, a->out, a->force);
      std::printf("exported %s (step %lld; %d layers, d_model %d, %d heads, context %d, vocab %d) to %s: "
                  "%d tensors, %llu parameters, %llu bytes\n",
                  s.checkpoint.c_str(), static_cast<long long>(s.step), s.shape.layers, s.shape.d_model,
                  s.shape.heads, s.shape.seq_len, s.shape.vocab, s.out.c_str(), s.tensors,
                  static_cast<unsigned long long>(s.parameters), static_cast<unsigned long long>(s.bytes));
      return 0;
    };
  });
}

}  // namespace strata::cli
