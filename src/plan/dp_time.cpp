#include "meshtrain/plan/dp_time.h"

#include "meshtrain/plan/op_time.h"

namespace meshtrain::plan {

DpTime dp_time(const Strategy& s, double dense, double experts, double gb, double pb, double microbatch_compute,
               double units, const LinkSpec& link, const TimeOptions& o) {
  const double m = static_cast<double>(s.microbatches());
  // Seconds of collectives by when they run: in every micro-batch's forward or backward, in the last
  // backward only, after the optimizer.
  double forward_each = 0, backward_each = 0, backward_last = 0, after = 0;
  DpTime t;
  auto collective = [&](double& phase, double count, double bytes, double steps) {
    const double seconds = bytes / ring_rate(link) + steps * link.latency;
    phase += seconds;
    t.bytes += count * bytes;
    t.seconds += count * seconds;
  };
  auto group = [&](double P, int n) {
    if (n <= 1 || P <= 0) return;
    const double ring = (n - 1.0) / n;
    const double replicas = s.dp_shard > 0 ? static_cast<double>(s.dp) / s.dp_shard : 1;
    switch (s.zero) {
      case 0: collective(backward_last, 1, 2 * ring * P * gb, 2 * (n - 1)); break;
      case 1:
        collective(backward_last, 1, ring * P * gb, n - 1);
        collective(after, 1, ring * P * pb, n - 1);
        break;
      case 2:
        collective(backward_each, m, ring * P * gb, n - 1);
        collective(after, 1, ring * P * pb, n - 1);
        break;
      default:
        collective(forward_each, m, ring * P * pb, units * (n - 1));
        collective(backward_each, m, ring * P * pb + ring * P * gb, units * 2 * (n - 1));
        if (replicas > 1) {
          const double r = replicas;
          collective(backward_each, m, 2 * (r - 1) / r * P / n * gb, units * 2 * (r - 1));
        }
    }
  };
  group(dense, s.shard_group() * s.cp * s.ep);
  group(experts, s.shard_group() * s.cp);
  const double bwd = kBackwardShare * microbatch_compute, fwd = microbatch_compute - bwd;
  auto under = [&](double seconds, double window, bool hides) {
    return hides ? overlap_cost(seconds, window, link) : seconds;
  };
  t.exposed = m * under(forward_each, fwd, o.dp_overlap) + (m - 1) * under(backward_each, bwd, o.dp_overlap) +
              under(backward_each + backward_last, bwd, o.dp_overlap) + under(after, fwd, o.param_gather_overlap);
  return t;
}

}  // namespace meshtrain::plan
