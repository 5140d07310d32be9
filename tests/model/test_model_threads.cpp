// How many threads the cpu model computes on (model/src/parallel.hpp, threads_for):
// OMP_NUM_THREADS where set, else the process's cores, shared among the ranks of its node
// that a launcher left unbound.
#include <gtest/gtest.h>

#include "parallel.hpp"

namespace strata::detail {
namespace {

TEST(ModelThreads, OmpNumThreadsThenTheCoresSharedAmongUnboundRanks) {
  // One process: every core it may run on.
  EXPECT_EQ(threads_for(nullptr, 8, 8, nullptr), 8u);
  EXPECT_EQ(threads_for(nullptr, 3, 8, nullptr), 3u);  // taskset / a cpuset: its own cores
  // Ranks that share the node's cores, unbound: a share each, at least one.
  EXPECT_EQ(threads_for(nullptr, 8, 8, "2"), 4u);
  EXPECT_EQ(threads_for(nullptr, 8, 8, "3"), 2u);
  EXPECT_EQ(threads_for(nullptr, 2, 2, "4"), 1u);
  EXPECT_EQ(threads_for(nullptr, 8, 8, "1"), 8u);
  // Bound ranks (mpirun --bind-to core, srun's default): the cores of their own mask.
  EXPECT_EQ(threads_for(nullptr, 2, 8, "4"), 2u);
  // OMP_NUM_THREADS decides where it starts with a positive number, as OpenMP reads it.
  EXPECT_EQ(threads_for("3", 8, 8, "4"), 3u);
  EXPECT_EQ(threads_for("4,2", 2, 2, nullptr), 4u);
  for (const char* ignored : {"", "0", "-2", "many"}) {
    EXPECT_EQ(threads_for(ignored, 8, 8, "2"), 4u) << "OMP_NUM_THREADS='" << ignored << "'";
  }
  EXPECT_EQ(threads_for(nullptr, 8, 8, "lots"), 8u);
  EXPECT_GE(model_threads(), 1u);
}

}  // namespace
}  // namespace strata::detail
