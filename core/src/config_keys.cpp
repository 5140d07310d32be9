// Reading a configuration through its key tables (config_keys.hpp): the value readers
// every section shares and the walk over a table. The listing is config_listing.cpp.
#include "strata/core/config_keys.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <numeric>
#include <set>

#include "strata/core/byte_count.hpp"

namespace strata {

using nlohmann::json;

std::string ascii_lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  std::iota(prev.begin(), prev.end(), size_t{0});
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest_key(std::string_view key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    size_t d = edit_distance(key, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

void throw_unknown_key(std::string_view section, std::string_view key, const std::vector<std::string>& candidates) {
  std::string full = section.empty() ? std::string(key) : std::string(section) + "." + std::string(key);
  std::string msg = "unknown config key '" + full + "'";
  if (!candidates.empty()) {
    msg += ": did you mean '" + nearest_key(key, candidates) + "'? valid keys are";
    for (size_t i = 0; i < candidates.size(); ++i) msg += (i ? ", " : " ") + candidates[i];
  }
  throw ConfigError(msg);
}

void throw_bad_value(const std::string& key, const json& v, const std::string& accepted) {
  std::string msg = key + " = " + v.dump() + " is invalid: expected " + accepted;
  // HuggingFace's DeepSpeed integration writes "auto" and fills it in before DeepSpeed
  // reads the file; a config copied from there reaches us with the placeholder intact.
  if (v.is_string() && v.get_ref<const std::string&>() == "auto")
    msg += " (\"auto\" is a placeholder the HuggingFace Trainer fills in; give the value itself)";
  throw ConfigError(msg);
}

namespace {

std::string whole_range_text(uint64_t lo, uint64_t hi) {
  if (hi == UINT64_MAX) return "a whole number >= " + std::to_string(lo);
  if (hi == uint64_t(INT_MAX)) return "a whole number >= " + std::to_string(lo) + " (at most " + std::to_string(hi) + ")";
  return "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
}

// Whole numbers. DeepSpeed's configs write element counts as 5e7, which JSON parsers
// read as floating point, so a float with no fractional part is a whole number here.
// Booleans and strings are refused: `true` or "8" as a count is a mistake, not a choice.
uint64_t read_whole(const std::string& key, const json& v, uint64_t lo, uint64_t hi, const std::string& accepted) {
  uint64_t x = 0;
  if (v.is_number_unsigned()) {
    x = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s < 0) throw_bad_value(key, v, accepted);
    x = static_cast<uint64_t>(s);
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    // 2^64 itself does not fit; converting it would be undefined.
    if (!(d >= 0.0 && d < 18446744073709551616.0) || d != std::floor(d)) throw_bad_value(key, v, accepted);
    x = static_cast<uint64_t>(d);
  } else {
    throw_bad_value(key, v, accepted);
  }
  if (x < lo || x > hi) throw_bad_value(key, v, accepted);
  return x;
}

// A number in the key's range, as written. Float and NumberPair keys fill float fields,
// so the range is checked on the value narrowed to float: 1e300 (infinite as a float),
// 1e-50 (zero) or a beta of 0.999999999 (1) fail like any other value out of range.
double read_number(const ConfigKey& k, const std::string& key, const json& v, const std::string& accepted) {
  if (!v.is_number()) throw_bad_value(key, v, accepted);
  const double x = v.get<double>();
  const double stored = k.type == KeyType::Double ? x : static_cast<double>(static_cast<float>(x));
  const bool in_range = std::isfinite(stored) && (k.lo_open ? stored > k.lo : stored >= k.lo) &&
                        (k.hi_open ? stored < k.hi : stored <= k.hi);
  if (!in_range) throw_bad_value(key, v, accepted);
  return x;
}

bool same_text(std::string_view a, std::string_view b, bool ignore_case) {
  if (!ignore_case) return a == b;
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::vector<std::string> read_paths(const std::string& key, const json& v, const std::string& accepted) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array() && !v.empty()) {
    for (const auto& e : v) {
      if (!e.is_string()) throw_bad_value(key, v, accepted);
      out.push_back(e.get<std::string>());
    }
  } else {
    throw_bad_value(key, v, accepted);
  }
  std::set<std::string> seen;
  for (const auto& p : out) {
    if (p.empty()) throw_bad_value(key, v, accepted);
    if (!seen.insert(p).second) throw ConfigError(key + " lists '" + p + "' twice: list each directory once");
  }
  return out;
}

}  // namespace

ConfigValue read_key(const ConfigKey& k, const std::string& key, const json& v) {
  ConfigValue out;
  out.type = k.type;
  const std::string accepted = accepted_text(k);
  switch (k.type) {
    case KeyType::Boolean:
      if (!v.is_boolean()) throw_bad_value(key, v, accepted);
      out.flag = v.get<bool>();
      break;
    case KeyType::Whole:
      out.whole = read_whole(key, v, k.min, k.max, accepted);
      if (k.power_of_two && (out.whole & (out.whole - 1)) != 0) throw_bad_value(key, v, accepted);
      break;
    case KeyType::Float:
    case KeyType::Double:
      out.number = read_number(k, key, v, accepted);
      break;
    case KeyType::NumberPair:
      if (!v.is_array() || v.size() != 2) throw_bad_value(key, v, accepted);
      for (size_t i = 0; i < 2; ++i) out.pair[i] = read_number(k, key, v[i], accepted);
      break;
    case KeyType::Text: {
      // A string of the wrong JSON type says so; a string not among the choices lists them.
      if (!v.is_string()) throw_bad_value(key, v, "a string");
      out.text = v.get<std::string>();
      if (k.choices.empty()) break;
      auto c = std::find_if(k.choices.begin(), k.choices.end(),
                            [&](const Choice& c) { return same_text(out.text, c.name, k.ignore_case); });
      if (c == k.choices.end()) throw_bad_value(key, v, accepted);
      out.choice = c->value;
      break;
    }
    case KeyType::Bytes:
      out.whole = parse_bytes(v, key);
      break;
    case KeyType::Paths:
      out.paths = read_paths(key, v, accepted);
      break;
    case KeyType::Any:
      break;
    case KeyType::Section:
      STRATA_CHECK(false, "config table: a section read as a value");
  }
  return out;
}

namespace {

// ">= 0", "from 0 to 1", "in [0, 1)"; "" when the range is unbounded.
std::string number_range_text(const ConfigKey& k) {
  const bool has_lo = std::isfinite(k.lo), has_hi = std::isfinite(k.hi);
  if (!has_lo && !has_hi) return "";
  if (!has_hi) return (k.lo_open ? "> " : ">= ") + config_number_text(k.lo);
  if (!has_lo) return (k.hi_open ? "< " : "<= ") + config_number_text(k.hi);
  if (!k.lo_open && !k.hi_open) return "from " + config_number_text(k.lo) + " to " + config_number_text(k.hi);
  return std::string("in ") + (k.lo_open ? "(" : "[") + config_number_text(k.lo) + ", " + config_number_text(k.hi) +
         (k.hi_open ? ")" : "]");
}

std::string choices_text(const std::vector<Choice>& choices) {
  std::string s;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i) s += i + 1 == choices.size() ? " or " : ", ";
    s += std::string("\"") + choices[i].name + "\"";
  }
  return s;
}

}  // namespace

std::string config_number_text(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  // A float field's value arrives widened to double (0.9f as 0.89999997615814209):
  // a value a float holds exactly is written as that float's shortest text.
  char buf[64];
  const float f = static_cast<float>(x);
  char* end = static_cast<double>(f) == x ? std::to_chars(buf, buf + sizeof buf, f).ptr
                                          : std::to_chars(buf, buf + sizeof buf, x).ptr;
  std::string s(buf, end);
  // to_chars writes 1e-08; the docs and messages write 1e-8.
  size_t e = s.find('e');
  if (e != std::string::npos) {
    size_t digits = e + 1 + (s[e + 1] == '-' || s[e + 1] == '+');
    if (s[e + 1] == '+') s.erase(e + 1, 1), --digits;
    while (digits + 1 < s.size() && s[digits] == '0') s.erase(digits, 1);
  }
  return s;
}

uint64_t parse_bytes(const json& v, const std::string& key) {
  // JSON reads 1e30 as a double; past 2^64 it is too large, not malformed.
  if (v.is_number_float() && v.get<double>() >= 18446744073709551616.0)
    throw ConfigError(key + " = " + v.dump() + " " + byte_count_too_large_text());
  if (v.is_number()) return read_whole(key, v, 0, UINT64_MAX, byte_count_forms());
  if (!v.is_string()) throw_bad_value(key, v, byte_count_forms());
  return parse_byte_count(v.get_ref<const std::string&>(), key);
}

std::string accepted_text(const ConfigKey& k) {
  std::string s;
  if (k.accepted) {
    s = k.accepted;
  } else {
    switch (k.type) {
      case KeyType::Boolean: s = "true or false"; break;
      case KeyType::Whole:
        s = k.power_of_two ? "a power of two from " + std::to_string(k.min) + " to " + std::to_string(k.max)
                           : whole_range_text(k.min, k.max);
        break;
      case KeyType::Float:
      case KeyType::Double: {
        std::string r = number_range_text(k);
        s = r.empty() ? "a number" : "a number " + r;
        break;
      }
      case KeyType::NumberPair: {
        std::string r = number_range_text(k);
        s = r.empty() ? "a list of two numbers" : "a list of two numbers, each " + r;
        break;
      }
      case KeyType::Text: s = k.choices.empty() ? "a string" : choices_text(k.choices); break;
      case KeyType::Bytes: s = byte_count_forms(); break;
      case KeyType::Paths: s = "a directory path or a non-empty list of directory paths"; break;
      case KeyType::Any: s = "any JSON value"; break;
      case KeyType::Section: s = "a JSON object"; break;
    }
  }
  if (k.note) s += std::string(" (") + k.note + ")";
  if (k.nullable) s += ", or null";
  return s;
}

void parse_section(const ConfigSection& s, const json& j, void* target, std::vector<std::string>& warnings) {
  if (!j.is_object()) throw_bad_value(s.path.empty() ? "the config's top level" : s.path, j, "a JSON object");
  // Every key is checked against the table before any value is read, so a typo is
  // reported as such rather than as a missing value elsewhere.
  for (const auto& item : j.items()) {
    const std::string& name = item.key();
    bool known = std::any_of(s.keys.begin(), s.keys.end(), [&](const ConfigKey& k) { return name == k.name; });
    if (known) continue;
    std::vector<std::string> names;
    for (const auto& k : s.keys) names.emplace_back(k.name);
    throw_unknown_key(s.path, name, names);
  }
  for (const ConfigKey& k : s.keys) {
    auto it = j.find(k.name);
    if (it == j.end() || (k.nullable && it->is_null())) continue;
    const std::string key = s.path.empty() ? std::string(k.name) : s.path + "." + k.name;
    if (k.type == KeyType::Section) {
      STRATA_CHECK(k.section && k.section->path == key, "config table: section '" + key + "' has the wrong path");
      parse_section(*k.section, *it, k.enter ? k.enter(target) : target, warnings);
      continue;
    }
    const ConfigValue v = read_key(k, key, *it);
    switch (k.use) {
      case KeyUse::Used:
        if (k.field.store) k.field.store(target, v);
        break;
      case KeyUse::NoEffect:
        warnings.push_back(key + " has no effect: " + k.why);
        break;
      case KeyUse::Fixed:
        STRATA_CHECK(k.type == KeyType::Boolean, "config table: " + key + " is Fixed but not a boolean");
        if (v.flag != k.only) warnings.push_back(key + " = " + it->dump() + " has no effect: " + k.why);
        break;
      case KeyUse::Refused:
        STRATA_CHECK(k.type == KeyType::Boolean, "config table: " + key + " is Refused but not a boolean");
        if (v.flag != k.only)
          throw ConfigError(key + " = " + it->dump() + " is not supported yet: " + k.why + ": set " + key + " to " +
                            (k.only ? "true" : "false") + " or remove it");
        break;
    }
  }
  if (s.check) s.check(j, target);
}

const ConfigSection* find_section(const ConfigSection& root, std::string_view path, void* root_target,
                                  void** target) {
  const ConfigSection* s = &root;
  void* t = root_target;
  // `path` is dotted from the top, as the sections' own paths are.
  if (!root.path.empty()) {
    if (!path.starts_with(root.path)) return nullptr;
    path.remove_prefix(root.path.size());
    if (!path.empty() && !path.starts_with(".")) return nullptr;
    if (!path.empty()) path.remove_prefix(1);
  }
  while (!path.empty()) {
    size_t dot = path.find('.');
    std::string_view name = path.substr(0, dot);
    path = dot == std::string_view::npos ? std::string_view() : path.substr(dot + 1);
    auto k = std::find_if(s->keys.begin(), s->keys.end(),
                          [&](const ConfigKey& k) { return k.type == KeyType::Section && name == k.name; });
    if (k == s->keys.end()) return nullptr;
    if (k->enter && t) t = k->enter(t);
    s = k->section;
  }
  if (target) *target = t;
  return s;
}

}  // namespace strata
