// STRATA_CLONES: compiles a function for AVX-512, AVX2 and baseline x86-64 and lets the
// loader pick the best for the running CPU (GCC target_clones), so one binary runs
// everywhere at full vector width. Empty under AddressSanitizer (its interceptors and
// ifunc resolvers do not mix), with clang, and off x86-64.
#pragma once

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__clang__)
#define STRATA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define STRATA_CLONES
#endif
