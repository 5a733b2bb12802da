// DeviceMesh on real ranks: every axis group and the dp x cp group contain
// exactly the ranks the layout arithmetic says (checked by summing global rank
// ids over each group), for every mesh the world size allows.
#include <gtest/gtest.h>

#include <ATen/Functions.h>

#include "meshtrain/comm/comm.h"
#include "meshtrain/runtime/mesh.h"
#include "tests/mp.h"

namespace meshtrain::test {
namespace {

void check_mesh(const std::map<std::string, int>& sizes) {
  Runtime& rt = runtime();
  DeviceMesh mesh(rt, MeshLayout::create(rt.world_size(), sizes));
  const auto& layout = mesh.layout();
  std::vector<std::vector<std::string>> groups;
  for (const auto& a : layout.order()) groups.push_back({a});
  groups.push_back({"dp", "cp"});
  for (const auto& axes : groups) {
    Comm& g = mesh.group(axes);
    const auto want_ranks = layout.slice(rt.rank(), axes);
    EXPECT_EQ(g.ranks(), want_ranks);
    EXPECT_EQ(g.ranks()[g.rank()], rt.rank());
    at::Tensor t = at::full({1}, static_cast<int64_t>(rt.rank()), at::kLong);
    g.all_reduce(t);
    int64_t want = 0;
    for (int r : want_ranks) want += r;
    EXPECT_EQ(t.item<int64_t>(), want) << layout.describe() << " group " << g.name();
  }
  // Coordinates agree with the group positions.
  for (const auto& a : layout.order()) EXPECT_EQ(mesh.axis(a).rank(), mesh.coord(a));
  if (rt.rank() == 0) std::printf("%s", layout.table(rt.env().local_world_size).c_str());
  rt.world().barrier();
}

TEST(Mesh, EveryFactorisationOfTheWorld) {
  const int w = runtime().world_size();
  for (int tp = 1; tp <= w; ++tp) {
    if (w % tp) continue;
    for (int pp = 1; pp <= w / tp; ++pp) {
      if ((w / tp) % pp) continue;
      check_mesh({{"tp", tp}, {"pp", pp}});
    }
  }
}

TEST(Mesh, ThreeDimensionsWithContextParallel) {
  const int w = runtime().world_size();
  if (w % 8 != 0) GTEST_SKIP() << "tp 2 x cp 2 x pp 2 needs a multiple of 8 ranks";
  check_mesh({{"tp", 2}, {"cp", 2}, {"pp", 2}});
}

TEST(Mesh, MismatchedWorldIsAClearError) {
  Runtime& rt = runtime();
  try {
    DeviceMesh mesh(rt, MeshLayout::create(rt.world_size() * 2, {{"tp", 2}}));
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ranks but the job has"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtrain::test
