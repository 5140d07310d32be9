// The configuration's keys as tables, one row per key and one table per section, in the
// manner of fio's options.c: a row says the key's name, the JSON it takes, its accepted
// range or strings, its help line, what Strata does with it and where its value goes.
// Everything that knows a key walks the tables: the parser (unknown keys with the
// nearest valid one, types and ranges, keys that warn or are refused, checks across
// keys), the listing of `strata train --list-keys`, and docs/configuration.md's key
// lists (a test compares the page with keys_markdown). No key is spelled twice.
//
// The tables live beside the structs they fill (runtime/src/config/config_table.cpp for the run
// configuration, offload/src/aio_config.cpp for `aio`); this file is what they share, so
// that a whole number is read the same way in every section (5e7 is one wherever a
// count is taken). Defaults are the structs' own initialisers: the listing reads them
// from a default-constructed struct through the row's field, so they too are written
// once.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"

namespace strata {

// s with ASCII letters in lower case: a value read without regard to case (environment
// variables such as STRATA_CPU_SGEMM).
std::string ascii_lower(std::string_view s);

// Edit distance between two keys.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest `key`, or "" when the list is empty.
std::string nearest_key(std::string_view key, const std::vector<std::string>& candidates);

// Throws ConfigError: "unknown config key '<section>.<key>': did you mean '<nearest>'? valid keys are ..."
[[noreturn]] void throw_unknown_key(std::string_view section, std::string_view key,
                                    const std::vector<std::string>& candidates);

// Throws ConfigError: "<key> = <value> is invalid: expected <accepted>", with a hint for
// the HuggingFace Trainer's "auto" placeholder.
[[noreturn]] void throw_bad_value(const std::string& key, const nlohmann::json& v, const std::string& accepted);

// A key's byte count: a JSON whole number, or a string parse_byte_count reads
// (core/byte_count.hpp: "512MiB", "2GB", "5G", "1e9"). Throws ConfigError naming the key.
uint64_t parse_bytes(const nlohmann::json& v, const std::string& key);

// The shortest text that reads back as x, or as the float x holds exactly: "0.001",
// "1e-8", "0.9" (for 0.9f too).
std::string config_number_text(double x);

// The JSON a key takes.
enum class KeyType {
  Boolean,     // true or false
  Whole,       // an integer, or a number with no fraction (DeepSpeed writes counts as 5e7)
  Float,       // a number, range-checked after narrowing to float (the field is a float)
  Double,      // a number, kept in double
  NumberPair,  // [a, b], each a number in the row's range, checked as a float
  Text,        // a string; with `choices`, one of them
  Bytes,       // a whole number of bytes, or a string such as "512MiB" (parse_bytes, byte_count.hpp)
  Paths,       // a directory, or a non-empty list of distinct directories
  Any,         // any JSON value, not checked (keys that only have to be accepted)
  Section,     // a JSON object with its own table
};

// What Strata does with a key that is given.
enum class KeyUse {
  Used,      // the value acts: stored through `field`, or read by the section's `check`
  NoEffect,  // a DeepSpeed key with no meaning in Strata: checked, then one warning says why
  Fixed,     // Strata always behaves as `only`; another value has no effect and warns why
  Refused,   // only `only` is accepted; another value is refused as not supported yet
};

// One checked value of a key; which member holds it follows the row's KeyType.
struct ConfigValue {
  KeyType type = KeyType::Any;
  bool flag = false;                // Boolean
  uint64_t whole = 0;               // Whole, Bytes
  double number = 0;                // Float, Double: as written (a Float key checked as a float)
  double pair[2] = {0, 0};          // NumberPair
  int choice = 0;                   // Text with choices: the matched Choice::value
  std::string text;                 // Text
  std::vector<std::string> paths;   // Paths

  // Stores the value into a field of the row's type. A row whose type or range does not
  // fit its field is a bug in the table, caught on first use.
  template <class T>
  void to(T& out) const;
  // A field's value as JSON, for the listing's default column (enums as their int).
  template <class T>
  static nlohmann::json from(const T& field);
};

// Where a Used key's value goes: `target` is the section's struct (ConfigSection).
struct KeyField {
  void (*store)(void* target, const ConfigValue& v) = nullptr;
  nlohmann::json (*load)(const void* target) = nullptr;  // the field's value (its default)
};

// The KeyField of `member` of a section whose target is `Target`.
#define STRATA_CONFIG_FIELD(Target, member)                                                                   \
  ::strata::KeyField {                                                                                        \
    [](void* t, const ::strata::ConfigValue& v) { v.to(static_cast<Target*>(t)->member); },                 \
        [](const void* t) { return ::strata::ConfigValue::from(static_cast<const Target*>(t)->member); } \
  }

struct Choice {
  const char* name;
  int value;  // stored into the field (an enum's value)
};

struct ConfigSection;

// One row of a table. Fields are in the order a row is written (designated initialisers).
struct ConfigKey {
  const char* name = "";
  KeyType type = KeyType::Any;
  // The accepted range, by type:
  uint64_t min = 0, max = UINT64_MAX;  // Whole: [min, max]
  bool power_of_two = false;           // Whole
  double lo = -HUGE_VAL, hi = HUGE_VAL;  // Float, Double, NumberPair
  bool lo_open = false, hi_open = false;
  std::vector<Choice> choices = {};    // Text: the accepted strings
  bool ignore_case = false;            // Text: choices match in any case
  bool nullable = false;               // null reads as not given (DeepSpeed's None)
  const char* accepted = nullptr;      // replaces the generated description of the range
  const char* note = nullptr;          // added to it, in parentheses
  const char* fallback = nullptr;      // the default, where the field's own does not say it
  const char* help = "";               // one line: what the key does
  KeyUse use = KeyUse::Used;
  bool only = false;                   // Fixed, Refused (Boolean keys): the value Strata has
  const char* why = nullptr;           // NoEffect, Fixed, Refused: the reason, for the message
  KeyField field = {};                 // Used: where the value goes (none: the check reads it)
  const ConfigSection* section = nullptr;  // Section: its table
  void* (*enter)(void* target) = nullptr;  // Section: its target, when not the parent's
};

// One table: the keys of one JSON object of the configuration.
struct ConfigSection {
  std::string path;                 // dotted, "" for the top level: "zero_optimization.offload_param"
  std::vector<ConfigKey> keys;
  // Checks across keys (and values that depend on other keys), once every key of the
  // section, nested sections included, has been read; j is the section's JSON.
  void (*check)(const nlohmann::json& j, void* target) = nullptr;
  bool inline_in_parent = false;    // listed within the parent's table as "section.key"
};

// Reads j into target through the table: unknown keys, then each given key in the
// table's order (nested sections recursively), then the section's check. Warnings for
// keys without effect are appended to `warnings`, one per key.
void parse_section(const ConfigSection& s, const nlohmann::json& j, void* target, std::vector<std::string>& warnings);

// The value v given for the row k (the dotted key names it in errors), checked against
// the row's type and range. parse_section reads every key with it.
ConfigValue read_key(const ConfigKey& k, const std::string& key, const nlohmann::json& v);

// "a whole number >= 1", "one of ...": what the key accepts, as its error says it.
std::string accepted_text(const ConfigKey& k);

// The table of the section at `path` (dotted from the top, as ConfigSection::path) at or
// under root, and its target within root_target; nullptr when there is none.
const ConfigSection* find_section(const ConfigSection& root, std::string_view path, void* root_target,
                                  void** target = nullptr);

// The listing: every key under root, with type, default (read from root_defaults, a
// default-constructed target) and help. keys_text is for a terminal; keys_markdown is
// one section's table for the docs (nested inline sections flattened, the others
// referred to).
std::string keys_text(const ConfigSection& root, void* root_defaults);
std::string keys_markdown(const ConfigSection& root, void* root_defaults, std::string_view path);
// The paths of the sections with a table of their own in keys_markdown.
std::vector<std::string> markdown_sections(const ConfigSection& root);

// ---- ConfigValue's conversions ------------------------------------------------------

namespace detail {
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
}  // namespace detail

template <class T>
void ConfigValue::to(T& out) const {
  if constexpr (detail::is_optional<T>::value) {
    typename T::value_type v{};
    to(v);
    out = v;
  } else if constexpr (std::is_same_v<T, bool>) {
    STRATA_CHECK(type == KeyType::Boolean, "config table: a non-boolean key stored into a bool");
    out = flag;
  } else if constexpr (std::is_enum_v<T>) {
    STRATA_CHECK(type == KeyType::Text, "config table: a non-choice key stored into an enum");
    out = static_cast<T>(choice);
  } else if constexpr (std::is_integral_v<T>) {
    STRATA_CHECK(type == KeyType::Whole || type == KeyType::Bytes, "config table: a non-whole key stored into an integer");
    STRATA_CHECK(whole <= static_cast<uint64_t>(std::numeric_limits<T>::max()),
                 "config table: a key's max exceeds its field's type");
    out = static_cast<T>(whole);
  } else if constexpr (std::is_floating_point_v<T>) {
    STRATA_CHECK(type == KeyType::Float || type == KeyType::Double, "config table: a non-number key stored into a float");
    out = static_cast<T>(number);
  } else if constexpr (std::is_same_v<T, std::string>) {
    STRATA_CHECK(type == KeyType::Text, "config table: a non-string key stored into a string");
    out = text;
  } else {
    static_assert(std::is_same_v<T, std::vector<std::string>>, "no conversion from a config value to this field");
    STRATA_CHECK(type == KeyType::Paths, "config table: a non-path key stored into a list of paths");
    out = paths;
  }
}

template <class T>
nlohmann::json ConfigValue::from(const T& field) {
  if constexpr (detail::is_optional<T>::value) {
    return field ? from(*field) : nlohmann::json();
  } else if constexpr (std::is_enum_v<T>) {
    return static_cast<int>(field);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return field.empty() ? nlohmann::json() : nlohmann::json(field);
  } else {
    return field;
  }
}

}  // namespace strata
