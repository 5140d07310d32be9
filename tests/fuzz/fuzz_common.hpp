// The contract every fuzz target checks (tests/fuzz/README.md): a parser given any bytes
// returns, or throws a strata::Error whose message is not empty. Any other exception
// (std::out_of_range, json::exception, bad_alloc, ...) is a finding: the target aborts so
// that libFuzzer saves the input. Memory errors and undefined behaviour are found by the
// sanitizers the fuzz build uses (ASan, UBSan).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <typeinfo>

#include "strata/core/error.hpp"
#include "strata/core/log.hpp"

namespace strata::fuzz {

template <class F>
void only_strata_errors(const char* target, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    if (std::strlen(e.what()) == 0) {
      std::fprintf(stderr, "%s: a strata::Error with an empty message\n", target);
      std::abort();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s escaped the parser: %s\n", target, typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "%s: an exception of unknown type escaped the parser\n", target);
    std::abort();
  }
}


inline std::string_view bytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace strata::fuzz

// Every target includes this once: warnings (unknown keys, ...) are part of what is
// fuzzed, not of its output.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  strata::log::set_level(strata::log::Level::Error);
  return 0;
}
