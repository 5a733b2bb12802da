// Saving a sharded checkpoint (see checkpoint.h for the layout and invariants).
#include "meshtrain/ckpt/checkpoint.h"

#include <ATen/Functions.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>

#include "ckpt/files.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/comm/comm.h"

namespace fs = std::filesystem;

namespace meshtrain::ckpt {
namespace {

std::string rank_file(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }
std::string part_file(int rank) { return fmt::format("rank_{:05d}.part.json", rank); }

int64_t volume(const std::vector<int64_t>& shape) {
  int64_t v = 1;
  for (int64_t d : shape) v *= d;
  return v;
}

// The shards of one tensor must tile its global shape: inside it, no overlaps,
// volumes adding up. Catches a layout bug at save time rather than at load.
void check_tiling(const std::string& name, const nlohmann::json& t) {
  const auto global = t["shape"].get<std::vector<int64_t>>();
  const auto& shards = t["shards"];
  int64_t covered = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto off = shards[i]["offsets"].get<std::vector<int64_t>>();
    const auto shp = shards[i]["shape"].get<std::vector<int64_t>>();
    if (off.size() != global.size() || shp.size() != global.size()) {
      throw std::logic_error(fmt::format("checkpoint tensor '{}': shard rank does not match the global shape", name));
    }
    for (size_t d = 0; d < global.size(); ++d) {
      if (off[d] < 0 || off[d] + shp[d] > global[d]) {
        throw std::logic_error(fmt::format("checkpoint tensor '{}': a shard lies outside the global shape", name));
      }
    }
    for (size_t j = 0; j < i; ++j) {
      const auto o2 = shards[j]["offsets"].get<std::vector<int64_t>>();
      const auto s2 = shards[j]["shape"].get<std::vector<int64_t>>();
      bool overlap = true;
      for (size_t d = 0; d < global.size(); ++d) overlap &= off[d] < o2[d] + s2[d] && o2[d] < off[d] + shp[d];
      if (overlap && volume(shp) > 0) {
        throw std::logic_error(fmt::format("checkpoint tensor '{}': two ranks wrote overlapping shards", name));
      }
    }
    covered += volume(shp);
  }
  if (covered != volume(global)) {
    throw std::logic_error(fmt::format("checkpoint tensor '{}': shards cover {} of {} elements", name, covered,
                                       volume(global)));
  }
}

}  // namespace

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

Checkpointer::Checkpointer(SaveOptions o, Comm& world) : o_(std::move(o)), world_(world) {
  if (o_.dir.empty()) throw std::invalid_argument("checkpoint directory is empty; set checkpoint.dir");
  if (o_.keep < 1) throw std::invalid_argument(fmt::format("checkpoint.keep = {} must be at least 1", o_.keep));
}

Checkpointer::~Checkpointer() {
  try {
    wait();
  } catch (const std::exception& e) {
    fmt::print(stderr, "checkpoint save failed: {}\n", e.what());
  }
}

void Checkpointer::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void Checkpointer::save(int64_t step, std::vector<Piece> pieces, nlohmann::json global, nlohmann::json rank_state) {
  wait();
  // A nonce names this attempt's temporary directory, so files of an earlier
  // crashed attempt at the same step are never mistaken for ours.
  at::Tensor nonce = at::zeros({1}, at::kLong);
  if (world_.rank() == 0) nonce[0] = static_cast<int64_t>(std::random_device{}() >> 1) << 20 | (step & 0xfffff);
  world_.broadcast(nonce, 0);
  const std::string tmp =
      (fs::path(o_.dir) / fmt::format(".tmp-{}-{:x}", step_dir_name(step), nonce.item<int64_t>())).string();
  if (o_.async) {
    // The snapshot: training may change the live tensors as soon as we return.
    for (auto& p : pieces) p.local = p.owner ? p.local.detach().clone(at::MemoryFormat::Contiguous) : at::Tensor();
    thread_ = std::thread([this, step, tmp, pieces = std::move(pieces), global = std::move(global),
                           rank_state = std::move(rank_state)]() mutable {
      try {
        write(step, tmp, std::move(pieces), std::move(global), std::move(rank_state));
      } catch (...) {
        error_ = std::current_exception();
      }
    });
    return;
  }
  // Synchronous: every rank learns whether every other rank's files are on
  // disk before rank 0 renames, and all ranks fail together.
  std::string error;
  try {
    write(step, tmp, std::move(pieces), global, std::move(rank_state));
  } catch (const std::exception& e) {
    error = e.what();
  }
  at::Tensor failed = at::full({1}, error.empty() ? 0.0 : 1.0, at::kFloat);
  world_.all_reduce(failed, ReduceOp::Max);
  if (failed.item<float>() == 0.0f && world_.rank() == 0) {
    try {
      finalize(step, tmp, std::move(global));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  at::Tensor failed_any = at::full({1}, error.empty() ? 0.0 : 1.0, at::kFloat);
  world_.all_reduce(failed_any, ReduceOp::Max);
  if (!error.empty()) throw std::runtime_error(fmt::format("checkpoint step {} not saved: {}", step, error));
  if (failed_any.item<float>() != 0.0f) {
    throw std::runtime_error(fmt::format("checkpoint step {} not saved: another rank failed (see its error)", step));
  }
}

void Checkpointer::write(int64_t step, const std::string& tmp, std::vector<Piece> pieces, nlohmann::json global,
                         nlohmann::json rank_state) {
  const int rank = world_.rank();
  fs::create_directories(tmp);
  std::vector<NamedTensor> owned;
  nlohmann::json part{{"rank", rank}, {"file", rank_file(rank)}, {"pieces", nlohmann::json::array()}, {"state", rank_state}};
  for (auto& p : pieces) {
    if (!p.owner) continue;
    owned.push_back({p.name, p.local});
    part["pieces"].push_back({{"name", p.name}, {"dtype", dtype_name(p.local.scalar_type())},
                              {"global_shape", p.global_shape}, {"offsets", p.offsets},
                              {"shape", p.local.sizes().vec()}});
  }
  const auto sums = write_safetensors((fs::path(tmp) / rank_file(rank)).string(), owned);
  for (size_t i = 0; i < sums.size(); ++i) part["pieces"][i]["xxh64"] = sums[i];
  write_file_atomic((fs::path(tmp) / part_file(rank)).string(), part.dump());
  if (rank == 0 && o_.async) finalize(step, tmp, std::move(global));
}

void Checkpointer::finalize(int64_t step, const std::string& tmp, nlohmann::json global) {
  const int world = world_.size();
  // Every rank's part file appears once its tensors are fsynced.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o_.timeout_s);
  for (int r = 0; r < world; ++r) {
    while (!fs::exists(fs::path(tmp) / part_file(r))) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw std::runtime_error(fmt::format("rank {} did not finish its checkpoint files in {} within {} s", r, tmp,
                                             o_.timeout_s));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  nlohmann::json tensors = nlohmann::json::object(), ranks = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    nlohmann::json part = nlohmann::json::parse(read_file((fs::path(tmp) / part_file(r)).string()));
    for (const auto& p : part["pieces"]) {
      const std::string name = p["name"];
      auto& t = tensors[name];
      if (t.is_null()) t = {{"dtype", p["dtype"]}, {"shape", p["global_shape"]}, {"shards", nlohmann::json::array()}};
      if (t["dtype"] != p["dtype"] || t["shape"] != p["global_shape"]) {
        throw std::logic_error(fmt::format("checkpoint tensor '{}': ranks disagree on its dtype or global shape", name));
      }
      t["shards"].push_back({{"file", part["file"]}, {"offsets", p["offsets"]}, {"shape", p["shape"]},
                             {"xxh64", p["xxh64"]}});
    }
    ranks.push_back(part["state"]);
  }
  for (const auto& [name, t] : tensors.items()) check_tiling(name, t);
  nlohmann::json manifest = std::move(global);
  manifest["format"] = "meshtrain-checkpoint";
  manifest["version"] = 1;
  manifest["step"] = step;
  manifest["world_size"] = world;
  manifest["tensors"] = std::move(tensors);
  manifest["ranks"] = std::move(ranks);
  // The manifest is the last file; then the whole directory appears at once.
  write_file_atomic((fs::path(tmp) / "manifest.json").string(), manifest.dump(1));
  for (int r = 0; r < world; ++r) fs::remove(fs::path(tmp) / part_file(r));
  fsync_dir(tmp);
  const fs::path final_dir = fs::path(o_.dir) / step_dir_name(step);
  fs::path old;
  if (fs::exists(final_dir)) {  // saving a step again (after a resume): replace it only once ours is whole
    old = fs::path(o_.dir) / fmt::format(".old-{}", step_dir_name(step));
    fs::remove_all(old);
    fs::rename(final_dir, old);
  }
  fs::rename(tmp, final_dir);
  fsync_dir(o_.dir);
  if (!old.empty()) fs::remove_all(old);
  // Keep the newest `keep`; remove leftovers of crashed attempts.
  std::vector<std::pair<int64_t, fs::path>> complete;
  for (const auto& e : fs::directory_iterator(o_.dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp-step_", 0) == 0) fs::remove_all(e.path());
    int64_t s = 0;
    if (parse_step_dir(n, s) && fs::exists(e.path() / "manifest.json")) complete.emplace_back(s, e.path());
  }
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; i + o_.keep < complete.size(); ++i) fs::remove_all(complete[i].second);
}

}  // namespace meshtrain::ckpt
