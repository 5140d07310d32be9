#include "strata/bench/reference_process.hpp"

#include <sys/socket.h>
#include <sys/wait.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "strata/core/error.hpp"

extern char** environ;

namespace strata::bench {

ReferenceProcess::ReferenceProcess(std::vector<std::string> argv, std::string who, std::string fix)
    : who_(std::move(who)), fix_(std::move(fix)) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw Unavailable(who_ + ": socketpair: " + std::strerror(errno));
  fd_ = sv[0];
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sv[1], 0);
  posix_spawn_file_actions_adddup2(&actions, sv[1], 1);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const int err = posix_spawnp(&pid_, argv.at(0).c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(sv[1]);
  if (err != 0) {
    close(fd_);
    throw Unavailable(who_ + ": cannot start " + argv[0] + ": " + std::strerror(err) + " (" + fix_ + ")");
  }
  try {
    info_ = reply();
  } catch (...) {
    close(fd_);
    int status = 0;
    waitpid(pid_, &status, 0);
    throw;
  }
  if (!info_.value("ready", false)) {
    const std::string got = info_.dump();
    close(fd_);
    int status = 0;
    waitpid(pid_, &status, 0);
    throw Unavailable(who_ + " did not start: " + got);
  }
}

ReferenceProcess::~ReferenceProcess() {
  const char quit[] = "quit\n";
  (void)!send(fd_, quit, sizeof quit - 1, MSG_NOSIGNAL);
  close(fd_);
  int status = 0;
  waitpid(pid_, &status, 0);
}

nlohmann::json ReferenceProcess::command(const std::string& line) {
  const std::string cmd = line + "\n";
  if (send(fd_, cmd.data(), cmd.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(cmd.size()))
    throw Unavailable(who_ + " went away: " + std::strerror(errno) + " (" + fix_ + ")");
  return reply();
}

nlohmann::json ReferenceProcess::reply() {
  std::string line;
  for (;;) {
    if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
      line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      break;
    }
    char chunk[4096];
    const ssize_t got = recv(fd_, chunk, sizeof chunk, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) throw Unavailable(who_ + " exited without answering (its error is above; " + fix_ + ")");
    buffer_.append(chunk, static_cast<size_t>(got));
  }
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Unavailable(who_ + ": unreadable reply: " + line);
  if (j.contains("error")) throw Unavailable(who_ + ": " + j["error"].get<std::string>() + " (" + fix_ + ")");
  return j;
}

}  // namespace strata::bench
