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

}  // namespace meshtrain
