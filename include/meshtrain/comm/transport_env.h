// The environment variables that change how collectives move bytes (NCCL_*,
// GLOO_*, MESHTRAIN_SHM*, MESHTRAIN_FLIGHT_RECORDER), printed with every run and
// benchmark so a result can be read with the settings that produced it (as
// nccl-tests users paste their NCCL_* variables).
#pragma once

#include <string>

namespace meshtrain {

// "transport variables: GLOO_SOCKET_IFNAME=lo NCCL_DEBUG=INFO" (sorted), or
// "transport variables: none set".
std::string transport_variables();

}  // namespace meshtrain
