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

// MESHTRAIN_SHM (shared memory between ranks on one host) and MESHTRAIN_SHM_CMA (one-copy
// all_to_all by cross-memory attach): unset or "1" = on, "0" = off; anything else is one
// std::invalid_argument naming the variable, its value and both choices.
bool transport_switch(const char* name);

// Both switches checked: the launching process calls it before any rank starts.
void check_transport_variables();

}  // namespace meshtrain
