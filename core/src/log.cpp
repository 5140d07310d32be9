#include "strata/core/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "strata/core/error.hpp"

namespace strata::log {

namespace {
Level initial_level() {
  const char* env = std::getenv("STRATA_LOG");
  if (!env) return Level::Info;
  std::string s(env);
  if (s == "error") return Level::Error;
  if (s == "warn") return Level::Warn;
  if (s == "debug") return Level::Debug;
  return Level::Info;
}
std::atomic<Level> g_level{initial_level()};
std::mutex g_mu;
std::set<std::string, std::less<>> g_once;
}  // namespace

Level level() { return g_level.load(std::memory_order_relaxed); }
void set_level(Level l) { g_level.store(l); }

void write(Level l, std::string_view msg) {
  if (l > level()) return;
  static const char* names[] = {"error", "warn", "info", "debug"};
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "strata[%d] %s: %.*s\n", process_rank(), names[static_cast<int>(l)],
               static_cast<int>(msg.size()), msg.data());
}

void warn_once(std::string_view key, std::string_view msg) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_once.emplace(key).second) return;
  }
  warn(msg);
}

}  // namespace strata::log
