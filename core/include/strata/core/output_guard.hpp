// No output of a run replaces one of its inputs, or another of its outputs
// (docs/failure-behaviour.md, "Outputs: never an input"). check_output_path (safe_io.hpp)
// looks at one output alone; this looks at a run's outputs beside everything the run
// reads: its config file, its data file, the checkpoint it resumes or exports, its
// nvme_path, a model directory it imports. `--metrics data.txt` or
// `strata.trace=<the config>` would otherwise replace the input while the run reads it.
//
// Files are compared by identity (device and inode, symbolic links followed), so another
// spelling of a path (`a/../data.txt`), a symbolic link and a hard link are all seen. A
// path that does not exist yet is compared by its resolved name: two outputs given as
// one new name, or an output named as an input directory the run creates (nvme_path).
#pragma once

#include <string>
#include <vector>

namespace strata {

// A file or directory a run reads or writes, and where its path came from.
struct RunPath {
  std::string path;  // as given; an empty path (an output that is off) is skipped
  std::string what;  // for messages: "--metrics", "strata.data.path", "the checkpoint --resume reads"
  int fd = -1;       // >= 0: this open descriptor instead of a path (standard output)
};

// Standard output as an output of the run. It counts only when it is a regular file
// (`strata eval ... >> data.txt`); a terminal, a pipe or /dev/null replaces nothing.
RunPath standard_output();

// The regular files directly inside `dir` (a checkpoint's manifest and rank files) as
// inputs, each named `what`; none when dir is not a directory.
std::vector<RunPath> files_in(const std::string& dir, const std::string& what);

// Refuses (ConfigError) an output that is the same file as an input, or as another
// output, naming both, where each came from and the fix. Checks only: opens nothing for
// writing and creates nothing.
void check_outputs_replace_no_input(const std::vector<RunPath>& inputs, const std::vector<RunPath>& outputs);

}  // namespace strata
