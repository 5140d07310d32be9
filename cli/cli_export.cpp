// `strata export --checkpoint DIR --out FILE [--force]`: a checkpoint's weights as one
// safetensors file with GPT-2 tensor names (runtime/export.hpp); `strata import --hf DIR
// --out CKPT`: a Hugging Face model directory as a checkpoint (runtime/hf_import.hpp).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>

#include "cli.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/core/byte_count.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/output_guard.hpp"
#include "strata/runtime/config/config.hpp"
#include "strata/runtime/formats/export.hpp"
#include "strata/runtime/formats/hf_import.hpp"

namespace strata::cli {

namespace {
struct ExportArgs {
  std::string checkpoint;
  std::string out;
  bool force = false;
  std::string dtype;  // "": what the run trained in
  std::string format = "safetensors";
  std::string shard_size = "5GB";
  bool clamp = false;  // a weight beyond --dtype's range: clamped, not refused
};
struct ImportArgs {
  std::string hf;
  std::string out;
  std::string precision;  // "": the tensors'
  bool clamp = false;      // a weight beyond --precision's range: clamped, not refused
};
}  // namespace

void add_export(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  auto* e = app.add_subcommand("export", "Write a checkpoint's weights as a safetensors file with GPT-2 tensor names, "
                                         "or as a Hugging Face model directory (--format hf)");
  e->add_option("--checkpoint", a->checkpoint,
                "a step-<N> checkpoint directory, or a checkpoint_dir (its latest complete checkpoint)")
      ->required();
  e->add_option("--out", a->out, "the safetensors file to write (--format hf: the directory)")->required();
  e->add_option("--format", a->format,
                "safetensors: one file with the model's names; hf: a Hugging Face GPT2LMHeadModel or LlamaForCausalLM directory "
                "(config.json and safetensors, from_pretrained loads it; a LoRA run's adapters merged in); peft: a LoRA "
                "run's adapters as a peft adapter directory (PeftModel.from_pretrained loads it)")
      ->capture_default_str()
      ->check(CLI::IsMember({"safetensors", "hf", "peft"}));
  e->add_option("--shard-size", a->shard_size, std::string("--format hf: the largest safetensors file, in bytes (") + kByteCountUnits + ")")
      ->capture_default_str();
  e->add_flag("--force", a->force, "replace --out when it exists");
  e->add_option("--dtype", a->dtype, "bf16, fp16 or f32 tensors (default: the precision the run trained in)");
  e->add_flag("--clamp", a->clamp,
              "a weight beyond --dtype's range (fp16: 65504) becomes the largest finite value of its sign instead of "
              "an error");
  e->callback([a] {
    selected() = [a] {
      std::optional<DType> dtype;
      if (!a->dtype.empty()) dtype = parse_precision(a->dtype);
      const OutOfRange out_of_range = a->clamp ? OutOfRange::Clamp : OutOfRange::Refuse;
      const ExportSummary s =
          a->format == "peft" ? export_peft(a->checkpoint, a->out, a->force, dtype)
          : a->format == "hf"
              ? export_hf(a->checkpoint, a->out, a->force, dtype, parse_byte_count(a->shard_size, "--shard-size"),
                          out_of_range)
              : export_safetensors(a->checkpoint, a->out, a->force, dtype, out_of_range);
      std::printf("exported %s (step %lld; %s) to %s: %d %s tensors, %llu parameters, %llu bytes in %d file(s)\n",
                  s.checkpoint.c_str(), static_cast<long long>(s.step), describe(s.shape).c_str(), s.out.c_str(),
                  s.tensors, precision_name(s.dtype),
                  static_cast<unsigned long long>(s.parameters), static_cast<unsigned long long>(s.bytes), s.files);
      return 0;
    };
  });

  auto b = std::make_shared<ImportArgs>();
  auto* i = app.add_subcommand("import", "Read a Hugging Face model directory (GPT2LMHeadModel, LlamaForCausalLM) into a checkpoint");
  i->add_option("--hf", b->hf, "the model directory: config.json and model.safetensors (or its shards and index)")
      ->required();
  i->add_option("--out", b->out, "a new directory; the checkpoint is written as its step-00000000")->required();
  i->add_option("--precision", b->precision,
                "bf16, fp16 or f32: what training continues in by default (default: the tensors' type)");
  i->add_flag("--clamp", b->clamp,
              "a weight beyond --precision's range (fp16: 65504) becomes the largest finite value of its sign instead "
              "of an error");
  i->callback([b] {
    selected() = [b] {
      std::vector<RunPath> inputs = files_in(b->hf, "--hf");
      inputs.push_back({b->hf, "--hf"});
      check_outputs_replace_no_input(inputs, {{b->out, "--out"}, standard_output()});
      std::optional<DType> precision;
      if (!b->precision.empty()) precision = parse_precision(b->precision);
      // Under mpirun every rank reads its own shard of the weights and writes its rank file.
      const auto host = coll::make_host_communicator(coll::HostBackend::Auto);
      const ImportSummary s =
          import_hf(b->hf, b->out, precision, host.get(), b->clamp ? OutOfRange::Clamp : OutOfRange::Refuse);
      // Test hook: STRATA_IMPORT_READ_LOG=PATH writes each rank's reads to PATH.<rank>, one
      // "file offset bytes" line each (test_import_mpi.py checks they are disjoint).
      if (const char* log = std::getenv("STRATA_IMPORT_READ_LOG")) {
        std::ofstream f(std::string(log) + "." + std::to_string(host->rank()));
        for (const auto& r : s.reads) f << s.files_read[r.file] << " " << r.offset << " " << r.bytes << "\n";
      }
      if (host->size() > 1)
        std::printf("rank %d of %d read %llu tensor bytes in %zu reads\n", host->rank(), host->size(),
                    static_cast<unsigned long long>(s.bytes_read), s.reads.size());
      if (host->rank() != 0) return 0;
      std::printf("imported %s (%s; %s) from %d file(s): %d tensors, %llu parameters, %llu bytes read by %d rank(s), into %s "
                  "(%s)\nfine-tune it with: strata train --config CFG --init-from %s\n"
                  "where CFG has \"strata\": {\"model\": %s}\n",
                  b->hf.c_str(), s.architecture.c_str(), describe(s.shape).c_str(), s.files, s.tensors,
                  static_cast<unsigned long long>(s.parameters), static_cast<unsigned long long>(s.bytes_read_all),
                  host->size(), s.checkpoint.c_str(), s.precision.c_str(), b->out.c_str(), model_json(s.shape).dump().c_str());
      return 0;
    };
  });
}

}  // namespace strata::cli
