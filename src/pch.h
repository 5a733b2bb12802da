// Precompiled header: the heavy headers nearly every library file includes.
// Kept small on purpose (PLATFORM.md: a torch/torch.h PCH made clean builds slower).
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>
#include <string>
#include <vector>
