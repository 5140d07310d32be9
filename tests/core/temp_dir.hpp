// A temporary directory of a test's own (mkdtemp under the system's temp directory,
// removed with everything in it at the end), and a matcher for message parts: shared by
// tests/core's file tests.
#pragma once

#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "missing \"" << (part) << "\" in: " << (msg)

namespace strata::testing_core {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    // mkdtemp replaces the trailing XXXXXX with a unique name.
    std::string tmpl = (std::filesystem::temp_directory_path() / ("strata_" + tag + "_XXXXXX")).string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::filesystem::path& rel, const std::string& text = "x") const {
    std::filesystem::create_directories((path / rel).parent_path());
    std::ofstream(path / rel) << text;
    return (path / rel).string();
  }
};

}  // namespace strata::testing_core
