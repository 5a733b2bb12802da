// test_toy_method: a training method that lives only in this test file,
// registered through train/method.h's one call and trained by the library's
// own trainer: `meshtrain launch ... test_toy_method CONFIG [KEY=VALUE...]`.
// ToyMethod.RegisteredInATestFileTrainsOnDp2AsOnOneProcess runs it.
//
// The method, "second_half": next-token loss on the second half of every
// window only (its units are those targets), logging the share of the
// window it trained on. It reads a config section of its own, declared here:
// [second_half] from (where in the window its loss starts, 0.5 by default).
// Nothing outside this file knows its name, its section or its key.
#include <ATen/Functions.h>
#include <ATen/TensorIndexing.h>
#include <ATen/TensorOperators.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/model/transformer.h"
#include "meshtrain/platform/cuda_loader.h"
#include "meshtrain/runtime/runtime.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/config_keys.h"
#include "meshtrain/train/method.h"
#include "meshtrain/train/objective.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {
namespace {

// The method's own section.
struct SecondHalfSettings {
  static constexpr const char* kSection = "second_half";
  double from = 0.5;
};

class SecondHalfObjective : public Objective {
 public:
  explicit SecondHalfObjective(double from) : from_(from) {}
  double units(const Batch& b) const override { return (second_half(b.targets) >= 0).sum().item<double>(); }
  at::Tensor loss(Transformer& m, const Batch& b, bool train, std::vector<double>& metric_sums) override {
    const at::Tensor t = second_half(b.targets);
    // Each unit stands for the share of its window that trains.
    metric_sums[0] += (t >= 0).sum().item<double>() * static_cast<double>(t.size(1) - cut(t)) / t.size(1);
    return m.forward(b.tokens, t, train, b.doc_ids).sum();
  }
  std::vector<std::string> metrics() const override { return {"window_share"}; }

 private:
  int64_t cut(const at::Tensor& targets) const { return static_cast<int64_t>(from_ * targets.size(1)); }
  // The targets with each row's positions before `from` ignored (-1).
  at::Tensor second_half(const at::Tensor& targets) const {
    at::Tensor t = targets.clone();
    t.index_put_({at::indexing::Slice(), at::indexing::Slice(0, cut(targets))}, -1);
    return t;
  }
  double from_;
};

Method second_half() {
  Method m;
  m.name = "second_half";
  m.summary = "next-token loss on the second half of each window (a test's toy method)";
  m.sections = {"second_half"};
  m.objective = [](const TrainConfig& c, EngineRole, Transformer*) -> std::unique_ptr<Objective> {
    return std::make_unique<SecondHalfObjective>(settings<SecondHalfSettings>(c).from);
  };
  return m;
}

std::vector<ConfigKey> second_half_keys() {
  return {config_key::number("second_half.from", [](auto& c) -> auto& { return settings<SecondHalfSettings>(c).from; },
                             0, false, 1, true, "where in each window the loss starts (a fraction of it)")};
}

}  // namespace
}  // namespace meshtrain

int main(int argc, char** argv) {
  using namespace meshtrain;
  load_cuda_where_a_driver_is();
  register_config_keys(second_half_keys());
  register_method(second_half());
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_toy_method CONFIG [KEY=VALUE...]\n");
    return 2;
  }
  try {
    const TrainConfig c = load_train_config(argv[1], std::vector<std::string>(argv + 2, argv + argc));
    auto rt = Runtime::init(DistEnv::from_environment(), RuntimeOptions{});
    return train(c, *rt, false);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_toy_method: %s\n", e.what());
    return 1;
  }
}
