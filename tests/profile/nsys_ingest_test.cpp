// The nsys-SQLite ingest (tuner/nsys_profile/nsys_ingest.h) on a hand-built export with known
// answers (nsys_fixture.h): comm / compute / overlap per device inside the measured step
// ranges, the other domain's ranges ignored, and clear errors for unusable files.
#include "tuner/nsys_profile/nsys_ingest.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "nsys_fixture.h"
#include "common/remove_tree.h"

namespace fs = std::filesystem;

namespace ulysses::nsys_profile {
namespace {

constexpr double kTol = 1e-9;  // ms; integer ns in, exact sums out

class NsysIngest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("nsys-ingest-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    path_ = (dir_ / "profile.sqlite").string();
    testing::write_nsys_fixture(path_);
  }
  void TearDown() override { ulysses::remove_tree(dir_); }
  fs::path dir_;
  std::string path_;
};

TEST_F(NsysIngest, SplitsKernelTimeInsideMeasuredSteps) {
  IngestOptions options;
  options.skip_steps = 1;
  const KernelSplit split = ingest_nsys_sqlite(path_, options);
  EXPECT_EQ(split.steps, 4);  // steps 2 and 3 of two threads
  ASSERT_EQ(split.devices.size(), 2u);
  const DeviceSplit& d0 = split.devices[0];
  EXPECT_EQ(d0.device, 0);
  EXPECT_NEAR(d0.window_ms, 40.0, kTol);
  EXPECT_NEAR(d0.comm_ms, 12.0, kTol);
  EXPECT_NEAR(d0.compute_ms, 17.0, kTol);
  EXPECT_NEAR(d0.overlap_ms, 4.0, kTol);
  EXPECT_NEAR(d0.exposed_comm_ms(), 8.0, kTol);
  EXPECT_NEAR(d0.kernel_ms, 25.0, kTol);
  EXPECT_EQ(d0.comm_kernels, 2);
  EXPECT_EQ(d0.compute_kernels, 3);
  const DeviceSplit& d1 = split.devices[1];
  EXPECT_NEAR(d1.comm_ms, 5.0, kTol);
  EXPECT_NEAR(d1.compute_ms, 10.0, kTol);
  EXPECT_NEAR(d1.overlap_ms, 0.0, kTol);
  EXPECT_NEAR(d1.kernel_ms, 15.0, kTol);
  EXPECT_NEAR(split.total.comm_ms, 17.0, kTol);
  EXPECT_NEAR(split.total.compute_ms, 27.0, kTol);
  EXPECT_NEAR(split.total.overlap_ms, 4.0, kTol);
  EXPECT_NEAR(split.total.exposed_comm_ms(), 13.0, kTol);
  EXPECT_NEAR(split.total.window_ms, 80.0, kTol);
  EXPECT_NE(describe(split).find("device 0: window 40.000 ms"), std::string::npos)
      << describe(split);
}

TEST_F(NsysIngest, WarmupStepsCountWhenNotSkipped) {
  const KernelSplit split = ingest_nsys_sqlite(path_);  // skip_steps 0: window [0, 50)
  EXPECT_EQ(split.steps, 6);
  EXPECT_NEAR(split.devices[0].window_ms, 50.0, kTol);
  EXPECT_NEAR(split.devices[0].compute_ms, 21.0, kTol);  // + [1, 5)
}

TEST_F(NsysIngest, WithoutStepRangesTheWholeKernelSpanCounts) {
  {
    store::Database db = store::Database::open(path_);
    db.exec("DROP TABLE NVTX_EVENTS");
    db.exec("PRAGMA journal_mode=DELETE");
  }
  const KernelSplit split = ingest_nsys_sqlite(path_);
  EXPECT_EQ(split.steps, 0);
  EXPECT_NEAR(split.devices[0].window_ms, 59.0, kTol);   // [1, 60)
  EXPECT_NEAR(split.devices[0].compute_ms, 26.0, kTol);  // 4 + 8 + 4 + 5 + 5
  EXPECT_NEAR(split.devices[0].comm_ms, 12.0, kTol);
}

TEST_F(NsysIngest, UnusableFilesAreOneLineErrorsNamingTheFile) {
  const std::string no_kernels = (dir_ / "nokernels.sqlite").string();
  {
    store::Database db = store::Database::open(no_kernels);
    db.exec("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)");
    db.exec("PRAGMA journal_mode=DELETE");
  }
  for (const std::string& path :
       {no_kernels, (dir_ / "missing.sqlite").string(), (dir_ / "junk.sqlite").string()}) {
    if (path.find("junk") != std::string::npos) std::ofstream(path) << std::string(4096, 'x');
    try {
      ingest_nsys_sqlite(path);
      ADD_FAILURE() << "accepted " << path;
    } catch (const UserError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind(path + ": ", 0), 0u) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace ulysses::nsys_profile
