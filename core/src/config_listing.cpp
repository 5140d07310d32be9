// The key tables as text (config_keys.hpp): `strata train --list-keys` and the key lists
// of docs/configuration.md. Defaults are read from a default-constructed target through
// each row's field, so the listing shows the structs' own initialisers.
#include <algorithm>

#include "strata/core/config_keys.hpp"

namespace strata {

using nlohmann::json;

namespace {

// 50000000 -> "5e7": counts as DeepSpeed's configs write them; other numbers in full.
std::string whole_text(uint64_t n) {
  int e = 0;
  uint64_t m = n;
  while (m != 0 && m % 10 == 0) m /= 10, ++e;
  if (n >= 100000 && m < 100) return std::to_string(m) + "e" + std::to_string(e);
  return std::to_string(n);
}

// 1073741824 -> "1GiB": sizes in the largest binary unit that divides them.
std::string bytes_text(uint64_t n) {
  static const std::pair<const char*, int> kUnits[] = {{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}};
  for (const auto& [unit, shift] : kUnits)
    if (n != 0 && n % (uint64_t{1} << shift) == 0) return std::to_string(n >> shift) + unit;
  return std::to_string(n);
}

// A value of the key as the listing shows it.
std::string value_text(const ConfigKey& k, const json& v) {
  switch (k.type) {
    case KeyType::Boolean: return v.get<bool>() ? "true" : "false";
    case KeyType::Whole: return whole_text(v.get<uint64_t>());
    case KeyType::Float:
    case KeyType::Double: return config_number_text(v.get<double>());
    case KeyType::NumberPair:
      return "[" + config_number_text(v[0].get<double>()) + ", " + config_number_text(v[1].get<double>()) + "]";
    case KeyType::Text: {
      if (v.is_string()) return v.dump();
      for (const Choice& c : k.choices)
        if (c.value == v.get<int>()) return std::string("\"") + c.name + "\"";
      return v.dump();
    }
    case KeyType::Bytes: return bytes_text(v.get<uint64_t>());
    case KeyType::Paths:
    case KeyType::Any:
    case KeyType::Section: return v.dump();
  }
  return v.dump();
}

// The default column: the field's initial value, the value Strata is fixed at, or the
// row's own words where neither says it. `quoted`: values in backticks (markdown).
std::string default_text(const ConfigKey& k, const void* target, bool quoted) {
  auto q = [&](const std::string& s) { return quoted ? "`" + s + "`" : s; };
  if (k.fallback) return k.fallback;
  switch (k.use) {
    case KeyUse::NoEffect: return "—";
    case KeyUse::Fixed:
    case KeyUse::Refused: return q(k.only ? "true" : "false");
    case KeyUse::Used: break;
  }
  if (k.type == KeyType::Section || !k.field.load || !target) return "";
  const json v = k.field.load(target);
  return v.is_null() ? "unset" : q(value_text(k, v));
}

// The help line with what Strata does with the key when it is not simply used.
std::string meaning_text(const ConfigKey& k, bool markdown) {
  auto code = [&](bool b) { return markdown ? std::string(b ? "`true`" : "`false`") : std::string(b ? "true" : "false"); };
  std::string s = k.help;
  auto add = [&](const std::string& more) { s += (s.empty() ? "" : " ") + more; };
  switch (k.use) {
    case KeyUse::Used: break;
    case KeyUse::NoEffect: add(std::string(markdown ? "**No effect**" : "No effect") + ", with a warning: " + k.why + "."); break;
    case KeyUse::Fixed:
      add("Strata always behaves as " + code(k.only) + "; " + code(!k.only) + " has no effect, with a warning: " +
          k.why + ".");
      break;
    case KeyUse::Refused:
      add(code(!k.only) + " is refused, not supported yet: " + k.why + ".");
      break;
  }
  return s;
}

void* sub_target(const ConfigKey& k, void* target) { return k.enter && target ? k.enter(target) : target; }

void text_rows(const ConfigSection& s, void* target, std::string& out) {
  for (const ConfigKey& k : s.keys) {
    const std::string name = s.path.empty() ? std::string(k.name) : s.path + "." + k.name;
    if (k.type == KeyType::Section) {
      text_rows(*k.section, sub_target(k, target), out);
      continue;
    }
    const std::string def = default_text(k, target, false);
    out += name + ": " + accepted_text(k) + (def.empty() ? "" : "; default " + def) + "\n";
    out += "    " + meaning_text(k, false) + "\n";
  }
}

void markdown_rows(const ConfigSection& s, void* target, const std::string& prefix, std::string& out) {
  for (const ConfigKey& k : s.keys) {
    const std::string name = prefix + k.name;
    if (k.type == KeyType::Section && k.section->inline_in_parent) {
      markdown_rows(*k.section, sub_target(k, target), name + ".", out);
      continue;
    }
    const std::string type = k.type == KeyType::Section ? "object" : accepted_text(k);
    out += "| `" + name + "` | " + type + " | " + default_text(k, target, true) + " | " + meaning_text(k, true) + " |\n";
  }
}

void collect_sections(const ConfigSection& s, std::vector<std::string>& out) {
  for (const ConfigKey& k : s.keys) {
    if (k.type != KeyType::Section) continue;
    if (!k.section->inline_in_parent) out.push_back(k.section->path);
    collect_sections(*k.section, out);
  }
}

}  // namespace

std::string keys_text(const ConfigSection& root, void* root_defaults) {
  std::string out;
  text_rows(root, root_defaults, out);
  return out;
}

std::string keys_markdown(const ConfigSection& root, void* root_defaults, std::string_view path) {
  void* target = nullptr;
  const ConfigSection* s = find_section(root, path, root_defaults, &target);
  if (!s) throw ConfigError("no config section '" + std::string(path) + "'");
  std::string out = "| key | type | default | meaning |\n| --- | --- | --- | --- |\n";
  markdown_rows(*s, target, "", out);
  return out;
}

std::vector<std::string> markdown_sections(const ConfigSection& root) {
  std::vector<std::string> out = {root.path};
  collect_sections(root, out);
  return out;
}

}  // namespace strata
