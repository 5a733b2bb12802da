// Why the strategy search chose its plan, in the course's order (does it fit?
// redundant state -> ZeRO; a layer too big -> TP; too many layers -> PP; a long
// sequence -> CP; activations -> recomputation; then DP for speed), each choice
// with its deciding numbers: the plan's own bytes and seconds for that axis and
// the best plan without it (its step time, or the memory that keeps it from
// fitting). Runner-ups say why they lost; the rules the search applied are
// listed with how many candidates each rejected.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/plan/search.h"

namespace meshtrain::plan {

// Fills r.explanation from r.ranked (feasible, fastest first) and `all` (every valid candidate, fitting or not).
void explain(const SearchInput& in, const std::vector<Candidate>& all, SearchResult& r);

// Why `runner` is slower than `best`: "+2.4% (bubble +0.38 s)", the component that grew most.
std::string why_slower(const Candidate& runner, const Candidate& best);

// "tp=8 [inside a node] -> dp=8 [across nodes] -> pp=4 [across nodes]".
std::string mesh_order(const Strategy& s, int per_node);

}  // namespace meshtrain::plan
