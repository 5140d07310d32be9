// One logger with levels, so every message passes one filter. Level from STRATA_LOG
// (error, warn, info, debug; default info). The hot path does not log.
#pragma once

#include <string_view>

namespace strata::log {

enum class Level { Error = 0, Warn = 1, Info = 2, Debug = 3 };

Level level();
void set_level(Level l);
void write(Level l, std::string_view msg);

inline void error(std::string_view m) { write(Level::Error, m); }
inline void warn(std::string_view m) { write(Level::Warn, m); }
inline void info(std::string_view m) { write(Level::Info, m); }
inline void debug(std::string_view m) {
  if (level() >= Level::Debug) write(Level::Debug, m);
}

// Prints a warning only the first time a given key is seen (e.g. "mlock refused").
void warn_once(std::string_view key, std::string_view msg);

}  // namespace strata::log
