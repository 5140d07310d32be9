// Writing outputs so that a failed write (a full disk, an I/O error) loses nothing already
// written and leaves nothing that looks complete and is not (docs/failure-behaviour.md,
// "Full disk"):
//  - ReplacingFile: an output written whole at once (a trace, a bench report). The bytes
//    go to a temporary file beside the path, which replaces it only once every byte is
//    written and fsynced, as a checkpoint is saved. A failure removes the temporary file
//    and leaves an earlier file at the path as it was.
//  - AppendedLines: an output appended to for a whole run, one record per line (the
//    metrics). Every write is checked, and a record is written whole or not at all: a
//    write that fails part-way is cut back, so no torn line is left looking like a record.
// Each failure is an IoError naming the file, the offset, errno and, for a full disk, the
// fix the caller gives (`on_full`: "give --metrics a path on a disk with room").
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>

namespace strata {

// What a failed write of an output does.
enum class OnWriteFailure {
  Throw,        // the IoError reaches the caller, which stops with it
  WarnAndStop,  // the user marked the output optional: one warning, then it is no longer written
};

class ReplacingFile {
 public:
  // Creates the temporary file beside `path` (the target of a symbolic link is what is
  // replaced, not the link). `what` names the output in messages ("the trace file").
  ReplacingFile(const std::string& path, std::string what, std::string on_full);
  ~ReplacingFile();  // removes the temporary file unless commit() put it in place
  ReplacingFile(const ReplacingFile&) = delete;
  ReplacingFile& operator=(const ReplacingFile&) = delete;

  // The file's contents, buffered; a write that fails sets the stream's badbit and the
  // error is thrown by commit().
  std::ostream& stream();
  // Writes what is buffered, fsyncs and renames the file into place; IoError on failure
  // (the temporary file is removed, the path untouched).
  void commit();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// The whole of `text` as `path`, through a ReplacingFile.
void write_file_replacing(const std::string& path, std::string_view text, const std::string& what,
                          const std::string& on_full);

class AppendedLines {
 public:
  AppendedLines() = default;  // closed: append() writes nothing
  // Opens `path` for appending, creating it when missing (IoError when it cannot); writes
  // nothing yet. A file that ends part-way through a line (cut by an earlier crash) gets
  // a newline before the first record, so that this run's records start on lines of
  // their own.
  AppendedLines(const std::string& path, std::string what, std::string on_full, OnWriteFailure on_failure);
  ~AppendedLines();
  AppendedLines(AppendedLines&& o) noexcept;
  AppendedLines& operator=(AppendedLines&& o) noexcept;

  bool is_open() const { return fd_ >= 0; }
  // Appends `record` and a newline, whole or not at all; returns whether it was written.
  // A failed write is cut back to where the file ended before it, then: Throw throws the
  // IoError; WarnAndStop warns once, closes the file and returns false.
  bool append(std::string_view record);

 private:
  void close();

  int fd_ = -1;
  bool ends_mid_line_ = false;  // the file's last byte is not a newline: the next record starts one
  std::string path_, what_, on_full_;
  OnWriteFailure on_failure_ = OnWriteFailure::Throw;
};

}  // namespace strata
