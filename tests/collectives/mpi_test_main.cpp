// main() for the multi-rank tests, run as `mpirun -np N test_collectives_mpi`.
// Every rank runs every test and exits non-zero when any of its checks failed, and
// mpirun then exits non-zero, so any rank's failure fails the CTest test. Ranks other
// than 0 print only their failures, each line marked with the rank.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(std::string rank) : rank_(std::move(rank)) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %s] %s:%d: Failure\n%s\n", rank_.c_str(), r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.message());
  }
  void OnTestEnd(const testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %s] [  FAILED  ] %s.%s\n", rank_.c_str(), info.test_suite_name(), info.name());
  }

 private:
  std::string rank_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  // The rank is known from the launcher before MPI starts (MPI starts lazily, in the
  // first test that makes a communicator).
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank == nullptr) rank = std::getenv("PMI_RANK");
  if (rank != nullptr && std::string(rank) != "0") {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  return RUN_ALL_TESTS();
}
