// Weights that cannot be used (docs/checkpoints.md, "Weights that cannot be used"):
//  - a NaN or inf weight in a checkpoint is refused, naming the tensor and its flat index,
//    wherever a checkpoint is read: sample/eval/export (read_checkpoint_group), export,
//    --init-from and --resume-from;
//  - so is one in a Hugging Face model at import, with the file's tensor name and index;
//  - a weight beyond fp16's range is refused where it would be narrowed (export --dtype
//    fp16, import --precision fp16, a checkpoint loaded into an fp16 engine, eval in fp16),
//    naming the tensor, its largest magnitude and the limit, or clamped where asked.
// Every test writes only its own temporary directory.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "strata/collectives/communicator.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/model/gpt_layout.hpp"
#include "strata/runtime/config/config.hpp"
#include "strata/runtime/engine/zero_engine.hpp"
#include "strata/runtime/formats/checkpoint.hpp"
#include "strata/runtime/formats/export.hpp"
#include "strata/runtime/formats/hf_import.hpp"
#include "strata/runtime/formats/safetensors.hpp"
#include "strata/runtime/train/train.hpp"

#include "config_errors.hpp"

namespace fs = std::filesystem;
using namespace strata;
using strata::test::error_of;

namespace {

struct Dir {
  fs::path p;
  explicit Dir(const std::string& tag) {
    p = fs::temp_directory_path() / ("strata-weights-" + tag + "-" + std::to_string(::getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(p, ec);
  }
};

// Byte-level text (vocabulary 256), so that token 0 (NUL) never occurs in the data.
const GptShape kShape{.layers = 1, .d_model = 16, .heads = 2, .seq_len = 8, .vocab = 256};

const GptTensor& tensor(const std::vector<GptGroup>& groups, const std::string& name) {
  for (const GptGroup& g : groups)
    for (const GptTensor& t : g.tensors)
      if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

// Every group's values, small and different, with `value` at flat index `index` of tensor
// `name` (Strata's layout).
std::vector<std::vector<float>> weights(const std::string& name = "", uint64_t index = 0, float value = 0) {
  const std::vector<GptGroup> groups = gpt_groups(kShape);
  std::vector<std::vector<float>> out;
  for (const GptGroup& g : groups) {
    out.emplace_back(g.numel);
    for (uint64_t i = 0; i < g.numel; ++i) out.back()[i] = 0.05f * std::sin(0.37f * static_cast<float>(i + out.size()));
  }
  if (!name.empty()) {
    const GptTensor& t = tensor(groups, name);
    out[static_cast<size_t>(t.group)][t.offset + index] = value;
  }
  return out;
}

// A checkpoint of kShape holding `w`, as strata import writes one: root/step-00000000.
std::string write_checkpoint(const fs::path& root, const std::vector<std::vector<float>>& w) {
  InitialCheckpointWriter writer(root.string());
  const std::vector<GptGroup> groups = gpt_groups(kShape);
  for (size_t g = 0; g < groups.size(); ++g) writer.add_group(groups[g].name, w[g].data(), groups[g].numel);
  return writer.finish({{"strata", {{"model", model_json(kShape)}}}}, "f32", nlohmann::json::object());
}

Config run_config(const fs::path& dir, const std::string& precision, const std::string& out_of_range = "refuse") {
  const fs::path data = dir / "corpus.txt";
  if (!fs::exists(data)) {
    std::string text;
    for (int i = 0; i < 200; ++i) text += "the cat sat on a mat. ";
    std::ofstream(data) << text;
  }
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 1},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
      {"zero_optimization",
       {{"stage", 3}, {"offload_param", {{"device", "none"}}}, {"offload_optimizer", {{"device", "none"}}}}},
      {"strata",
       {{"device_budget", "64MiB"},
        {"pinned_budget", "64MiB"},
        {"model", model_json(kShape)},
        {"data", {{"path", data.string()}, {"format", "text"}}},
        {"out_of_range", out_of_range},
        {"steps", 1}}}};
  if (precision == "fp16") j["fp16"] = {{"enabled", true}};
  if (precision == "bf16") j["bf16"] = {{"enabled", true}};
  return parse_config(j);
}

TrainOptions init_from(const std::string& dir) {
  TrainOptions o;
  o.quiet = true;
  o.init_from = dir;
  return o;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Element `index` of tensor `name` in a safetensors file written by export, as fp32.
float exported_value(const std::string& path, const std::string& name, uint64_t index) {
  const SafetensorsHeader h = read_safetensors_header(path);
  const SafetensorsTensor* t = h.find(name);
  if (!t) throw std::runtime_error("no tensor " + name + " in " + path);
  const DType dt = t->dtype == "F16" ? DType::F16 : t->dtype == "BF16" ? DType::BF16 : DType::F32;
  std::vector<char> raw(t->element_bytes);
  std::ifstream f(path, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(t->offset + index * t->element_bytes));
  f.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  float v = 0;
  convert_to_f32(&v, raw.data(), dt, 1);
  return v;
}

// A Hugging Face GPT2LMHeadModel directory of kShape: config.json and one F32
// model.safetensors holding `w` (GPT-2's names and Conv1D layout), with `value` at flat
// index `index` of the file's tensor `name`.
void write_hf(const fs::path& dir, const std::string& name, uint64_t index, float value) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << nlohmann::json{{"architectures", {"GPT2LMHeadModel"}},
                                                       {"model_type", "gpt2"},
                                                       {"n_layer", kShape.layers},
                                                       {"n_embd", kShape.d_model},
                                                       {"n_head", kShape.heads},
                                                       {"n_positions", kShape.seq_len},
                                                       {"vocab_size", kShape.vocab}}
                                            .dump();
  nlohmann::json header = nlohmann::json::object();
  std::vector<float> data;
  for (const GptGroup& g : gpt_groups(kShape))
    for (const GptTensor& t : g.tensors) {
      const uint64_t begin = data.size() * 4;
      for (uint64_t i = 0; i < t.numel(); ++i) data.push_back(0.02f * std::cos(0.11f * static_cast<float>(i)));
      if (t.name == name) data[begin / 4 + index] = value;
      header[t.name] = {{"dtype", "F32"}, {"shape", gpt2_shape(t)}, {"data_offsets", {begin, data.size() * 4}}};
    }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream f(dir / "model.safetensors", std::ios::binary);
  const uint64_t n = text.size();
  f.write(reinterpret_cast<const char*>(&n), 8);  // little-endian hosts only, as the format
  f << text;
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * 4));
}

struct Bad {
  std::string tensor;
  uint64_t index;
  float value;
  std::string shown;  // how the message prints the value
};

}  // namespace

TEST(WeightValues, ANonFiniteWeightInACheckpointIsNamedAtEveryLoad) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Bad> cases = {{"wte.weight", 5, std::nanf(""), "nan"},
                                  {"h.0.attn.c_attn.weight", 40, inf, "inf"},
                                  {"h.0.mlp.c_proj.bias", 3, -inf, "-inf"},
                                  {"ln_f.bias", 15, std::nanf(""), "nan"}};
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.tensor);
    Dir d("nonfinite");
    const std::string ck = write_checkpoint(d.p / "ckpt", weights(c.tensor, c.index, c.value));
    const std::string named = "tensor '" + c.tensor + "'";
    const std::string where = "the first " + c.shown + " at flat index " + std::to_string(c.index);
    const CheckpointInfo info = read_checkpoint_info(ck);
    const int g = tensor(gpt_groups(kShape), c.tensor).group;
    // sample and eval read every group this way; export too.
    for (const std::string& m :
         {error_of<ConfigError>([&] { read_checkpoint_group(info, g); }),
          error_of<ConfigError>([&] { export_safetensors(ck, (d.p / "m.safetensors").string(), false); }),
          error_of<ConfigError>([&] { train(run_config(d.p, "f32"), init_from(ck)); }),
          error_of<ConfigError>([&] {
            TrainOptions o;
            o.quiet = true;
            o.resume_from = ck;
            train(run_config(d.p, "f32"), o);
          })}) {
      EXPECT_TRUE(has(m, named) && has(m, where)) << m;
    }
    EXPECT_FALSE(fs::exists(d.p / "m.safetensors"));
    // The other groups read as they are.
    EXPECT_NO_THROW(read_checkpoint_group(info, g == 0 ? 1 : 0));
  }
}

TEST(WeightValues, ANonFiniteWeightIsRefusedAtImportWithTheFilesNameAndIndex) {
  const float inf = std::numeric_limits<float>::infinity();
  // h.0.attn.c_attn.weight is Conv1D [in, out] in the file: its index there is named.
  const std::vector<Bad> cases = {{"wte.weight", 7, std::nanf(""), "nan"},
                                  {"h.0.attn.c_attn.weight", 33, inf, "inf"},
                                  {"h.0.mlp.c_fc.weight", 200, -inf, "-inf"},
                                  {"ln_f.bias", 2, -inf, "-inf"}};
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.tensor);
    Dir d("import-nonfinite");
    write_hf(d.p / "hf", c.tensor, c.index, c.value);
    const std::string m = error_of<ConfigError>([&] { import_hf((d.p / "hf").string(), (d.p / "out").string()); });
    EXPECT_TRUE(has(m, "tensor '" + c.tensor + "'") &&
                has(m, "the first " + c.shown + " at flat index " + std::to_string(c.index)))
        << m;
    EXPECT_FALSE(fs::exists(d.p / "out" / "step-00000000"));
  }
}

TEST(WeightValues, Fp16RefusesWeightsBeyondItsRangeWhereverItNarrowsOrClampsThemWhenAsked) {
  // Token 0's embedding row: never an input of the byte-level text below.
  const std::vector<Bad> cases = {{"wte.weight", 3, 1e6f, "1e+06"},
                                  {"h.0.mlp.c_fc.weight", 100, -7e4f, "-70000"},
                                  {"ln_f.weight", 0, 65520.0f, "65520"}};
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.tensor);
    Dir d("range");
    const std::string ck = write_checkpoint(d.p / "ckpt", weights(c.tensor, c.index, c.value));
    const CheckpointInfo info = read_checkpoint_info(ck);
    const GptTensor t = tensor(gpt_groups(kShape), c.tensor);
    const std::string named = "tensor '" + c.tensor + "'";
    // Export names the index in the file it writes (GPT-2's Conv1D layout, [in, out]).
    const uint64_t file_index =
        t.transposed_in_gpt2 ? (c.index % t.shape[1]) * t.shape[0] + c.index / t.shape[1] : c.index;
    const std::string largest = "the largest in magnitude " + c.shown + " at flat index ";
    const std::string out = (d.p / "m.safetensors").string();
    const std::string exported = error_of<ConfigError>([&] { export_safetensors(ck, out, false, DType::F16); });
    EXPECT_TRUE(has(exported, largest + std::to_string(file_index)) && has(exported, "--clamp")) << exported;
    for (const std::string& m :
         {exported, error_of<ConfigError>([&] { read_checkpoint_group(info, t.group, DType::F16); }),  // eval fp16
          error_of<ConfigError>([&] { train(run_config(d.p, "fp16"), init_from(ck)); })}) {
      EXPECT_TRUE(has(m, named) && has(m, largest) && has(m, "fp16's largest finite value 65504")) << m;
      if (m != exported) EXPECT_TRUE(has(m, largest + std::to_string(c.index))) << m;
    }
    EXPECT_FALSE(fs::exists(out));
    // bf16 and f32 hold it.
    EXPECT_NO_THROW(export_safetensors(ck, out, false, DType::BF16));
    EXPECT_NO_THROW(read_checkpoint_group(info, t.group, DType::F32));
    // Asked for: clamped to fp16's largest finite value of its sign.
    export_safetensors(ck, out, true, DType::F16, OutOfRange::Clamp);
    EXPECT_EQ(exported_value(out, c.tensor, file_index), std::copysign(65504.0f, c.value));

    // Loaded into an fp16 engine (train's --init-from and --resume, the C API's
    // strata_load_checkpoint): refused, or clamped under strata.out_of_range = "clamp".
    for (const char* mode : {"refuse", "clamp"}) {
      const Config cfg = run_config(d.p, "fp16", mode);
      auto comm = coll::make_host_communicator(coll::HostBackend::Self);
      auto device = make_device({});
      std::vector<GroupSpec> specs;
      for (const GptGroup& g : gpt_groups(kShape)) specs.push_back({g.name, g.numel, InitKind::Normal, 0.02f, {}});
      ZeroEngine engine(*device, *comm, *comm, EngineOptions::from_config(cfg), specs);
      if (std::string(mode) == "refuse") {
        const std::string m = error_of<ConfigError>([&] { load_checkpoint_weights(engine, *comm, ck); });
        EXPECT_TRUE(has(m, named) && has(m, "strata.out_of_range")) << m;
      } else {
        load_checkpoint_weights(engine, *comm, ck);
        EXPECT_EQ(engine.gather_full_params(t.group)[t.offset + c.index], std::copysign(65504.0f, c.value));
      }
    }
  }
}

TEST(WeightValues, ImportAtFp16RefusesWeightsBeyondItsRangeOrClampsThem) {
  const std::vector<Bad> cases = {{"wte.weight", 9, 1e6f, "1e+06"},
                                  {"h.0.attn.c_proj.weight", 17, -3e38f, "-3e+38"},
                                  {"ln_f.bias", 1, 7e4f, "70000"}};
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.tensor);
    Dir d("import-range");
    write_hf(d.p / "hf", c.tensor, c.index, c.value);
    const std::string hf = (d.p / "hf").string();
    const std::string m = error_of<ConfigError>([&] { import_hf(hf, (d.p / "a").string(), DType::F16); });
    EXPECT_TRUE(has(m, "tensor '" + c.tensor + "'") && has(m, "the largest in magnitude " + c.shown) &&
                has(m, "at flat index " + std::to_string(c.index)) && has(m, "65504") && has(m, "--clamp"))
        << m;
    EXPECT_FALSE(fs::exists(d.p / "a" / "step-00000000"));
    // f32 and bf16 hold it; clamped where asked.
    EXPECT_NO_THROW(import_hf(hf, (d.p / "b").string(), DType::F32));
    EXPECT_NO_THROW(import_hf(hf, (d.p / "c").string(), DType::BF16));
    const ImportSummary s = import_hf(hf, (d.p / "d").string(), DType::F16, nullptr, OutOfRange::Clamp);
    const GptTensor t = tensor(gpt_groups(kShape), c.tensor);
    const uint64_t here = t.transposed_in_gpt2 ? (c.index % t.shape[0]) * t.shape[1] + c.index / t.shape[0] : c.index;
    EXPECT_EQ(read_checkpoint_group(read_checkpoint_info(s.checkpoint), t.group)[t.offset + here],
              std::copysign(65504.0f, c.value));
  }
}
