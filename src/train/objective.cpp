#include "meshtrain/train/objective.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "meshtrain/model/transformer.h"

namespace meshtrain {

double NextTokenObjective::units(const Batch& b) const { return (b.targets >= 0).sum().item<double>(); }

at::Tensor NextTokenObjective::loss(Transformer& m, const Batch& b, bool train, std::vector<double>&) {
  return m.forward(b.tokens, b.targets, train, b.doc_ids).sum();
}

}  // namespace meshtrain
