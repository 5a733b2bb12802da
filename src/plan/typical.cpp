#include "meshtrain/plan/typical.h"

#include <fmt/format.h>

#include "meshtrain/plan/explain.h"

namespace meshtrain::plan {

std::vector<TypicalRun> typical_runs() {
  auto run = [](std::string title, const char* model, int gpus, int64_t seq, int64_t batch) {
    TypicalRun r;
    r.title = std::move(title);
    r.input.model = preset(model);
    r.input.gpu = gpu_preset("h100");
    r.input.gpus = gpus;
    r.input.seq = seq;
    r.input.global_batch = batch;
    return r;
  };
  return {run("7B on one node", "llama2-7b", 8, 4096, 1024), run("70B on 8 nodes", "llama2-70b", 64, 4096, 1024),
          run("405B on 1024 GPUs", "llama3-405b", 1024, 8192, 1024)};
}

std::string typical_report() {
  std::string out;
  for (const TypicalRun& t : typical_runs()) {
    const SearchInput& in = t.input;
    const SearchResult r = search(in);
    out += fmt::format("## {}: {} on {} x {}, seq {}, global batch {} ({:.1f}M tokens)\n\n", t.title, in.model.name,
                       in.gpus, in.gpu.name, in.seq, in.global_batch, in.global_batch * in.seq / 1e6);
    if (r.ranked.empty()) {
      for (const auto& l : r.explanation) out += l + "\n";
      out += "\n";
      continue;
    }
    const Candidate& best = r.ranked.front();
    const StepEstimate& e = best.estimate;
    out += fmt::format("Plan: {} ({} of {} valid plans fit)\n", best.strategy.describe(), r.feasible, r.considered);
    out += fmt::format("Mesh: {}\n\nWhy:\n\n", mesh_order(best.strategy, in.gpu.per_node));
    for (const auto& l : r.explanation) out += "    " + l + "\n";
    out += "\n";
    out += "Ledger (per rank):\n\n```\n" + format_ledger(best.memory.peak()) + "```\n\n";
    out += "| axis | bytes per rank per step | link | on the wire | exposed |\n|---|---:|---|---:|---:|\n";
    for (const auto& [axis, tr] : e.traffic) {
      if (tr.bytes == 0) continue;
      out += fmt::format("| {} | {} | {} | {:.3f} s | {:.3f} s |\n", axis, human_bytes(tr.bytes),
                         tr.inter_node ? "across nodes" : "inside a node", tr.seconds, tr.exposed);
    }
    out += fmt::format("\nStep: compute {:.3f} s + bubble {:.3f} s + exposed communication {:.3f} s + optimizer "
                       "{:.3f} s = {:.3f} s; {:.0f} tokens/s, MFU {:.1f}%\n\n",
                       e.compute_s, e.bubble_s, e.exposed_comm_s, e.optimizer_s, e.step_s, e.tokens_per_s, 100 * e.mfu);
  }
  return out;
}

}  // namespace meshtrain::plan
