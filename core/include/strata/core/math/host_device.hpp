// Qualifiers for element-wise math shared by host and device code (written once, so the
// CPU tests check the math the GPU runs).
#pragma once

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__
#else
#define STRATA_HD
#endif

// Always inlined: these functions are compiled into files built with different -m flags
// (the per-ISA kernels of the CPU optimizer). An out-of-line copy built with AVX-512 could
// otherwise be the one the linker keeps, and be called from baseline code.
#if defined(__CUDACC__)
#define STRATA_FORCE_INLINE __forceinline__
#elif defined(__GNUC__)
#define STRATA_FORCE_INLINE inline __attribute__((always_inline))
#else
#define STRATA_FORCE_INLINE inline
#endif
