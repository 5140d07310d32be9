// The tensor-core attention's kernels (strata/model/attention_mma_kernels.hpp) run on the
// CPU, each thread block emulated by 128 threads, against causal attention in double. CI
// has no GPU; this checks what the kernels' own code decides: every index, the mask, the
// online softmax, which tiles a block visits, the two-stage copies and their waits, and
// the fragment algebra that passes P from one product to the next in registers.
//
// What the emulation takes on trust is only the PTX ISA's definition of the instructions,
// encoded here from its tables and nowhere else: ldmatrix (which lane gives which row
// address; which elements each lane receives, plain and .trans) and
// mma.m16n8k16 (which elements of A, B and C each lane holds). It is also strict where a
// GPU is: every warp collective must be reached by all 32 lanes with the same operation
// (a divergent ldmatrix or mma fails the test), ldmatrix rows and cp.async destinations
// must be aligned and inside the block's shared memory, cp.async sources inside the
// inputs, and a cp.async lands only when its thread waits for its group: an ldmatrix of
// bytes a copy still has in flight fails (the hazard racecheck reports), and a read of a
// stage before its wait and barrier sees the poison the shared memory starts with (16-bit
// NaNs). Outputs sit between guard bytes that must stay untouched, and start as NaN so a
// row left unwritten fails.
#include "strata/model/attention_mma_kernels.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "strata/core/math/half.hpp"

namespace strata {
namespace {

using mma_attention::kThreads;

enum class Half { Bf16, Fp16 };

uint16_t to16(Half t, float v) { return t == Half::Bf16 ? math::float_to_bf16(v) : math::float_to_fp16(v); }
float from16(Half t, uint16_t v) { return t == Half::Bf16 ? math::bf16_to_float(v) : math::fp16_to_float(v); }

// A byte range the kernels may read with cp.async.
struct Range {
  const unsigned char* begin;
  size_t bytes;
};

// One emulated thread block: its shared memory, its barriers, the warps' exchange slots
// and the first error any thread met (the threads go on, so that no barrier deadlocks).
struct Block {
  enum class Op { None, Ldmatrix, LdmatrixTrans, Mma, Shuffle };
  struct Slot {
    Op op = Op::None;
    const uint16_t* row = nullptr;
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float v = 0.0f;
  };

  int bx, by, gx;
  std::vector<unsigned char> smem;
  // Per 4 bytes of smem, the cp.async copies into it issued and not yet landed: ldmatrix
  // reading such bytes reads what the GPU leaves undefined (racecheck's hazard).
  std::vector<std::atomic<int>> in_flight;
  std::vector<Range> readable;
  std::barrier<> all{kThreads};
  std::vector<std::unique_ptr<std::barrier<>>> warp;
  Slot slots[kThreads / 32][2][32];  // [warp][parity][lane]
  std::mutex mu;
  std::string error;

  Block(int x, int y, int blocks_x, size_t bytes, std::vector<Range> inputs)
      : bx(x), by(y), gx(blocks_x), smem(bytes, 0xFF), in_flight(bytes / 4), readable(std::move(inputs)) {
    for (int w = 0; w < kThreads / 32; ++w) warp.push_back(std::make_unique<std::barrier<>>(32));
  }
  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.empty()) error = what;
  }
  bool in_shared(const void* p, size_t bytes) const {
    const auto* c = static_cast<const unsigned char*>(p);
    return c >= smem.data() && c + bytes <= smem.data() + smem.size();
  }
  // Adds `by` to the in-flight count of [p, p + bytes); false where a copy overlapped it.
  bool mark(const void* p, size_t bytes, int by) {
    const size_t at = static_cast<size_t>(static_cast<const unsigned char*>(p) - smem.data()) / 4;
    bool clear = true;
    for (size_t i = at; i < at + bytes / 4; ++i) clear &= in_flight[i].fetch_add(by) == (by > 0 ? 0 : 1);
    return clear;
  }
  bool landed(const void* p, size_t bytes) const {
    const size_t at = static_cast<size_t>(static_cast<const unsigned char*>(p) - smem.data()) / 4;
    for (size_t i = at; i < at + bytes / 4; ++i)
      if (in_flight[i].load() != 0) return false;
    return true;
  }
  bool in_inputs(const void* p, size_t bytes) const {
    const auto* c = static_cast<const unsigned char*>(p);
    for (const Range& r : readable)
      if (c >= r.begin && c + bytes <= r.begin + r.bytes) return true;
    return false;
  }
};

// The Gpu interface of attention_mma_kernels.hpp for one emulated thread.
template <Half T>
class EmulatedThread {
 public:
  EmulatedThread(Block& b, int tid) : b_(b), tid_(tid) {}
  ~EmulatedThread() {
    if (landed_ != copies_.size()) b_.fail("a thread ended with cp.async copies it never waited for");
  }

  int thread() const { return tid_; }
  int block_x() const { return b_.bx; }
  int block_y() const { return b_.by; }
  int blocks_x() const { return b_.gx; }
  unsigned char* shared() const { return b_.smem.data(); }

  // ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA, "Warp-level matrix load
  // instruction: ldmatrix"): threads 8 i .. 8 i + 7 give the addresses of rows 0-7 of
  // matrix i; each row is 8 16-bit elements. Thread l receives, of matrix i in r[i], row
  // l / 4, elements 2 (l % 4) and + 1; with .trans, column l / 4 of rows 2 (l % 4), + 1.
  void ldmatrix(uint32_t (&r)[4], const uint16_t* row, bool trans) {
    if (!b_.in_shared(row, 16) || reinterpret_cast<uintptr_t>(row) % 16 != 0) {
      b_.fail("ldmatrix row address outside shared memory or not 16-byte aligned");
      row = reinterpret_cast<const uint16_t*>(b_.smem.data());
    }
    if (!b_.landed(row, 16)) b_.fail("ldmatrix read shared memory that a cp.async still has in flight");
    Block::Slot& mine = slot();
    mine.op = trans ? Block::Op::LdmatrixTrans : Block::Op::Ldmatrix;
    mine.row = row;
    exchange();
    const int l = lane(), gq = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) {
      uint16_t lo, hi;
      if (!trans) {
        const uint16_t* p = other(8 * i + gq).row;
        lo = p[2 * t];
        hi = p[2 * t + 1];
      } else {
        lo = other(8 * i + 2 * t).row[gq];
        hi = other(8 * i + 2 * t + 1).row[gq];
      }
      r[i] = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
    }
    done();
  }

  // mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (PTX ISA, "Matrix
  // Fragments for mma.m16n8k16 with floating point type"), groupID = lane / 4,
  // threadID_in_group = lane % 4; two 16-bit elements a register, the lower index low.
  //   A a0..a7: row groupID for a0, a1, a4, a5, groupID + 8 for the rest; column
  //     2 threadID_in_group + (i & 1), + 8 for i >= 4.
  //   B b0..b3: row 2 threadID_in_group + (i & 1), + 8 for i >= 2; column groupID.
  //   C c0..c3: row groupID for i < 2, groupID + 8 after; column 2 threadID_in_group + (i & 1).
  void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    Block::Slot& mine = slot();
    mine.op = Block::Op::Mma;
    std::copy(a, a + 4, mine.a);
    mine.b[0] = b0;
    mine.b[1] = b1;
    exchange();
    double A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
      const Block::Slot& s = other(l);
      const int g = l / 4, t = l % 4;
      for (int i = 0; i < 8; ++i) {
        const int row = g + ((i / 2) % 2) * 8, col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
        A[row][col] = element(s.a[i / 2], i % 2);
      }
      for (int i = 0; i < 4; ++i) {
        const int row = 2 * t + (i & 1) + (i >= 2 ? 8 : 0), col = g;
        B[row][col] = element(s.b[i / 2], i % 2);
      }
    }
    const int g = lane() / 4, t = lane() % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
      double sum = 0.0;
      for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
      d[i] = static_cast<float>(d[i] + sum);
    }
    done();
  }

  uint32_t pack(float lo, float hi) const {
    return static_cast<uint32_t>(to16(T, lo)) | static_cast<uint32_t>(to16(T, hi)) << 16;
  }
  float ex2(float x) const { return std::exp2(x); }

  float shfl_xor(float v, int mask) {
    Block::Slot& mine = slot();
    mine.op = Block::Op::Shuffle;
    mine.v = v;
    exchange();
    const float got = other(lane() ^ mask).v;
    done();
    return got;
  }

  void sync() { b_.all.arrive_and_wait(); }

  void copy16(void* dst, const void* src, bool valid) { copy(dst, src, valid, 16); }
  void copy4(void* dst, const void* src, bool valid) { copy(dst, src, valid, 4); }
  void commit() { groups_.push_back(copies_.size()); }
  void wait_all_but_newest() { land(groups_.size() >= 2 ? groups_[groups_.size() - 2] : 0); }
  void wait_all() { land(groups_.empty() ? 0 : groups_.back()); }

 private:
  struct Copy {
    void* dst;
    const void* src;
    bool valid;
    size_t bytes;
  };

  int lane() const { return tid_ % 32; }
  Block::Slot& slot() { return b_.slots[tid_ / 32][parity_][lane()]; }
  const Block::Slot& other(int l) const { return b_.slots[tid_ / 32][parity_][l]; }
  // Every lane has written its slot; the lanes must agree on the operation. The next
  // collective uses the other parity, so a lane that runs ahead cannot overwrite a slot
  // another is still reading: it would first have to pass that collective's barrier.
  void exchange() {
    b_.warp[tid_ / 32]->arrive_and_wait();
    for (int l = 0; l < 32; ++l)
      if (other(l).op != other(lane()).op) b_.fail("lanes of one warp reached different collectives");
  }
  void done() { parity_ ^= 1; }
  float element(uint32_t reg, int half) const {
    return from16(T, static_cast<uint16_t>(half == 0 ? reg & 0xFFFFu : reg >> 16));
  }

  void copy(void* dst, const void* src, bool valid, size_t bytes) {
    if (!b_.in_shared(dst, bytes) || reinterpret_cast<uintptr_t>(dst) % bytes != 0) {
      b_.fail("cp.async destination outside shared memory or misaligned");
      return;
    }
    if (valid && (!b_.in_inputs(src, bytes) || reinterpret_cast<uintptr_t>(src) % bytes != 0)) {
      b_.fail("cp.async source outside the inputs or misaligned");
      return;
    }
    if (!b_.mark(dst, bytes, 1)) b_.fail("two cp.async copies in flight into the same shared memory");
    copies_.push_back({dst, src, valid, bytes});
  }
  void land(size_t upto) {
    for (; landed_ < upto; ++landed_) {
      const Copy& c = copies_[landed_];
      if (c.valid) std::memcpy(c.dst, c.src, c.bytes);
      else std::memset(c.dst, 0, c.bytes);
      b_.mark(c.dst, c.bytes, -1);
    }
  }

  Block& b_;
  int tid_;
  int parity_ = 0;
  std::vector<Copy> copies_;
  std::vector<size_t> groups_;  // copies_.size() at each commit
  size_t landed_ = 0;
};

// Runs body(thread) for every thread of every block of a (gx, gy) grid.
template <Half T, class Body>
std::string run_grid(int gx, int gy, size_t shared_bytes, const std::vector<Range>& inputs, Body body) {
  for (int by = 0; by < gy; ++by) {
    for (int bx = 0; bx < gx; ++bx) {
      Block block(bx, by, gx, shared_bytes, inputs);
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&block, &body, t] {
          EmulatedThread<T> g(block, t);
          body(g);
        });
      for (std::thread& th : threads) th.join();
      if (!block.error.empty()) return "block (" + std::to_string(bx) + ", " + std::to_string(by) + "): " + block.error;
    }
  }
  return "";
}

// A buffer with 64 guard bytes on each side that must stay 0xA5.
template <class E>
struct Guarded {
  static constexpr size_t kGuard = 64 / sizeof(E);
  std::vector<E> all;
  size_t n;
  Guarded(size_t count, E fill) : all(count + 2 * kGuard), n(count) {
    std::memset(all.data(), 0xA5, all.size() * sizeof(E));
    std::fill(data(), data() + n, fill);
  }
  E* data() { return all.data() + kGuard; }
  bool guards_intact() const {
    const auto* bytes = reinterpret_cast<const unsigned char*>(all.data());
    const size_t g = kGuard * sizeof(E), total = all.size() * sizeof(E);
    for (size_t i = 0; i < g; ++i)
      if (bytes[i] != 0xA5 || bytes[total - 1 - i] != 0xA5) return false;
    return true;
  }
};

struct Shape {
  int B, T, H, hd;
  int d() const { return H * hd; }
};

// Causal attention in double over the 16-bit inputs: out, lse, and (given dout) dqkv.
struct Reference {
  std::vector<double> out, lse, dqkv;
};

Reference reference(const Shape& s, const std::vector<double>& qkv, const std::vector<double>& dout) {
  const int d = s.d(), T = s.T;
  const long ld = 3L * d;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.hd));
  Reference r{std::vector<double>(static_cast<size_t>(s.B) * T * d), std::vector<double>(static_cast<size_t>(s.B) * s.H * T),
              std::vector<double>(static_cast<size_t>(s.B) * T * ld, 0.0)};
  std::vector<double> p(T), dp(T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h) {
      const auto at = [&](int t, int part, int c) { return qkv[(static_cast<long>(b) * T + t) * ld + part * d + h * s.hd + c]; };
      const auto g = [&](int t, int c) { return dout[(static_cast<long>(b) * T + t) * d + h * s.hd + c]; };
      const auto grad = [&](int t, int part, int c) -> double& {
        return r.dqkv[(static_cast<long>(b) * T + t) * ld + part * d + h * s.hd + c];
      };
      for (int q = 0; q < T; ++q) {
        double mx = -INFINITY;
        for (int k = 0; k <= q; ++k) {
          double dot = 0.0;
          for (int c = 0; c < s.hd; ++c) dot += at(q, 0, c) * at(k, 1, c);
          p[k] = scale * dot;
          mx = std::max(mx, p[k]);
        }
        double sum = 0.0;
        for (int k = 0; k <= q; ++k) sum += p[k] = std::exp(p[k] - mx);
        for (int k = 0; k <= q; ++k) p[k] /= sum;
        r.lse[(static_cast<long>(b) * s.H + h) * T + q] = mx + std::log(sum);
        double D = 0.0;
        for (int c = 0; c < s.hd; ++c) {
          double o = 0.0;
          for (int k = 0; k <= q; ++k) o += p[k] * at(k, 2, c);
          r.out[(static_cast<long>(b) * T + q) * d + h * s.hd + c] = o;
          D += o * g(q, c);
        }
        for (int k = 0; k <= q; ++k) {
          double v = 0.0;
          for (int c = 0; c < s.hd; ++c) v += g(q, c) * at(k, 2, c);
          dp[k] = p[k] * (v - D);  // dS
        }
        for (int k = 0; k <= q; ++k)
          for (int c = 0; c < s.hd; ++c) {
            grad(q, 0, c) += scale * dp[k] * at(k, 1, c);
            grad(k, 1, c) += scale * dp[k] * at(q, 0, c);
            grad(k, 2, c) += p[k] * g(q, c);
          }
      }
    }
  return r;
}

// The largest |got - want| over the tensor, against tol times its largest |want| (a
// reference of all zeros, which a no-op would match, only where the math makes it so);
// the elements compared are those `keep` says, every one of them must be finite.
template <class Got>
void expect_close(const char* what, const std::vector<double>& want, Got got, double tol,
                  const std::function<bool(size_t)>& keep = [](size_t) { return true; }) {
  double worst = 0.0, scale = 0.0;
  size_t bad = want.size();
  for (size_t i = 0; i < want.size(); ++i) {
    if (!keep(i)) continue;
    const double g = got(i);
    if (!std::isfinite(g) && bad == want.size()) bad = i;
    scale = std::max(scale, std::abs(want[i]));
    worst = std::max(worst, std::abs(g - want[i]));
  }
  EXPECT_EQ(bad, want.size()) << what << ": element " << bad << " is not finite (never written?)";
  if (scale == 0.0) {  // dq and dk at T = 1: a softmax over one key has no gradient
    EXPECT_LE(worst, 1e-6) << what << ": the reference is all zeros, the kernel's largest is " << worst;
    return;
  }
  EXPECT_LE(worst, tol * scale) << what << ": worst error " << worst << " against a largest entry of " << scale;
}

// Forward, then D = rowsum(dO * O) from its output as attention_dot_kernel makes it, then
// dq and dkv, each kernel with the inner tile its plan gives or `inner` where set.
template <Half T, int BCF, int BCQ, int BCK, int NP>
void check(const Shape& s, double tol) {
  SCOPED_TRACE("B " + std::to_string(s.B) + ", T " + std::to_string(s.T) + ", H " + std::to_string(s.H) + ", hd " +
               std::to_string(s.hd) + ", inner " + std::to_string(BCF) + "/" + std::to_string(BCQ) + "/" +
               std::to_string(BCK) + (T == Half::Bf16 ? ", bf16" : ", fp16"));
  const int d = s.d();
  const size_t rows = static_cast<size_t>(s.B) * s.T, stats = static_cast<size_t>(s.B) * s.H * s.T;
  std::mt19937 rng(1234 + s.T + s.hd);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Inputs rounded to 16 bits; the reference sees the rounded values. q and k at a
  // spread that makes the softmax far from uniform (scores of several units).
  std::vector<uint16_t> qkv(rows * 3 * d), dout(rows * d);
  std::vector<double> qkv_d(qkv.size()), dout_d(dout.size());
  for (size_t i = 0; i < qkv.size(); ++i) {
    const bool is_v = (i % (3 * d)) >= static_cast<size_t>(2 * d);
    qkv[i] = to16(T, normal(rng) * (is_v ? 1.0f : 1.7f));
    qkv_d[i] = from16(T, qkv[i]);
  }
  for (size_t i = 0; i < dout.size(); ++i) dout_d[i] = from16(T, dout[i] = to16(T, normal(rng)));
  const Reference ref = reference(s, qkv_d, dout_d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  const int tiles = (s.T + kMmaBlockRows - 1) / kMmaBlockRows, bh = s.B * s.H;
  const Range in_qkv{reinterpret_cast<const unsigned char*>(qkv.data()), qkv.size() * 2};

  Guarded<uint16_t> out(rows * d, 0xFFFF);  // 16-bit NaN in both formats
  Guarded<float> lse(stats, NAN);
  const AttentionMmaLayout fl = attention_mma_layout(AttentionMmaKernel::Forward, BCF, s.hd);
  std::string err = run_grid<T>(tiles, bh, fl.bytes, {in_qkv}, [&](auto& g) {
    mma_attention::forward<BCF, NP>(g, qkv.data(), out.data(), lse.data(), s.T, d, s.H, scale, fl);
  });
  ASSERT_EQ(err, "") << "forward";
  EXPECT_TRUE(out.guards_intact()) << "forward wrote outside out";
  EXPECT_TRUE(lse.guards_intact()) << "forward wrote outside lse";
  expect_close("out", ref.out, [&](size_t i) { return static_cast<double>(from16(T, out.data()[i])); }, tol);
  expect_close("lse", ref.lse, [&](size_t i) { return static_cast<double>(lse.data()[i]); }, 1e-5);

  std::vector<float> dot(stats);
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int h = 0; h < s.H; ++h) {
        double D = 0.0;
        for (int c = 0; c < s.hd; ++c) {
          const size_t i = (static_cast<size_t>(b) * s.T + t) * d + h * s.hd + c;
          D += static_cast<double>(from16(T, out.data()[i])) * dout_d[i];
        }
        dot[(static_cast<size_t>(b) * s.H + h) * s.T + t] = static_cast<float>(D);
      }
  const std::vector<Range> ins = {in_qkv, {reinterpret_cast<const unsigned char*>(dout.data()), dout.size() * 2},
                                  {reinterpret_cast<const unsigned char*>(lse.data()), stats * 4},
                                  {reinterpret_cast<const unsigned char*>(dot.data()), stats * 4}};
  Guarded<float> dqkv(rows * 3 * d, NAN);
  const AttentionMmaLayout ql = attention_mma_layout(AttentionMmaKernel::Dq, BCQ, s.hd);
  err = run_grid<T>(tiles, bh, ql.bytes, ins, [&](auto& g) {
    mma_attention::dq<BCQ, NP>(g, qkv.data(), lse.data(), dout.data(), dot.data(), dqkv.data(), s.T, d, s.H, scale, ql);
  });
  ASSERT_EQ(err, "") << "dq";
  const AttentionMmaLayout kl = attention_mma_layout(AttentionMmaKernel::Dkv, BCK, s.hd);
  err = run_grid<T>(tiles, bh, kl.bytes, ins, [&](auto& g) {
    mma_attention::dkv<BCK, NP>(g, qkv.data(), lse.data(), dout.data(), dot.data(), dqkv.data(), s.T, d, s.H, scale, kl);
  });
  ASSERT_EQ(err, "") << "dkv";
  EXPECT_TRUE(dqkv.guards_intact()) << "dq or dkv wrote outside dqkv";
  for (int part = 0; part < 3; ++part) {
    const char* names[] = {"dq", "dk", "dv"};
    expect_close(names[part], ref.dqkv, [&](size_t i) { return static_cast<double>(dqkv.data()[i]); }, tol,
                 [&](size_t i) { return static_cast<int>(i % (3 * d)) / d == part; });
  }
}

// The plan's choices on an H100 (BC 64; dkv 32 past head dimension 64) and the smaller
// tiles a GPU of less shared memory gets; T on, before and past a tile edge; two
// sequences and two heads so every index of b and h is exercised.
constexpr double kBf16Tol = 2e-2, kFp16Tol = 3e-3;

TEST(AttentionMmaEmulated, Bf16HeadDim64) {
  check<Half::Bf16, 64, 64, 64, 4>({2, 80, 2, 64}, kBf16Tol);
}
TEST(AttentionMmaEmulated, Fp16HeadDim64SmallTiles) {
  check<Half::Fp16, 32, 32, 32, 4>({1, 130, 2, 64}, kFp16Tol);
}
TEST(AttentionMmaEmulated, Bf16HeadDim128AsOnAnH100) {
  check<Half::Bf16, 64, 64, 32, 8>({1, 130, 1, 128}, kBf16Tol);
}
TEST(AttentionMmaEmulated, Fp16HeadDim16And48) {
  check<Half::Fp16, 64, 64, 64, 4>({1, 64, 3, 16}, kFp16Tol);
  check<Half::Fp16, 64, 64, 64, 4>({1, 33, 1, 48}, kFp16Tol);
}
TEST(AttentionMmaEmulated, Bf16HeadDim96OneToken) {
  check<Half::Bf16, 64, 32, 32, 8>({2, 1, 1, 96}, kBf16Tol);
}

}  // namespace
}  // namespace strata
