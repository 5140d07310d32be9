// attention_mma_plan.hpp on the CPU: what the tensor-core attention (STRATA_ATTENTION=mma,
// model/src/attention_mma_cuda.cu) decides on the host, checked where CI runs since no
// GPU there runs the kernels: the shared-memory layout each kernel carves (WMMA's
// alignment and pitch rules, no overlaps, the bytes asked for), the tile a GPU's limit
// allows, the types and head dimensions refused, and which tile pairs the causal mask
// skips, masks or takes whole, against the element-by-element mask.
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
  const char* what;
  uint32_t offset, bytes;
};

// The buffers a layout has, with their sizes as the kernels use them.
std::vector<Buffer> buffers(const AttentionMmaLayout& l) {
  const uint32_t bt = static_cast<uint32_t>(l.tile);
  const uint32_t t16 = bt * l.pitch16 * 2, s32 = bt * l.pitch_scores * 4, p16 = bt * l.pitch_probs * 2;
  std::vector<Buffer> all = {{"q", l.q, t16},           {"k", l.k, t16},         {"v", l.v, t16},
                             {"dout", l.dout, t16},     {"scores", l.scores, s32}, {"dscores", l.dscores, s32},
                             {"probs", l.probs, p16},   {"dprobs", l.dprobs, p16}, {"stats", l.stats, 2 * bt * 4}};
  std::vector<Buffer> present;
  for (const Buffer& b : all)
    if (b.offset != kMmaNoBuffer) present.push_back(b);
  return present;
}

std::vector<std::string> names(const AttentionMmaLayout& l) {
  std::vector<std::string> n;
  for (const Buffer& b : buffers(l)) n.emplace_back(b.what);
  std::sort(n.begin(), n.end());
  return n;
}

TEST(AttentionMmaLayout, EachKernelHasItsBuffers) {
  using V = std::vector<std::string>;
  EXPECT_EQ(names(attention_mma_layout(AttentionMmaKernel::Forward, 64, 128)), (V{"k", "probs", "q", "scores", "v"}));
  EXPECT_EQ(names(attention_mma_layout(AttentionMmaKernel::Dq, 64, 128)),
            (V{"dout", "dprobs", "dscores", "k", "q", "scores", "v"}));
  EXPECT_EQ(names(attention_mma_layout(AttentionMmaKernel::Dkv, 64, 128)),
            (V{"dout", "dprobs", "dscores", "k", "probs", "q", "scores", "stats", "v"}));
}

// WMMA: 16-bit ldm a multiple of 8 elements, fp32 ldm a multiple of 4, every fragment
// pointer 32-byte aligned (a warp's strip starts 16 rows down, a fragment 16 columns
// across); the 16-byte copies into the 16-bit tiles need 16-byte rows; the padding makes
// a row an odd multiple of 4 words long, so 8 consecutive rows start in 8 different groups
// of 4 banks. Buffers 128-byte aligned, disjoint, inside the bytes.
TEST(AttentionMmaLayout, AlignedDisjointAndPadded) {
  for (const AttentionMmaKernel kernel : kKernels) {
    for (int bt : {32, 64}) {
      for (int hd = 16; hd <= kMmaMaxHeadDim; hd += 16) {
        SCOPED_TRACE(std::string(name(kernel)) + ", tile " + std::to_string(bt) + ", head dimension " +
                     std::to_string(hd));
        const AttentionMmaLayout l = attention_mma_layout(kernel, bt, hd);
        EXPECT_EQ(l.tile, bt);
        EXPECT_EQ(l.head_dim, hd);
        EXPECT_EQ(l.pitch16 % 8, 0);
        EXPECT_EQ(l.pitch_probs % 8, 0);
        EXPECT_EQ(l.pitch_scores % 4, 0);
        EXPECT_GE(l.pitch16, hd);
        EXPECT_GE(l.pitch_scores, bt);
        EXPECT_GE(l.pitch_probs, bt);
        EXPECT_EQ(l.pitch16 * 2 % 16, 0);
        EXPECT_EQ(16 * l.pitch16 * 2 % 32, 0);
        EXPECT_EQ(16 * l.pitch_scores * 4 % 32, 0);
        EXPECT_EQ(16 * l.pitch_probs * 2 % 32, 0);
        EXPECT_EQ(l.pitch16 * 2 / 4 % 8, 4);  // 4-byte words per row: an odd multiple of 4
        EXPECT_EQ(l.pitch_scores % 8, 4);
        EXPECT_EQ(l.pitch_probs * 2 / 4 % 8, 4);
        std::vector<Buffer> bufs = buffers(l);
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
// as attention_mma_cuda.cu's header and the docs quote them: 16-bit tiles of 64 x (hd + 8),
// fp32 scores of 64 x 68, 16-bit probabilities of 64 x 72.
TEST(AttentionMmaLayout, BytesPerKernel) {
  const auto bytes = [](AttentionMmaKernel k, int bt, int hd) { return attention_mma_layout(k, bt, hd).bytes; };
  EXPECT_EQ(bytes(AttentionMmaKernel::Forward, 64, 128), 78848u);  // 3 x 17408 + 17408 + 9216
  EXPECT_EQ(bytes(AttentionMmaKernel::Dq, 64, 128), 113664u);      // 4 x 17408 + 2 x 17408 + 9216
  EXPECT_EQ(bytes(AttentionMmaKernel::Dkv, 64, 128), 123392u);     // 4 x 17408 + 2 x 17408 + 2 x 9216 + 512
  EXPECT_EQ(bytes(AttentionMmaKernel::Forward, 64, 64), 54272u);
  EXPECT_EQ(bytes(AttentionMmaKernel::Dq, 64, 64), 80896u);
  EXPECT_EQ(bytes(AttentionMmaKernel::Dkv, 64, 64), 90624u);
  EXPECT_EQ(bytes(AttentionMmaKernel::Dkv, 32, 128), 49408u);
  EXPECT_EQ(attention_mma_most_bytes(64, 128), 123392u);
  EXPECT_EQ(attention_mma_most_bytes(32, 64), bytes(AttentionMmaKernel::Dkv, 32, 64));
}

// Per-block opt-in limits: H100 and H200 227 KiB, A100 163 KiB, sm_86 and sm_89 99 KiB.
TEST(AttentionMmaTile, LargestThatFits) {
  constexpr uint64_t kH100 = 227 * 1024, kA100 = 163 * 1024, kSm89 = 99 * 1024;
  for (int hd = 16; hd <= kMmaMaxHeadDim; hd += 16) {
    EXPECT_EQ(attention_mma_tile(hd, kH100), 64) << hd;
    EXPECT_EQ(attention_mma_tile(hd, kA100), 64) << hd;
  }
  EXPECT_EQ(attention_mma_tile(64, kSm89), 64);
  EXPECT_EQ(attention_mma_tile(128, kSm89), 32);  // the dkv kernel's 123392 bytes at 64 rows do not fit
  EXPECT_EQ(attention_mma_tile(128, 48 * 1024), 0);
  EXPECT_EQ(attention_mma_tile(64, 48 * 1024), 32);
  // The tile chosen fits; a larger one would not; more memory never gives a smaller tile.
  for (int hd = 16; hd <= kMmaMaxHeadDim; hd += 16) {
    int last = 0;
    for (uint64_t limit = 16 * 1024; limit <= kH100; limit += 4096) {
      const int bt = attention_mma_tile(hd, limit);
      SCOPED_TRACE("head dimension " + std::to_string(hd) + ", limit " + std::to_string(limit));
      EXPECT_GE(bt, last);
      last = bt;
      if (bt != 0) {
        EXPECT_LE(attention_mma_most_bytes(bt, hd), limit);
      }
      if (bt != 64) {
        EXPECT_GT(attention_mma_most_bytes(64, hd), limit);
      }
      if (bt == 0) {
        EXPECT_GT(attention_mma_most_bytes(32, hd), limit);
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

// Each pair's class against the mask element by element (dkv's: key k visible to query q
// when k <= q and q < T), at lengths that end on, before and after a tile edge.
TEST(AttentionMmaVisit, MatchesTheMaskElementByElement) {
  for (int bt : {32, 64}) {
    for (int T : {1, 15, 16, 31, 32, 33, 63, 64, 65, 100, 128, 130, 1000}) {
      const int tiles = (T + bt - 1) / bt;
      for (int qt = 0; qt < tiles; ++qt) {
        for (int kt = 0; kt < tiles; ++kt) {
          long visible = 0, pairs = 0;
          for (int q = qt * bt; q < (qt + 1) * bt; ++q)
            for (int k = kt * bt; k < (kt + 1) * bt; ++k) ++pairs, visible += k <= q && q < T;
          const MmaTileVisit want = visible == 0        ? MmaTileVisit::Skip
                                    : visible == pairs ? MmaTileVisit::Whole
                                                       : MmaTileVisit::Masked;
          EXPECT_EQ(attention_mma_visit(qt, kt, bt, T), want)
              << "tile " << bt << ", T " << T << ", query tile " << qt << ", key tile " << kt;
          // The kernels' loops (forward and dq: key tiles 0 .. qt; dkv: query tiles kt ..
          // tiles - 1) visit exactly the pairs that are not skipped.
          EXPECT_EQ(kt <= qt, want != MmaTileVisit::Skip);
        }
      }
    }
  }
  // The 1.1B GPT's 1024 tokens in 64-row tiles: 136 of the 256 pairs visited, 16 masked.
  int visited = 0, masked = 0;
  for (int qt = 0; qt < 16; ++qt)
    for (int kt = 0; kt < 16; ++kt) {
      const MmaTileVisit v = attention_mma_visit(qt, kt, 64, 1024);
      visited += v != MmaTileVisit::Skip;
      masked += v == MmaTileVisit::Masked;
    }
  EXPECT_EQ(visited, 136);
  EXPECT_EQ(masked, 16);
}

}  // namespace
}  // namespace strata
