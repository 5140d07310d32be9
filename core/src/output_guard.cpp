#include "strata/core/output_guard.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <optional>

#include "strata/core/error.hpp"

namespace strata {

namespace fs = std::filesystem;

namespace {

// What a path is for the comparison: its device and inode when it exists, else the name
// it resolves to.
struct Identity {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string resolved;  // absolute, `..` and existing links resolved
};

std::string fd_target(int fd) {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
  return ec ? "descriptor " + std::to_string(fd) : p.string();
}

// nullopt: nothing to compare (no path, or a descriptor that is not a regular file).
std::optional<Identity> identify(const RunPath& p) {
  Identity id;
  struct stat st {};
  if (p.fd >= 0) {
    if (::fstat(p.fd, &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
    id.exists = true;
    id.dev = st.st_dev;
    id.ino = st.st_ino;
    return id;
  }
  if (p.path.empty()) return std::nullopt;
  if (::stat(p.path.c_str(), &st) == 0) {
    id.exists = true;
    id.dev = st.st_dev;
    id.ino = st.st_ino;
    return id;
  }
  std::error_code ec;
  fs::path abs = fs::absolute(fs::path(p.path), ec);
  fs::path r = fs::weakly_canonical(abs, ec);
  if (ec) r = abs.lexically_normal();
  id.resolved = r.string();
  // "dir/" and "dir" name one directory.
  while (id.resolved.size() > 1 && id.resolved.back() == '/') id.resolved.pop_back();
  return id;
}

bool same(const Identity& a, const Identity& b) {
  if (a.exists != b.exists) return false;
  if (a.exists) return a.dev == b.dev && a.ino == b.ino;
  return a.resolved == b.resolved;
}

std::string named(const RunPath& p) {
  return p.fd >= 0 ? p.what + " (redirected to '" + fd_target(p.fd) + "')" : p.what + " '" + p.path + "'";
}

std::string fix_for(const RunPath& out) {
  return out.fd >= 0 ? "redirect " + out.what + " to another file" : "give " + out.what + " a path of its own";
}

}  // namespace

RunPath standard_output() { return {"", "standard output", STDOUT_FILENO}; }

std::vector<RunPath> files_in(const std::string& dir, const std::string& what) {
  std::vector<RunPath> files;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) files.push_back({e.path().string(), what});
  return files;
}

void check_outputs_replace_no_input(const std::vector<RunPath>& inputs, const std::vector<RunPath>& outputs) {
  std::vector<std::optional<Identity>> in, out;
  for (const RunPath& p : inputs) in.push_back(identify(p));
  for (const RunPath& p : outputs) out.push_back(identify(p));
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (!out[o]) continue;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (in[i] && same(*out[o], *in[i]))
        throw ConfigError(named(outputs[o]) + " is the same file as " + named(inputs[i]) +
                          ", which this run reads: writing it would replace the run's own input; " +
                          fix_for(outputs[o]));
    for (size_t k = 0; k < o; ++k)
      if (out[k] && same(*out[o], *out[k]))
        throw ConfigError(named(outputs[k]) + " and " + named(outputs[o]) +
                          " are the same file: one output would replace the other; " + fix_for(outputs[o]));
  }
}

}  // namespace strata
