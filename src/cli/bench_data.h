// The model and data of the data-parallel training benchmarks (bench dp,
// bench zero): a preset without dropout, and random token micro-batches that
// differ per rank.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>

#include <algorithm>
#include <vector>

#include "cli/commands.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/plan/spec.h"

namespace meshtrain::cli {

inline plan::ModelSpec bench_model(const TrainBenchOptions& o) {
  plan::ModelSpec spec = plan::preset(o.model);
  spec.dropout = 0;
  spec.seq = std::max(spec.seq, o.seq);
  return spec;
}

class RandomBatches {
 public:
  RandomBatches(const plan::ModelSpec& spec, const TrainBenchOptions& o, int rank)
      : vocab_(spec.vocab), micro_(o.micro_batch), seq_(o.seq), gen_(at::make_generator<at::CPUGeneratorImpl>(10 + rank)) {}
  // One micro-batch: the step of one rank.
  std::vector<Batch> next() {
    at::Tensor d = at::randint(vocab_, {micro_, seq_ + 1}, gen_, at::kLong);
    return {{d.narrow(1, 0, seq_).contiguous(), d.narrow(1, 1, seq_).contiguous(), {}, {}}};
  }

 private:
  int64_t vocab_, micro_, seq_;
  at::Generator gen_;
};

}  // namespace meshtrain::cli
