// Mesh arithmetic for 1-8 ranks (and a large world): coordinates, slices,
// inference of dp, and the errors for meshes that do not fit.
#include <gtest/gtest.h>

#include <set>

#include "meshtrain/runtime/mesh.h"

namespace meshtrain {
namespace {

std::string error_of(int world, const std::string& spec, const std::string& order = "") {
  try {
    MeshLayout::create(world, MeshLayout::parse(spec), MeshLayout::parse_order(order));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(MeshLayout, TpIsFastestByDefault) {
  auto m = MeshLayout::create(8, {{"tp", 2}, {"pp", 2}});
  EXPECT_EQ(m.size("dp"), 2);
  // rank = tp + 2 * (dp + 2 * pp)
  EXPECT_EQ(m.coord(1, "tp"), 1);
  EXPECT_EQ(m.coord(2, "dp"), 1);
  EXPECT_EQ(m.coord(4, "pp"), 1);
  EXPECT_EQ(m.slice(5, {"tp"}), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.slice(5, {"dp"}), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.slice(5, {"pp"}), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.slice(5, {"dp", "cp"}), (std::vector<int>{5, 7}));
}

TEST(MeshLayout, EveryWorldUpToEightRoundTrips) {
  for (int w = 1; w <= 8; ++w) {
    for (int tp = 1; tp <= w; ++tp) {
      if (w % tp) continue;
      for (int pp = 1; pp <= w / tp; ++pp) {
        if ((w / tp) % pp) continue;
        auto m = MeshLayout::create(w, {{"tp", tp}, {"pp", pp}});
        EXPECT_EQ(m.size("tp") * m.size("dp") * m.size("pp"), w);
        for (int r = 0; r < w; ++r) {
          EXPECT_EQ(m.rank_of(m.coords(r)), r);
          // The slices along one axis partition the world.
          for (const auto& a : m.order()) {
            auto s = m.slice(r, {a});
            EXPECT_EQ(static_cast<int>(s.size()), m.size(a));
            EXPECT_EQ(s[m.coord(r, a)], r);
          }
        }
        std::set<std::vector<int>> tp_groups;
        for (int r = 0; r < w; ++r) tp_groups.insert(m.slice(r, {"tp"}));
        EXPECT_EQ(static_cast<int>(tp_groups.size()), w / tp);
      }
    }
  }
}

TEST(MeshLayout, CustomOrder) {
  auto m = MeshLayout::create(4, {{"tp", 2}, {"dp", 2}}, MeshLayout::parse_order("dp,tp,cp,ep,pp"));
  EXPECT_EQ(m.slice(0, {"dp"}), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.slice(0, {"tp"}), (std::vector<int>{0, 2}));
}

TEST(MeshLayout, TableShowsNodeLocality) {
  auto m = MeshLayout::create(16, {{"tp", 8}});
  std::string t = m.table(8);
  EXPECT_NE(t.find("axes inside a node: tp"), std::string::npos) << t;
  EXPECT_NE(t.find("axes across nodes: dp"), std::string::npos) << t;
  EXPECT_EQ(MeshLayout::create(4096, {{"tp", 8}, {"pp", 8}}).table(8).find("... 4032 more ranks") != std::string::npos,
            true);
}

TEST(MeshLayout, ClearErrors) {
  EXPECT_NE(error_of(6, "tp=4").find("not divisible"), std::string::npos);
  EXPECT_NE(error_of(8, "tp=2,dp=2").find("covers 4 ranks but the world has 8"), std::string::npos);
  EXPECT_NE(error_of(4, "xp=2").find("unknown mesh axis 'xp'"), std::string::npos);
  EXPECT_NE(error_of(4, "tp=two").find("tp='two'"), std::string::npos);
  EXPECT_NE(error_of(4, "tp2").find("not axis=size"), std::string::npos);
  EXPECT_NE(error_of(4, "tp=2,tp=2").find("given twice"), std::string::npos);
  EXPECT_NE(error_of(4, "tp=2", "tp,dp").find("must list every axis"), std::string::npos);
  EXPECT_NE(error_of(4, "tp=0").find("at least 1"), std::string::npos);
}

}  // namespace
}  // namespace meshtrain
