// A reference implementation (PyTorch, bench/ref/*.py) in a child process that stays up
// for a whole benchmark run, so that the benchmark can interleave its own measurements
// with the reference's: one command line in, one JSON line out, over a socket pair on the
// child's stdin and stdout (its stderr stays the terminal's).
//
// The script's first line out is {"ready": true, ...} (kept as info()); a reply with an
// "error" member, an unreadable line or a child that exits becomes Unavailable, naming
// `who` and the fix (`fix`: what the user can do, e.g. "--python names another Python;
// --no-torch measures without it").
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata::bench {

class ReferenceProcess {
 public:
  // argv[0] is the interpreter, started by path; throws Unavailable when it cannot start
  // or does not answer ready.
  ReferenceProcess(std::vector<std::string> argv, std::string who, std::string fix);
  ~ReferenceProcess();  // sends "quit" and waits for the child
  ReferenceProcess(const ReferenceProcess&) = delete;
  ReferenceProcess& operator=(const ReferenceProcess&) = delete;

  const nlohmann::json& info() const { return info_; }
  // Sends one command (no newline) and returns the reply.
  nlohmann::json command(const std::string& line);

 private:
  nlohmann::json reply();

  std::string who_, fix_;
  int fd_ = -1;
  pid_t pid_ = -1;
  std::string buffer_;
  nlohmann::json info_;
};

}  // namespace strata::bench
