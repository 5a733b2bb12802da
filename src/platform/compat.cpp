#include "meshtrain/compat.h"

#include <ATen/autocast_mode.h>

namespace meshtrain {

AutocastSwitch autocast_switch(c10::DeviceType device) {
  return {at::autocast::is_autocast_enabled(device), at::autocast::get_autocast_dtype(device)};
}

void set_autocast_switch(c10::DeviceType device, AutocastSwitch s) {
  at::autocast::set_autocast_enabled(device, s.enabled);
  at::autocast::set_autocast_dtype(device, s.dtype);
}

AutocastOff::AutocastOff()
    : cpu_(autocast_switch(c10::DeviceType::CPU)), cuda_(autocast_switch(c10::DeviceType::CUDA)) {
  at::autocast::set_autocast_enabled(c10::DeviceType::CPU, false);
  at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, false);
}

AutocastOff::~AutocastOff() {
  set_autocast_switch(c10::DeviceType::CPU, cpu_);
  set_autocast_switch(c10::DeviceType::CUDA, cuda_);
}

}  // namespace meshtrain
