// `meshtrain plot` (train/plot.h): metrics files read, curves drawn per run and panel, bad files named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "meshtrain/train/plot.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

std::string write(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / (std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p.string();
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

TEST(Plot, TicksAreRoundAndCoverTheRange) {
  EXPECT_EQ(nice_ticks(0, 10), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(nice_ticks(3.7, 5.2), (std::vector<double>{4, 4.5, 5}));
  EXPECT_EQ(nice_ticks(1, 300, 6), (std::vector<double>{50, 100, 150, 200, 250, 300}));
}

TEST(Plot, EachRunIsACurveInEveryPanelItHasValuesFor) {
  const std::string a = write("a.jsonl", "{\"step\": 1, \"loss\": 5.0, \"lr\": 1e-3, \"grad_norm\": 2, \"tokens_per_s\": 900}\n"
                                         "{\"step\": 2, \"loss\": 4.0, \"lr\": 2e-3, \"grad_norm\": 1, \"tokens_per_s\": 950,"
                                         " \"val_loss\": 4.5}\n{\"note\": \"no step: skipped\"}\n");
  const std::string b = write("b.jsonl", "{\"step\": 1, \"loss\": 6.0, \"lr\": 1e-3}\n{\"step\": 3, \"loss\": 3.5, \"lr\": 3e-3}\n");
  const std::vector<MetricsRun> runs = {read_metrics(a, "tp=2"), read_metrics(b, "dp=2 <zero>")};
  EXPECT_EQ(runs[0].rows.size(), 2u);
  const std::string svg = plot_svg(runs, "demo");
  // a: loss, val_loss, lr, grad_norm, tokens/s; b: loss, lr.
  EXPECT_EQ(count(svg, "<polyline"), 7u);
  EXPECT_EQ(count(svg, "stroke-dasharray"), 1u);  // validation loss
  EXPECT_NE(svg.find("dp=2 &lt;zero&gt;"), std::string::npos);  // labels escaped
  EXPECT_NE(svg.find(">gradient norm<"), std::string::npos);
  // A panel no run has a value for is left out.
  const std::string only_loss = plot_svg({read_metrics(b, "b")}, "t");
  EXPECT_EQ(only_loss.find("tokens/s"), std::string::npos);
  fs::remove(a), fs::remove(b);
}

TEST(Plot, BadFilesAreNamed) {
  const std::string bad = write("bad.jsonl", "{\"step\": 1, \"loss\": 1}\nnot json\n");
  try {
    read_metrics(bad, "x");
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: not a JSON object"), std::string::npos) << e.what();
  }
  const std::string none = write("none.jsonl", "{\"loss\": 1}\n");
  EXPECT_THROW(read_metrics(none, "x"), std::invalid_argument);
  EXPECT_THROW(read_metrics(bad + ".missing", "x"), std::invalid_argument);
  fs::remove(bad), fs::remove(none);
}

}  // namespace
}  // namespace meshtrain
