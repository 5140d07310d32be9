// `strata export --checkpoint DIR --out FILE [--force]`: a checkpoint's weights as one
// safetensors file with GPT-2 tensor names (runtime/export.hpp).
#include <cstdio>
#include <memory>

#include "cli.hpp"
#include "strata/core/convert.hpp"
#include "strata/runtime/export.hpp"

namespace strata::cli {

namespace {
struct ExportArgs {
  std::string checkpoint;
  std::string out;
  bool force = false;
  std::string dtype;  // "": what the run trained in
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
  e->add_option("--dtype", a->dtype, "bf16, fp16 or f32 tensors (default: the precision the run trained in)");
  e->callback([a] {
    selected() = [a] {
      std::optional<DType> dtype;
      if (!a->dtype.empty()) dtype = parse_precision(a->dtype);
      const ExportSummary s = export_safetensors(a->checkpoint, a->out, a->force, dtype);
      std::printf("exported %s (step %lld; %d layers, d_model %d, %d heads, context %d, vocab %d) to %s: "
                  "%d %s tensors, %llu parameters, %llu bytes\n",
                  s.checkpoint.c_str(), static_cast<long long>(s.step), s.shape.layers, s.shape.d_model,
                  s.shape.heads, s.shape.seq_len, s.shape.vocab, s.out.c_str(), s.tensors, precision_name(s.dtype),
                  static_cast<unsigned long long>(s.parameters), static_cast<unsigned long long>(s.bytes));
      return 0;
    };
  });
}

}  // namespace strata::cli
