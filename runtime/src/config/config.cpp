// Loading the run configuration (config.hpp, docs/configuration.md): the file, the
// overrides, and the checks that need the world size. The keys themselves, with their
// types, ranges and checks across keys, are the tables of config_table.cpp, read by
// core/config_keys.hpp's parser.
#include "strata/runtime/config/config.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <string_view>
#include <utility>

#include "strata/core/config_keys.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"
#include "strata/core/safe_io.hpp"

namespace strata {

using nlohmann::json;

const char* to_string(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::None: return "none";
    case OffloadDevice::Cpu: return "cpu";
    case OffloadDevice::Nvme: return "nvme";
  }
  return "?";
}

Tier home_tier(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::None: return Tier::Device;
    case OffloadDevice::Cpu: return Tier::Pinned;
    case OffloadDevice::Nvme: return Tier::Nvme;
  }
  return Tier::Device;
}

namespace {

// The byte offset (0-based) of a parse error as 1-based line and column.
std::pair<size_t, size_t> line_col(const std::string& text, size_t offset) {
  offset = std::min(offset, text.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < offset; ++i)
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  return {line, offset - line_start + 1};
}

}  // namespace

json model_json(const ModelShape& s) {
  json m = {{"arch", arch_name(s.arch)}, {"layers", s.layers}, {"d_model", s.d_model}, {"heads", s.heads},
            {"seq_len", s.seq_len}, {"vocab", s.vocab}};
  if (s.llama()) {
    m["kv_heads"] = s.kv();
    m["ffn"] = s.ffn_dim();
    m["rope_theta"] = s.rope_theta;
    m["norm_eps"] = s.norm_eps;
    m["tied_head"] = s.tied_head;
  }
  return m;
}

Config parse_config(const json& j) {
  Config c;
  c.raw = j;
  parse_section(config_table(), j, &c, c.warnings);
  // Logged here, once per process and key, so every way in (the CLI, the C API and the
  // Python module over it) says it; tests read Config::warnings.
  for (const auto& w : c.warnings) log::warn_once(w, w);
  return c;
}

std::string config_keys_text() {
  Config defaults;
  return keys_text(config_table(), &defaults);
}

std::string config_keys_markdown(std::string_view section) {
  Config defaults;
  return keys_markdown(config_table(), &defaults, section);
}

std::vector<std::string> config_doc_sections() { return markdown_sections(config_table()); }

json load_config_json(const std::string& path) {
  // A FIFO, a device or a file far larger than any config is refused before it is read.
  return parse_config_text(read_input_file(path, "config file", kMaxConfigBytes), path);
}

json parse_config_text(const std::string& text, const std::string& path) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw ConfigError("config file '" + path + "' is empty: it must hold a JSON object, e.g. "
                      "{\"train_micro_batch_size_per_gpu\": 1}");

  // Duplicate keys: JSON leaves the winner to the parser (nlohmann keeps the last,
  // others the first), and DeepSpeed rejects them, so a repeated key is an error.
  struct Frame {
    std::string name;
    bool object;
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Frame> frames;
  auto dotted = [&](const std::string& leaf) {
    std::string p;
    for (size_t i = 1; i < frames.size(); ++i) p += frames[i].name + (frames[i].object ? "." : "");
    return p + leaf;
  };
  json::parser_callback_t on_event = [&](int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: {
        std::string name = frames.empty() ? "" : frames.back().object ? frames.back().last_key : "[]";
        frames.push_back({name, ev == json::parse_event_t::object_start, {}, {}});
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& k = parsed.get_ref<const std::string&>();
        if (!frames.back().keys.insert(k).second)
          throw ConfigError("config file '" + path + "': key '" + dotted(k) + "' appears twice: keep only one");
        frames.back().last_key = k;
        break;
      }
      default:
        break;
    }
    return true;
  };

  // Nesting is bounded before parsing: the parser's output is walked recursively.
  size_t deep_at = 0;
  if (json_nesting_depth(text, kMaxJsonDepth, &deep_at) > kMaxJsonDepth) {
    auto [line, col] = line_col(text, deep_at);
    throw ConfigError("config file '" + path + "' nests objects and arrays more than " +
                      std::to_string(kMaxJsonDepth) + " deep (at line " + std::to_string(line) + ", column " +
                      std::to_string(col) + "): a Strata config is a few levels deep; check the file");
  }

  json j;
  try {
    j = json::parse(text, on_event);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based: the position of the character the parser stopped at.
    auto [line, col] = line_col(text, e.byte > 0 ? e.byte - 1 : 0);
    std::string detail = e.what();
    size_t colon = detail.find(": ", detail.find("parse error"));
    if (colon != std::string::npos) detail = detail.substr(colon + 2);
    throw ConfigError("config file '" + path + "' is not valid JSON at line " + std::to_string(line) +
                      ", column " + std::to_string(col) + ": " + detail);
  } catch (const json::exception& e) {
    // out_of_range 406: a number beyond a double's range (1e400).
    std::string detail = e.what();
    if (size_t b = detail.find("] "); b != std::string::npos) detail = detail.substr(b + 2);
    throw ConfigError("config file '" + path + "' cannot be read: " + detail +
                      "; numbers must fit a double (magnitude at most about 1.8e308)");
  }
  return j;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  json j = load_config_json(path);
  for (const auto& o : overrides) apply_override(j, o);
  try {
    return parse_config(j);
  } catch (const ConfigError& e) {
    throw ConfigError("config file '" + path + "'" + (overrides.empty() ? "" : " with the overrides") + ": " +
                      e.what());
  }
}

void apply_override(json& j, const std::string& assignment) {
  const std::string example = "write key=value, e.g. zero_optimization.stage=2";
  const char* why = "";
  const uint64_t bad = first_non_text(reinterpret_cast<const unsigned char*>(assignment.data()), assignment.size(), &why);
  if (bad != assignment.size())
    throw ConfigError("override '" + assignment.substr(0, bad) + "...' is not UTF-8 text: its byte " +
                      std::to_string(bad + 1) + " " + why + "; give keys and values as UTF-8");
  size_t eq = assignment.find('=');
  if (eq == std::string::npos)
    throw ConfigError("override '" + assignment + "' has no '=': " + example);
  std::string path = assignment.substr(0, eq);
  std::string text = assignment.substr(eq + 1);

  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const auto& p : parts)
    if (p.empty()) throw ConfigError("override '" + assignment + "' has an empty key name: " + example);

  if (j.is_null()) j = json::object();
  if (!j.is_object()) throw ConfigError("cannot apply override '" + assignment + "': the config is not a JSON object");
  json* cur = &j;
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked += (i ? "." : "") + parts[i];
    json& next = (*cur)[parts[i]];
    if (next.is_null()) next = json::object();
    if (!next.is_object())
      throw ConfigError("cannot apply override '" + assignment + "': '" + walked + "' is " + next.dump() +
                        ", not a section");
    cur = &next;
  }
  // A value that parses as JSON is taken as such (2, true, [..], "quoted"); anything
  // else is a plain string (nvme, 2GiB, /local_nvme).
  if (json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth)
    throw ConfigError("override '" + assignment + "' nests more than " + std::to_string(kMaxJsonDepth) +
                      " deep: give a plain value");
  json value = parse_untrusted_json(text);
  if (value.is_discarded()) value = text;
  (*cur)[parts.back()] = std::move(value);
}

void validate_for_world(const Config& c, int world_size) {
  STRATA_CHECK(world_size >= 1, "world size " + std::to_string(world_size));
  if (const int n = c.zero.mics_groups_of(); n > 0 && (n > world_size || world_size % n != 0))
    throw ConfigError("zero_optimization.mics_shard_size " + std::to_string(n) + " does not divide the world size " +
                      std::to_string(world_size) + ": give a divisor of " + std::to_string(world_size) +
                      " (the ranks of one group), or -1 to shard over every rank");
  if (const uint64_t h = c.zero.zero_hpz_partition_size; h > 1 && (h > uint64_t(world_size) || world_size % h != 0))
    throw ConfigError("zero_optimization.zero_hpz_partition_size " + std::to_string(h) +
                      " does not divide the world size " + std::to_string(world_size) + ": give a divisor of " +
                      std::to_string(world_size) + " (the ranks of a node), or 1 (off)");
  if (c.strata.ranks_per_node > 0 && world_size % c.strata.ranks_per_node != 0)
    throw ConfigError("strata.ranks_per_node " + std::to_string(c.strata.ranks_per_node) +
                      " does not divide the world size " + std::to_string(world_size) + ": give a divisor of " +
                      std::to_string(world_size) + ", or 0 to take the launcher's hosts");
  if (!c.train_batch_size) return;
  const int64_t micro = c.train_micro_batch_size_per_gpu, accum = c.gradient_accumulation_steps;
  const int64_t product = micro * accum * world_size;
  const int64_t tbs = *c.train_batch_size;
  if (tbs == product) return;
  std::string msg = "train_batch_size = " + std::to_string(tbs) +
                    " does not match train_micro_batch_size_per_gpu * gradient_accumulation_steps * world size = " +
                    std::to_string(micro) + " * " + std::to_string(accum) + " * " + std::to_string(world_size) +
                    " = " + std::to_string(product) + ": ";
  if (tbs % (micro * world_size) == 0)
    msg += "set gradient_accumulation_steps to " + std::to_string(tbs / (micro * world_size)) +
           ", or remove train_batch_size";
  else
    msg += "make train_batch_size a multiple of train_micro_batch_size_per_gpu * world size (" +
           std::to_string(micro * world_size) + "), or remove it";
  throw ConfigError(msg);
}

}  // namespace strata
