// What the cuda model's tensor-core attention (STRATA_ATTENTION=mma,
// model/src/attention_mma_cuda.cu) decides on the host, as pure functions: which head
// dimensions and types it takes, each kernel's shared-memory layout (the launcher passes
// the layout to the kernel, which carves its buffers at these offsets, so the bytes asked
// for and the bytes used are one computation), the inner tile that fits a GPU's
// per-block shared-memory limit, which inner tiles a block visits, and which (query rows,
// key rows) pairs the causal mask skips, masks element by element or takes whole. No CUDA
// here beyond STRATA_HD: the header compiles everywhere, and
// tests/model/test_attention_mma_plan.cpp checks every decision on the CPU, since CI has
// no GPU to run the kernels on.
//
// A block owns kMmaBlockRows = 64 rows of one head (4 warps of 16): query rows in the
// forward and dq kernels, key rows in the dkv kernel. It loads them once and iterates over
// inner tiles of BC rows of the other side (key tiles; in dkv query tiles), each loaded
// with cp.async into one of kMmaStages buffers while the previous one is computed on.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "strata/core/dtype.hpp"
#include "strata/core/math/host_device.hpp"

namespace strata {

// The largest head dimension the kernels take. A warp's output accumulators (O, dQ; dK and
// dV together in the dkv kernel) live in mma.sync fragments, hd / 8 of 4 floats per thread
// each: at 128 the dkv kernel holds 128 fp32 registers of them per thread, half of what a
// thread may have. Beyond that they would spill; the Gemm path takes any head dimension.
inline constexpr int kMmaMaxHeadDim = 128;
inline constexpr int kMmaWarpRows = 16;   // rows a warp owns: one m16n8k16 product's M
inline constexpr int kMmaBlockRows = 64;  // rows a block owns: 4 warps
inline constexpr int kMmaStages = 2;      // buffers per iterated tile: one loading, one in use

enum class AttentionMmaKernel { Forward, Dq, Dkv };

inline constexpr uint32_t kMmaNoBuffer = 0xffffffffu;  // a buffer the kernel does not have

// One kernel's dynamic shared memory. The 16-bit tiles are read by ldmatrix, eight rows of
// 16 bytes a matrix: their pitch of hd + 8 elements makes a row 16 bytes longer than a
// multiple of 128, so the 8 rows of one matrix fall in 8 different 16-byte bank groups
// (no conflict), and every row starts 16-byte aligned (cp.async's 16-byte copies, and
// ldmatrix's row addresses). Every buffer starts 128-byte aligned.
struct AttentionMmaLayout {
  int rows = kMmaBlockRows;  // BR: the block's own rows
  int inner = 0;             // BC: rows of each inner tile
  int head_dim = 0;          // hd
  int pitch16 = 0;           // 16-bit elements between rows of a tile: hd + 8
  // Byte offsets, or kMmaNoBuffer; [rows or inner, pitch16] 16-bit tiles. Own (loaded
  // once, [BR, pitch16]): forward q; dq q and dout; dkv k and v. Inner ([BC, pitch16],
  // stage 0's offset; stage s at + s * stage_bytes): forward and dq k and v; dkv q and dout.
  uint32_t q = kMmaNoBuffer, k = kMmaNoBuffer, v = kMmaNoBuffer, dout = kMmaNoBuffer;
  uint32_t stats = kMmaNoBuffer;  // dkv, inner: [2, BC] fp32, lse then D of the query tile
  uint32_t stage_bytes = 0;       // between one stage of the inner buffers and the next
  uint32_t bytes = 0;             // the whole, what the launch asks for
};

inline AttentionMmaLayout attention_mma_layout(AttentionMmaKernel kernel, int inner, int head_dim) {
  AttentionMmaLayout l;
  l.inner = inner;
  l.head_dim = head_dim;
  l.pitch16 = head_dim + 8;
  const auto align = [](uint32_t b) { return (b + 127u) / 128u * 128u; };
  const uint32_t own = align(static_cast<uint32_t>(l.rows) * l.pitch16 * 2u);
  const uint32_t tile = align(static_cast<uint32_t>(inner) * l.pitch16 * 2u);
  uint32_t used = 0;
  const auto take = [&used](uint32_t bytes) {
    const uint32_t at = used;
    used += bytes;
    return at;
  };
  // The own buffers, then the inner ones (stage 0), which repeat once per stage.
  uint32_t first_inner = 0;
  if (kernel == AttentionMmaKernel::Dkv) {
    l.k = take(own);
    l.v = take(own);
    l.q = first_inner = take(tile);
    l.dout = take(tile);
    l.stats = take(align(2u * static_cast<uint32_t>(inner) * 4u));
  } else {
    l.q = take(own);
    if (kernel == AttentionMmaKernel::Dq) l.dout = take(own);
    l.k = first_inner = take(tile);
    l.v = take(tile);
  }
  l.stage_bytes = used - first_inner;
  l.bytes = used + (kMmaStages - 1) * l.stage_bytes;
  return l;
}

// The inner tiles a kernel may take at this head dimension, largest first. The dkv
// kernel's warps hold dK and dV (hd / 2 floats each per thread at 16 rows) besides their
// scores and dP (BC / 2 each): past head dimension 64 its tile is 32, so those stay
// within a thread's 255 registers.
inline std::initializer_list<int> attention_mma_inner_choices(AttentionMmaKernel kernel, int head_dim) {
  static constexpr std::initializer_list<int> kBoth = {64, 32}, kSmall = {32};
  return kernel == AttentionMmaKernel::Dkv && head_dim > 64 ? kSmall : kBoth;
}

// BC for this kernel and head dimension on a GPU whose blocks may have `shared_limit`
// bytes of shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin): the largest choice
// that fits, 0 where none does (the dq kernel at head dimension 128 takes 104448 bytes at
// 64, past the 99 KiB of an sm_86 or sm_89 GPU, so 32 there).
inline int attention_mma_inner(AttentionMmaKernel kernel, int head_dim, uint64_t shared_limit) {
  for (int bc : attention_mma_inner_choices(kernel, head_dim))
    if (attention_mma_layout(kernel, bc, head_dim).bytes <= shared_limit) return bc;
  return 0;
}

// The most any of the three kernels needs at its smallest tile: what a GPU must allow.
inline uint32_t attention_mma_least_bytes(int head_dim) {
  uint32_t most = 0;
  for (AttentionMmaKernel k : {AttentionMmaKernel::Forward, AttentionMmaKernel::Dq, AttentionMmaKernel::Dkv}) {
    const uint32_t b = attention_mma_layout(k, 32, head_dim).bytes;
    most = b > most ? b : most;
  }
  return most;
}

// Why the tensor-core kernels cannot run a model of this head dimension in type t, or ""
// where they can (whether the GPU has the shared memory is attention_mma_inner's).
inline std::string attention_mma_refusal(int head_dim, DType t) {
  if (t != DType::BF16 && t != DType::F16)
    return std::string("STRATA_ATTENTION=mma runs on the tensor cores over 16-bit operands: bf16 or fp16 only, not ") +
           to_string(t) + "; set STRATA_ATTENTION=gemm (the default) or flash for this precision";
  if (head_dim < kMmaWarpRows || head_dim % kMmaWarpRows != 0 || head_dim > kMmaMaxHeadDim)
    return "STRATA_ATTENTION=mma takes head dimensions (d_model / heads) that are multiples of 16 up to " +
           std::to_string(kMmaMaxHeadDim) + ", not " + std::to_string(head_dim) +
           "; set STRATA_ATTENTION=gemm (the default, any head dimension), or change the number of heads";
  return "";
}

// How the pair (queries q0 .. q0 + q_rows - 1, keys k0 .. k0 + k_rows - 1) of the causal
// attention over T tokens is computed, key k visible to query q when k <= q < T. Skip: no
// element visible, no work. Whole: every element visible, none needs the mask. Masked:
// the rest (tiles on the diagonal, or with queries past T, whose rows must contribute
// nothing to dK and dV), each element masked to probability exactly 0.
enum class MmaTileVisit { Skip, Masked, Whole };

STRATA_HD constexpr MmaTileVisit attention_mma_pair(int q0, int q_rows, int k0, int k_rows, int T) {
  const int last_q = (q0 + q_rows < T ? q0 + q_rows : T) - 1;  // the last query before T
  if (q0 >= T || k0 > last_q) return MmaTileVisit::Skip;
  if (k0 + k_rows - 1 <= q0 && q0 + q_rows <= T) return MmaTileVisit::Whole;
  return MmaTileVisit::Masked;
}

// The inner tiles block `block` of a kernel visits, [first, end) in tiles of `inner` rows:
// exactly those whose pair with the block is not Skip. Forward and dq (the block's queries
// from 64 block on): key tiles from 0 up to the block's last query before T. Dkv (its keys
// from 64 block on): query tiles from the one holding its first key to the last before T.
struct MmaRange {
  int first, end;
};

STRATA_HD constexpr MmaRange attention_mma_inner_tiles(AttentionMmaKernel kernel, int block, int inner, int T) {
  const int r0 = block * kMmaBlockRows;
  if (kernel == AttentionMmaKernel::Dkv) return {r0 / inner, (T + inner - 1) / inner};
  const int last = (r0 + kMmaBlockRows < T ? r0 + kMmaBlockRows : T);  // one past the last query
  return {0, (last + inner - 1) / inner};
}

}  // namespace strata
