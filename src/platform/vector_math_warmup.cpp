#include "meshtrain/platform/vector_math_warmup.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>

#include <mutex>

namespace meshtrain {
namespace {

// The functions ATen/cpu/vml.h sends to MKL (IMPLEMENT_VML_MKL), at 0.5: inside every domain.
void call_each_vml_function() {
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor x = at::full({16}, 0.5, at::TensorOptions().dtype(dtype));
    for (at::Tensor (*f)(const at::Tensor&) :
         {at::acos, at::asin, at::atan, at::cos, at::erf, at::erfc, at::erfinv, at::exp, at::log, at::log10, at::log2,
          at::sin, at::sqrt, at::tan, at::tanh, at::trunc}) {
      (void)f(x);
    }
  }
}

}  // namespace

void warm_up_vector_math() {
  static std::once_flag once;
  std::call_once(once, [] {
    call_each_vml_function();  // MKL's process-wide set-up, by one thread
    // Then each pool thread's first call (a 16-element op runs on the thread that calls it).
    at::parallel_for(0, at::get_num_threads(), 1, [](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) call_each_vml_function();
    });
  });
}

}  // namespace meshtrain
