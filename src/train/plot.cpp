#include "meshtrain/train/plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace meshtrain {
namespace {

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

struct Series {
  std::string key;
  bool dashed;
};

struct Panel {
  std::string title;
  std::vector<Series> series;
};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string tick_label(double v) {
  if (v == 0) return "0";
  const double a = std::abs(v);
  if (a >= 1e5 || a < 1e-2) return fmt::format("{:.1e}", v);
  return fmt::format("{:g}", v);
}

}  // namespace

MetricsRun read_metrics(const std::string& path, const std::string& label) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(fmt::format("{}: cannot be read", path));
  MetricsRun run;
  run.label = label;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw std::invalid_argument(fmt::format("{}:{}: not a JSON object", path, n));
    }
    if (!j.is_object()) throw std::invalid_argument(fmt::format("{}:{}: not a JSON object", path, n));
    if (!j.contains("step") || !j["step"].is_number()) continue;
    std::map<std::string, double> row;
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.value().is_number()) row[it.key()] = it.value().get<double>();
    run.rows.push_back(std::move(row));
  }
  if (run.rows.empty()) {
    throw std::invalid_argument(fmt::format("{}: no metrics lines (JSON objects with a \"step\"); give the file a run "
                                            "writes to train.metrics",
                                            path));
  }
  return run;
}

std::vector<double> nice_ticks(double lo, double hi, int count) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / std::max(count, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  std::vector<double> ticks;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) {
    ticks.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  }
  return ticks;
}

std::string plot_svg(const std::vector<MetricsRun>& runs, const std::string& title) {
  const std::vector<Panel> all = {{"loss (dashed: validation)", {{"loss", false}, {"val_loss", true}}},
                                  {"learning rate", {{"lr", false}}},
                                  {"gradient norm", {{"grad_norm", false}}},
                                  {"tokens/s", {{"tokens_per_s", false}}}};
  std::vector<Panel> panels;
  for (const auto& p : all) {
    bool any = false;
    for (const auto& r : runs)
      for (const auto& row : r.rows)
        for (const auto& s : p.series) any = any || row.count(s.key);
    if (any) panels.push_back(p);
  }
  const int cols = 2, rows = static_cast<int>((panels.size() + 1) / 2);
  const double PW = 420, PH = 260, L = 64, R = 16, T = 28, B = 36, top = 40, legend = 22.0 * runs.size() + 10;
  const double W = cols * PW, H = top + rows * PH + legend;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{:.0f}\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n",
      W, H, W / 2, escape(title));
  double xmax = 0, xmin = std::numeric_limits<double>::max();
  for (const auto& r : runs)
    for (const auto& row : r.rows) xmax = std::max(xmax, row.at("step")), xmin = std::min(xmin, row.at("step"));
  for (size_t p = 0; p < panels.size(); ++p) {
    const double ox = static_cast<double>(p % cols) * PW, oy = top + static_cast<double>(p / cols) * PH;
    double lo = std::numeric_limits<double>::max(), hi = std::numeric_limits<double>::lowest();
    for (const auto& r : runs)
      for (const auto& row : r.rows)
        for (const auto& se : panels[p].series) {
          auto it = row.find(se.key);
          if (it != row.end() && std::isfinite(it->second)) lo = std::min(lo, it->second), hi = std::max(hi, it->second);
        }
    const double pad = hi > lo ? 0.05 * (hi - lo) : std::max(std::abs(hi) * 0.1, 1e-12);
    lo -= pad, hi += pad;
    const std::vector<double> yt = nice_ticks(lo, hi), xt = nice_ticks(xmin, xmax, 6);
    auto px = [&](double x) { return ox + L + (PW - L - R) * (x - xmin) / std::max(xmax - xmin, 1.0); };
    auto py = [&](double y) { return oy + PH - B - (PH - T - B) * (y - lo) / (hi - lo); };
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\">{}</text>\n", ox + L, oy + T - 8,
                     escape(panels[p].title));
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#888\"/>\n",
                     ox + L, oy + T, PW - L - R, PH - T - B);
    for (double v : yt) {
      if (v < lo || v > hi) continue;
      s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{1:.1f}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#eee\"/>"
                       "<text x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
                       ox + L, ox + PW - R, py(v), ox + L - 4, py(v) + 4, tick_label(v));
    }
    for (double v : xt) {
      if (v < xmin || v > xmax) continue;
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", px(v), oy + PH - B + 14,
                       tick_label(v));
    }
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">step</text>\n", ox + L + (PW - L - R) / 2,
                     oy + PH - B + 28);
    for (size_t r = 0; r < runs.size(); ++r) {
      for (const auto& se : panels[p].series) {
        std::string pts;
        for (const auto& row : runs[r].rows) {
          auto it = row.find(se.key);
          if (it == row.end() || !std::isfinite(it->second)) continue;
          pts += fmt::format("{:.1f},{:.1f} ", px(row.at("step")), py(it->second));
        }
        if (pts.empty()) continue;
        s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{} points=\"{}\"/>\n",
                         kColors[r % 8], se.dashed ? " stroke-dasharray=\"5,3\"" : "", pts);
      }
    }
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    const double y = top + rows * PH + 16 + 22.0 * r;
    s += fmt::format("<line x1=\"{0:.0f}\" x2=\"{1:.0f}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"{3}\" stroke-width=\"3\"/>"
                     "<text x=\"{4:.0f}\" y=\"{5:.1f}\">{6}</text>\n",
                     L, L + 24, y, kColors[r % 8], L + 32, y + 4, escape(runs[r].label));
  }
  return s + "</svg>\n";
}

}  // namespace meshtrain
