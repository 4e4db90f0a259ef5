// Pure rank layout of a dp x sp mesh: DeviceMesh's static helpers (see mesh.h).
#include "comm/mesh.h"
#include "common/error.h"

namespace ulysses::comm {
namespace {

void check_rank(int rank, int64_t dp, int64_t sp) {
  TORCH_CHECK(dp >= 1 && sp >= 1, "mesh layout: dp ", dp, " and sp ", sp, " must be >= 1");
  TORCH_CHECK(rank >= 0 && rank < dp * sp, "mesh layout: rank ", rank, " is outside 0..",
              dp * sp - 1);
}

}  // namespace

void DeviceMesh::check_shape(int world, int64_t dp, int64_t sp) {
  if (dp < 1 || sp < 1) {
    throw UserError("mesh: dp (" + std::to_string(dp) + ") and sp (" + std::to_string(sp) +
                    ") must be >= 1");
  }
  if (dp * sp != world) {
    throw UserError("mesh: dp (" + std::to_string(dp) + ") x sp (" + std::to_string(sp) +
                    ") = " + std::to_string(dp * sp) + " does not equal the world size " +
                    std::to_string(world));
  }
}

std::vector<int> DeviceMesh::sp_group_ranks(int rank, int64_t dp, int64_t sp) {
  check_rank(rank, dp, sp);
  const int first = static_cast<int>(rank / sp * sp);
  std::vector<int> ranks;
  for (int64_t i = 0; i < sp; ++i) ranks.push_back(first + static_cast<int>(i));
  return ranks;
}

std::vector<int> DeviceMesh::dp_group_ranks(int rank, int64_t dp, int64_t sp) {
  check_rank(rank, dp, sp);
  const int first = static_cast<int>(rank % sp);
  std::vector<int> ranks;
  for (int64_t j = 0; j < dp; ++j) ranks.push_back(first + static_cast<int>(j * sp));
  return ranks;
}

std::vector<std::vector<int>> DeviceMesh::all_sp_groups(int64_t dp, int64_t sp) {
  std::vector<std::vector<int>> groups;
  for (int64_t i = 0; i < dp; ++i)
    groups.push_back(sp_group_ranks(static_cast<int>(i * sp), dp, sp));
  return groups;
}

std::vector<std::vector<int>> DeviceMesh::all_dp_groups(int64_t dp, int64_t sp) {
  std::vector<std::vector<int>> groups;
  for (int64_t j = 0; j < sp; ++j) groups.push_back(dp_group_ranks(static_cast<int>(j), dp, sp));
  return groups;
}

std::vector<std::pair<int64_t, int64_t>> DeviceMesh::valid_shapes(int world) {
  TORCH_CHECK(world >= 1, "mesh layout: world ", world, " must be >= 1");
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int64_t sp = 1; sp <= world; ++sp) {
    if (world % sp == 0) shapes.emplace_back(world / sp, sp);
  }
  return shapes;
}

}  // namespace ulysses::comm
