// What the cuda model's tensor-core attention (STRATA_ATTENTION=mma,
// model/src/attention_mma_cuda.cu) decides on the host, as pure functions: which head
// dimensions and types it takes, each kernel's shared-memory layout for a tile size (the
// launcher passes the layout to the kernel, which carves its buffers at these offsets, so
// the bytes asked for and the bytes used are one computation), the tile size that fits a
// GPU's per-block shared-memory limit, and which (query tile, key tile) pairs the causal
// mask skips, masks element by element or takes whole. No CUDA here beyond STRATA_HD: the
// header compiles everywhere, and tests/model/test_attention_mma_plan.cpp checks every
// decision on the CPU, since CI has no GPU to run the kernels on.
//
// A tile is BT rows of one head (BT query rows, or BT key rows) and is square: the
// forward and dq kernels take one query tile against key tiles of the same BT, the dkv
// kernel one key tile against query tiles of the same BT. Each warp owns 16 rows (one
// WMMA tile's side), so a block is BT / 16 warps.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "strata/core/dtype.hpp"
#include "strata/core/math/host_device.hpp"

namespace strata {

// The largest head dimension the kernels take. Their output accumulators (O, dQ; dK and
// dV together in the dkv kernel) live in WMMA fragments, hd / 16 of 8 floats per thread
// each: at 128 the dkv kernel holds 128 fp32 registers of them per thread, about half of
// what a thread may have. Beyond that they would spill; the Gemm path takes any head
// dimension.
inline constexpr int kMmaMaxHeadDim = 128;
inline constexpr int kMmaWarpRows = 16;  // rows a warp owns: one WMMA tile's side

enum class AttentionMmaKernel { Forward, Dq, Dkv };

inline constexpr uint32_t kMmaNoBuffer = 0xffffffffu;  // a buffer the kernel does not have

// One kernel's dynamic shared memory. The 16-bit tiles are WMMA operands (row pitch a
// multiple of 8 elements, WMMA's rule for 16-bit ldm); the fp32 ones are where WMMA
// stores scores (a multiple of 4). The padding of 8 16-bit elements (4 floats) makes
// every row an odd multiple of 4 words long, so the 8 consecutive rows a fragment load
// (or the lanes of the element-wise steps) touch at once start in 8 different groups of
// 4 banks. Every buffer starts 128-byte aligned (WMMA needs 32 bytes; the 16-byte copies
// into the 16-bit tiles need 16).
struct AttentionMmaLayout {
  int tile = 0;          // BT: rows per tile, 16 per warp
  int head_dim = 0;      // hd
  int pitch16 = 0;       // 16-bit elements between rows of a [BT, hd] tile: hd + 8
  int pitch_scores = 0;  // floats between rows of an fp32 [BT, BT] tile: BT + 4
  int pitch_probs = 0;   // 16-bit elements between rows of a [BT, BT] tile: BT + 8
  // Byte offsets, or kMmaNoBuffer. Forward: q, k, v, scores, probs. Dq: q, dout, k, v,
  // scores, dscores, dprobs. Dkv: all of them (scores and probabilities transposed:
  // rows are keys).
  uint32_t q = kMmaNoBuffer, k = kMmaNoBuffer, v = kMmaNoBuffer, dout = kMmaNoBuffer;  // [BT, pitch16] 16-bit
  uint32_t scores = kMmaNoBuffer, dscores = kMmaNoBuffer;  // [BT, pitch_scores] fp32: S, dP
  uint32_t probs = kMmaNoBuffer, dprobs = kMmaNoBuffer;    // [BT, pitch_probs] 16-bit: P, dS
  uint32_t stats = kMmaNoBuffer;                           // Dkv: [2, BT] fp32, lse then D of the query tile
  uint32_t bytes = 0;                                      // the whole, what the launch asks for
};

inline AttentionMmaLayout attention_mma_layout(AttentionMmaKernel kernel, int tile, int head_dim) {
  AttentionMmaLayout l;
  l.tile = tile;
  l.head_dim = head_dim;
  l.pitch16 = head_dim + 8;
  l.pitch_scores = tile + 4;
  l.pitch_probs = tile + 8;
  uint32_t used = 0;
  const auto take = [&used](uint32_t bytes) {
    used = (used + 127u) / 128u * 128u;
    const uint32_t at = used;
    used += bytes;
    return at;
  };
  const uint32_t rows = static_cast<uint32_t>(tile);
  const uint32_t t16 = rows * l.pitch16 * 2u, s32 = rows * l.pitch_scores * 4u, p16 = rows * l.pitch_probs * 2u;
  const bool fwd = kernel == AttentionMmaKernel::Forward, dkv = kernel == AttentionMmaKernel::Dkv;
  l.q = take(t16);
  if (!fwd) l.dout = take(t16);
  l.k = take(t16);
  l.v = take(t16);
  l.scores = take(s32);
  if (!fwd) l.dscores = take(s32);
  if (kernel != AttentionMmaKernel::Dq) l.probs = take(p16);
  if (!fwd) l.dprobs = take(p16);
  if (dkv) l.stats = take(2u * rows * 4u);
  l.bytes = (used + 127u) / 128u * 128u;
  return l;
}

// The most shared memory any of the three kernels takes at this tile and head dimension.
inline uint32_t attention_mma_most_bytes(int tile, int head_dim) {
  uint32_t most = 0;
  for (AttentionMmaKernel k : {AttentionMmaKernel::Forward, AttentionMmaKernel::Dq, AttentionMmaKernel::Dkv}) {
    const uint32_t b = attention_mma_layout(k, tile, head_dim).bytes;
    most = b > most ? b : most;
  }
  return most;
}

// BT for this head dimension on a GPU whose blocks may have `shared_limit` bytes of
// shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin): 64 (4 warps), or 32 (2 warps)
// where a 64-row tile's kernels do not fit (the dkv kernel's 123 KiB at head dimension
// 128 exceeds the 99 KiB of an sm_86 or sm_89 GPU); 0 where neither fits.
inline int attention_mma_tile(int head_dim, uint64_t shared_limit) {
  for (int bt : {64, 32})
    if (attention_mma_most_bytes(bt, head_dim) <= shared_limit) return bt;
  return 0;
}

// Why the tensor-core kernels cannot run a model of this head dimension in type t, or ""
// where they can (whether the GPU has the shared memory is attention_mma_tile's).
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

// How the pair (query tile qt, key tile kt) of the causal attention over T tokens in
// tiles of BT rows is computed. Skip: every key comes after every query (kt > qt), no
// work. Whole: every key is visible to every query and every query row is before T, so
// no element needs the mask. Masked: the diagonal tile, or a query tile cut by T (its rows
// past T must contribute nothing to dK and dV), each element masked (k > q, or q >= T:
// probability exactly 0). The forward and dq kernels visit key tiles 0 .. qt, the dkv
// kernel query tiles kt .. ceil(T / BT) - 1: every pair that is not Skip.
enum class MmaTileVisit { Skip, Masked, Whole };

STRATA_HD constexpr MmaTileVisit attention_mma_visit(int qt, int kt, int tile, int T) {
  if (kt > qt) return MmaTileVisit::Skip;
  if (kt == qt || (qt + 1) * tile > T) return MmaTileVisit::Masked;
  return MmaTileVisit::Whole;
}

}  // namespace strata
