// O_DIRECT alignment from the file system. statx(STATX_DIOALIGN) (Linux 6.1) reports
// the memory and offset alignment a file needs for direct I/O. We call the system call
// directly with the kernel's layout so that older glibc headers (without the constant or
// the fields) build the same code; kernels without it fall back to 4096, which every
// file system we meet accepts.
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "strata/offload/io_engine.hpp"

#ifndef STATX_DIOALIGN
#define STATX_DIOALIGN 0x00002000U
#endif
#ifndef AT_EMPTY_PATH
#define AT_EMPTY_PATH 0x1000
#endif

namespace strata {

namespace {

// struct statx as the kernel lays it out (include/uapi/linux/stat.h).
struct KernelStatx {
  uint32_t mask;
  uint32_t blksize;
  uint64_t attributes;
  uint32_t nlink, uid, gid;
  uint16_t mode, spare0;
  uint64_t ino, size, blocks, attributes_mask;
  struct {
    int64_t sec;
    uint32_t nsec;
    int32_t reserved;
  } atime, btime, ctime, mtime;
  uint32_t rdev_major, rdev_minor, dev_major, dev_minor;
  uint64_t mnt_id;
  uint32_t dio_mem_align;
  uint32_t dio_offset_align;
  uint64_t spare3[12];
};
static_assert(offsetof(KernelStatx, dio_mem_align) == 0x98, "statx layout");
static_assert(sizeof(KernelStatx) == 0x100, "statx size");

constexpr uint64_t kFallback = 4096;

}  // namespace

uint64_t probe_dio_alignment(int fd) {
#ifdef SYS_statx
  KernelStatx st{};
  long r = syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &st);
  if (r != 0 || !(st.mask & STATX_DIOALIGN) || st.dio_offset_align == 0) return kFallback;
  uint64_t a = st.dio_mem_align > st.dio_offset_align ? st.dio_mem_align : st.dio_offset_align;
  if (a == 0 || (a & (a - 1)) != 0) return kFallback;
  return a;
#else
  (void)fd;
  return kFallback;
#endif
}

}  // namespace strata
