// attention_mma_plan.hpp on the CPU: what the tensor-core attention (STRATA_ATTENTION=mma,
// model/src/attention_mma_cuda.cu) decides on the host, checked where CI runs since no
// GPU there runs the kernels: the shared-memory layout each kernel carves (ldmatrix's and
// cp.async's alignment, a conflict-free pitch, both stages, no overlaps, the bytes asked
// for), the inner tile a GPU's limit allows, the types and head dimensions refused, which
// inner tiles a block visits and which pairs the causal mask skips, masks or takes whole,
// against the element-by-element mask. The kernels themselves run, emulated, in
// test_attention_mma_emulated.cpp.
#include "strata/model/attention_mma_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace strata {
namespace {

constexpr AttentionMmaKernel kKernels[] = {AttentionMmaKernel::Forward, AttentionMmaKernel::Dq,
                                           AttentionMmaKernel::Dkv};

const char* name(AttentionMmaKernel k) {
  return k == AttentionMmaKernel::Forward ? "forward" : k == AttentionMmaKernel::Dq ? "dq" : "dkv";
}

struct Buffer {
  std::string what;
  uint32_t offset, bytes;
};

// The buffers a layout has, with their sizes as the kernels use them, each stage of the
// inner ones apart.
std::vector<Buffer> buffers(AttentionMmaKernel kernel, const AttentionMmaLayout& l) {
  const uint32_t own = static_cast<uint32_t>(l.rows) * l.pitch16 * 2;
  const uint32_t tile = static_cast<uint32_t>(l.inner) * l.pitch16 * 2;
  const bool dkv = kernel == AttentionMmaKernel::Dkv;
  std::vector<Buffer> present;
  const auto add = [&](const char* what, uint32_t offset, bool inner, uint32_t bytes) {
    if (offset == kMmaNoBuffer) return;
    if (!inner) {
      present.push_back({what, offset, bytes});
      return;
    }
    for (int s = 0; s < kMmaStages; ++s)
      present.push_back({std::string(what) + "@" + std::to_string(s), offset + s * l.stage_bytes, bytes});
  };
  add("q", l.q, dkv, dkv ? tile : own);
  add("dout", l.dout, dkv, dkv ? tile : own);
  add("k", l.k, !dkv, dkv ? own : tile);
  add("v", l.v, !dkv, dkv ? own : tile);
  add("stats", l.stats, true, 2 * static_cast<uint32_t>(l.inner) * 4);
  return present;
}

std::vector<std::string> names(const AttentionMmaLayout& l) {
  const std::pair<const char*, uint32_t> all[] = {{"q", l.q}, {"k", l.k}, {"v", l.v}, {"dout", l.dout}, {"stats", l.stats}};
  std::vector<std::string> n;
  for (const auto& [what, at] : all)
    if (at != kMmaNoBuffer) n.emplace_back(what);
  std::sort(n.begin(), n.end());
  return n;
}

TEST(AttentionMmaLayout, EachKernelHasItsBuffers) {
  using V = std::vector<std::string>;
  EXPECT_EQ(names(attention_mma_layout(AttentionMmaKernel::Forward, 64, 128)), (V{"k", "q", "v"}));
  EXPECT_EQ(names(attention_mma_layout(AttentionMmaKernel::Dq, 64, 128)), (V{"dout", "k", "q", "v"}));
  EXPECT_EQ(names(attention_mma_layout(AttentionMmaKernel::Dkv, 32, 128)), (V{"dout", "k", "q", "stats", "v"}));
}

// ldmatrix reads 8 rows of 16 bytes a matrix: a row pitch that is an odd multiple of 16
// bytes puts the 8 rows in 8 different 16-byte bank groups, and keeps every row 16-byte
// aligned for cp.async's 16-byte copies. Buffers (each stage of the inner ones) 128-byte
// aligned, disjoint, inside the bytes.
TEST(AttentionMmaLayout, AlignedDisjointAndConflictFree) {
  for (const AttentionMmaKernel kernel : kKernels) {
    for (int bc : {32, 64}) {
      for (int hd = 16; hd <= kMmaMaxHeadDim; hd += 16) {
        SCOPED_TRACE(std::string(name(kernel)) + ", inner " + std::to_string(bc) + ", head dimension " +
                     std::to_string(hd));
        const AttentionMmaLayout l = attention_mma_layout(kernel, bc, hd);
        EXPECT_EQ(l.rows, kMmaBlockRows);
        EXPECT_EQ(l.inner, bc);
        EXPECT_EQ(l.head_dim, hd);
        EXPECT_GE(l.pitch16, hd);
        EXPECT_EQ(l.pitch16 * 2 % 16, 0);
        EXPECT_EQ(l.pitch16 * 2 / 16 % 2, 1);
        EXPECT_EQ(l.stage_bytes % 128, 0u);
        std::vector<Buffer> bufs = buffers(kernel, l);
        std::sort(bufs.begin(), bufs.end(), [](const Buffer& a, const Buffer& b) { return a.offset < b.offset; });
        for (size_t i = 0; i < bufs.size(); ++i) {
          SCOPED_TRACE(bufs[i].what);
          EXPECT_EQ(bufs[i].offset % 128, 0u);
          EXPECT_LE(bufs[i].offset + bufs[i].bytes, l.bytes);
          if (i + 1 < bufs.size()) {
            EXPECT_LE(bufs[i].offset + bufs[i].bytes, bufs[i + 1].offset);
          }
        }
        EXPECT_EQ(l.bytes % 128, 0u);
      }
    }
  }
}

// The bytes each kernel asks for at the 1.1B GPT's head dimension (128) and GPT-2's (64),
// as the docs quote them: 16-bit tiles of 64 (or 32) x (hd + 8), the inner ones twice.
TEST(AttentionMmaLayout, BytesPerKernel) {
  const auto bytes = [](AttentionMmaKernel k, int bc, int hd) { return attention_mma_layout(k, bc, hd).bytes; };
  EXPECT_EQ(bytes(AttentionMmaKernel::Forward, 64, 128), 87040u);  // 17408 + 2 x (17408 + 17408)
  EXPECT_EQ(bytes(AttentionMmaKernel::Dq, 64, 128), 104448u);      // 2 x 17408 + 2 x 2 x 17408
  EXPECT_EQ(bytes(AttentionMmaKernel::Dq, 32, 128), 69632u);       // 2 x 17408 + 2 x 2 x 8704
  EXPECT_EQ(bytes(AttentionMmaKernel::Dkv, 32, 128), 70144u);      // 2 x 17408 + 2 x (2 x 8704 + 256)
  EXPECT_EQ(bytes(AttentionMmaKernel::Forward, 64, 64), 46080u);   // 9216 + 2 x 2 x 9216
  EXPECT_EQ(bytes(AttentionMmaKernel::Dq, 64, 64), 55296u);
  EXPECT_EQ(bytes(AttentionMmaKernel::Dkv, 64, 64), 56320u);  // 2 x 9216 + 2 x (2 x 9216 + 512)
  EXPECT_EQ(attention_mma_least_bytes(128), 70144u);
}

// Per-block opt-in limits: H100 and H200 227 KiB, A100 163 KiB, sm_86 and sm_89 99 KiB.
TEST(AttentionMmaInner, LargestThatFitsAndTheDkvKernelsRegisterCap) {
  constexpr uint64_t kH100 = 227 * 1024, kA100 = 163 * 1024, kSm89 = 99 * 1024;
  for (int hd = 16; hd <= kMmaMaxHeadDim; hd += 16) {
    for (uint64_t limit : {kH100, kA100}) {
      EXPECT_EQ(attention_mma_inner(AttentionMmaKernel::Forward, hd, limit), 64) << hd;
      EXPECT_EQ(attention_mma_inner(AttentionMmaKernel::Dq, hd, limit), 64) << hd;
      EXPECT_EQ(attention_mma_inner(AttentionMmaKernel::Dkv, hd, limit), hd > 64 ? 32 : 64) << hd;
    }
  }
  EXPECT_EQ(attention_mma_inner(AttentionMmaKernel::Forward, 128, kSm89), 64);
  EXPECT_EQ(attention_mma_inner(AttentionMmaKernel::Dq, 128, kSm89), 32);  // 104448 bytes at 64 do not fit
  EXPECT_EQ(attention_mma_inner(AttentionMmaKernel::Forward, 128, 48 * 1024), 0);
  // The tile chosen fits; a larger choice would not; more memory never gives a smaller tile.
  for (const AttentionMmaKernel kernel : kKernels) {
    for (int hd = 16; hd <= kMmaMaxHeadDim; hd += 16) {
      int last = 0;
      for (uint64_t limit = 16 * 1024; limit <= kH100; limit += 4096) {
        const int bc = attention_mma_inner(kernel, hd, limit);
        SCOPED_TRACE(std::string(name(kernel)) + ", head dimension " + std::to_string(hd) + ", limit " +
                     std::to_string(limit));
        EXPECT_GE(bc, last);
        last = bc;
        if (bc != 0) {
          EXPECT_LE(attention_mma_layout(kernel, bc, hd).bytes, limit);
        }
        for (int bigger : attention_mma_inner_choices(kernel, hd))
          if (bigger > bc) {
            EXPECT_GT(attention_mma_layout(kernel, bigger, hd).bytes, limit) << bigger;
          }
      }
    }
  }
}

TEST(AttentionMmaRefusal, SixteenBitAndHeadDimensionsInSixteens) {
  for (DType t : {DType::BF16, DType::F16})
    for (int hd = 16; hd <= 128; hd += 16) EXPECT_EQ(attention_mma_refusal(hd, t), "") << to_string(t) << " " << hd;
  for (DType t : {DType::F32, DType::F64, DType::I32}) {
    const std::string why = attention_mma_refusal(64, t);
    EXPECT_NE(why.find("bf16 or fp16"), std::string::npos) << why;
    EXPECT_NE(why.find("STRATA_ATTENTION=gemm"), std::string::npos) << why;
  }
  for (int hd : {0, 8, 24, 72, 100, 144, 256}) {
    const std::string why = attention_mma_refusal(hd, DType::BF16);
    EXPECT_NE(why.find("multiples of 16 up to 128, not " + std::to_string(hd)), std::string::npos) << why;
    EXPECT_NE(why.find("STRATA_ATTENTION=gemm"), std::string::npos) << why;
  }
}

// Each pair's class against the mask element by element (key k visible to query q when
// k <= q < T), at lengths that end on, before and after a tile edge, for both sides the
// kernels put the block on; and the inner tiles each kernel's block visits are exactly
// the pairs that are not Skip.
TEST(AttentionMmaPair, MatchesTheMaskElementByElement) {
  const auto classify = [](int q0, int qr, int k0, int kr, int T) {
    long visible = 0, pairs = 0;
    for (int q = q0; q < q0 + qr; ++q)
      for (int k = k0; k < k0 + kr; ++k) ++pairs, visible += k <= q && q < T;
    return visible == 0 ? MmaTileVisit::Skip : visible == pairs ? MmaTileVisit::Whole : MmaTileVisit::Masked;
  };
  for (int bc : {32, 64}) {
    for (int T : {1, 15, 16, 31, 32, 33, 63, 64, 65, 100, 128, 130, 1000}) {
      const int blocks = (T + kMmaBlockRows - 1) / kMmaBlockRows, inner = (T + bc - 1) / bc + 1;  // one past T too
      for (int blk = 0; blk < blocks; ++blk) {
        const int r0 = blk * kMmaBlockRows;
        const MmaRange keys = attention_mma_inner_tiles(AttentionMmaKernel::Forward, blk, bc, T);
        const MmaRange dq_keys = attention_mma_inner_tiles(AttentionMmaKernel::Dq, blk, bc, T);
        const MmaRange queries = attention_mma_inner_tiles(AttentionMmaKernel::Dkv, blk, bc, T);
        EXPECT_EQ(keys.first, dq_keys.first);
        EXPECT_EQ(keys.end, dq_keys.end);
        for (int j = 0; j < inner; ++j) {
          SCOPED_TRACE("inner " + std::to_string(bc) + ", T " + std::to_string(T) + ", block " + std::to_string(blk) +
                       ", inner tile " + std::to_string(j));
          // Forward and dq: the block's queries against key tile j.
          const MmaTileVisit qk = classify(r0, kMmaBlockRows, j * bc, bc, T);
          EXPECT_EQ(attention_mma_pair(r0, kMmaBlockRows, j * bc, bc, T), qk);
          EXPECT_EQ(j >= keys.first && j < keys.end, qk != MmaTileVisit::Skip);
          // Dkv: query tile j against the block's keys.
          const MmaTileVisit kq = classify(j * bc, bc, r0, kMmaBlockRows, T);
          EXPECT_EQ(attention_mma_pair(j * bc, bc, r0, kMmaBlockRows, T), kq);
          EXPECT_EQ(j >= queries.first && j < queries.end, kq != MmaTileVisit::Skip);
        }
      }
    }
  }
  // The 1.1B GPT's 1024 tokens in 64-row tiles: 136 of the 256 pairs visited, 16 masked.
  int visited = 0, masked = 0;
  for (int blk = 0; blk < 16; ++blk) {
    const MmaRange r = attention_mma_inner_tiles(AttentionMmaKernel::Forward, blk, 64, 1024);
    for (int j = r.first; j < r.end; ++j) {
      const MmaTileVisit v = attention_mma_pair(blk * 64, 64, j * 64, 64, 1024);
      visited += v != MmaTileVisit::Skip;
      masked += v == MmaTileVisit::Masked;
    }
  }
  EXPECT_EQ(visited, 136);
  EXPECT_EQ(masked, 16);
}

}  // namespace
}  // namespace strata
