// Helpers for tests that run `meshtrain train` as a user does: a scratch
// directory, a tiny synthetic corpus and config, and the metrics file's losses.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "meshtrain/data/shard.h"
#include "meshtrain/train/config.h"
#include "tests/run_command.h"

namespace meshtrain::test {

namespace fs = std::filesystem;

struct Dir {
  fs::path path = fs::temp_directory_path() / ("meshtrain_train_" + std::to_string(getpid()));
  Dir() { fs::create_directories(path); }
  ~Dir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};


inline std::string error_of(const std::string& path, std::vector<std::string> sets = {}) {
  try {
    load_train_config(path, sets);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Writes a synthetic token corpus and returns a config (2 ranks) over it.
inline std::string tiny_config(const Dir& d, const std::string& name, const std::string& extra) {
  if (!fs::exists(d.path / "train.bin")) {
    std::vector<uint32_t> tokens(6000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7 + i / 13) % 50);
    write_shard((d.path / "train.bin").string(), tokens, {0}, 2);
  }
  return d.write(name, "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 64\ndropout = 0.1\n"
                       "[data]\ntrain = \"" + (d.path / "train.bin").string() +
                           "\"\n[train]\nsteps = 6\nmicro_batch = 2\nglobal_batch = 8\nseq = 32\nlr = 1e-2\n"
                           "log_every = 1\n[parallel]\nnproc = 2\n" + extra);
}

// step -> the metrics line's "loss" and "grad_norm" as printed (JSON numbers
// round-trip a double exactly). Every line's MFU is checked on the way: above
// 100 % is a bug in the FLOPs count or the measured peak (issue #44), so the
// tests give train.peak_tflops only above any rate (1000 TFLOP/s) or not at all.
inline std::map<int, std::string> losses(const std::string& metrics) {
  std::map<int, std::string> out;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    const auto num = [&](const std::string& key) {
      const size_t at = line.find("\"" + key + "\":") + key.size() + 3;
      return line.substr(at, line.find_first_of(",}", at) - at);
    };
    out[std::stoi(num("step"))] = num("loss") + " " + num("grad_norm");
    if (line.find("\"mfu\":") != std::string::npos) {
      const double mfu = std::stod(num("mfu"));
      EXPECT_TRUE(mfu > 0 && mfu <= 1.0) << "MFU " << mfu << " in " << metrics << ": " << line;
    }
  }
  return out;
}

// step -> one key of the metrics lines that have it (JSON numbers round-trip a double exactly).
inline std::map<int, double> metric(const std::string& file, const std::string& key) {
  std::map<int, double> out;
  std::ifstream f(file);
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains(key)) out[j.at("step").get<int>()] = j.at(key).get<double>();
  }
  return out;
}

// Steps after `from` of two metrics files agree within `loss_tol` and
// `norm_tol` (relative), the loss and the gradient norm each.
inline void expect_close_losses(const std::string& a_file, const std::string& b_file, int from, size_t count,
                                double loss_tol, double norm_tol) {
  const auto a = losses(a_file), b = losses(b_file);
  ASSERT_EQ(b.size(), count) << b_file;
  const auto split = [](const std::string& v) {  // "loss grad_norm"
    const size_t space = v.find(' ');
    return std::pair<double, double>{std::stod(v.substr(0, space)), std::stod(v.substr(space + 1))};
  };
  for (const auto& [step, v] : b) {
    ASSERT_TRUE(a.count(step)) << "step " << step;
    if (step <= from) continue;
    const auto [x, gx] = split(a.at(step));
    const auto [y, gy] = split(v);
    EXPECT_NEAR(x, y, loss_tol * x) << "loss, step " << step << " (" << b_file << ")";
    EXPECT_NEAR(gx, gy, norm_tol * gx) << "gradient norm, step " << step << " (" << b_file << ")";
  }
}

// ... within fp32 rounding (relative 1e-5: other meshes reduce in other orders).
inline void expect_same_losses(const std::string& a_file, const std::string& b_file, int from, size_t count) {
  expect_close_losses(a_file, b_file, from, count, 1e-5, 1e-5);
}

// A SentencePiece tokenizer (400 pieces) trained on a small Genesis-like
// corpus in `d`, via `meshtrain tokenize`; returns its model path.
inline std::string tiny_tokenizer(const Dir& d, const std::string& bin) {
  {
    std::ofstream f(d.path / "corpus.txt");
    for (int i = 0; i < 300; ++i) f << "In the beginning God created the heaven and the earth " << i % 17 << "\n";
  }
  const auto run = run_command(bin + " tokenize --input " + (d.path / "corpus.txt").string() + " --out " +
                               (d.path / "tok").string() + " --vocab-size 400");
  EXPECT_EQ(run.code, 0) << run.output;
  return (d.path / "tok/tokenizer.model").string();
}

}  // namespace meshtrain::test
