// A training data file (model/data.hpp, format "auto"): an llm.c token file (its header
// of 256 int32, then uint16 tokens) or text. The input is the file, held in a memfd so
// that TokenDataset reads it through a path as it reads any file; a dataset that opens is
// asked for a training batch, the next position and a held-out batch.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "strata/model/data.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("fuzz-tokens", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  for (size_t at = 0; at < size;) {
    const ssize_t w = ::write(fd, data + at, size - at);
    if (w <= 0) std::abort();
    at += static_cast<size_t>(w);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  strata::fuzz::only_strata_errors("fuzz_tokens", [&] {
    constexpr int kSeq = 8, kMicro = 2;
    strata::TokenDataset d(path, strata::DataFormat::Auto, kSeq, 50304, 1234, 0.25);
    std::vector<int32_t> x(kMicro * kSeq), y(kMicro * kSeq);
    strata::DataPosition pos;
    d.batch(pos, 0, 1, kMicro, x.data(), y.data());
    pos = d.advance(pos, kMicro);
    d.batch(pos, 0, 1, kMicro, x.data(), y.data());
    d.heldout_batch(0, 0, 1, 1, x.data(), y.data());
    for (int32_t t : x)
      if (t < 0 || t >= 50304) std::abort();
  });
  ::close(fd);
  return 0;
}
