#!/usr/bin/env python3
"""Sums a Chrome trace of ATen operations (meshtrain bench train --profile) by
operation name: total milliseconds per step, calls, share of the step. Nested
operations count inside their parents too (aten::linear contains aten::addmm),
so the shares of one level add up, not of all.

  profile_ops.py TRACE.json STEPS [TOP]
"""
import collections
import json
import sys


def main():
    trace, steps = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    with open(trace) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    total = collections.Counter()
    calls = collections.Counter()
    for e in events:
        if e.get("ph") == "X":
            total[e["name"]] += e.get("dur", 0)
            calls[e["name"]] += 1
    print("%-48s %10s %8s" % ("operation", "ms/step", "calls"))
    for name, us in total.most_common(top):
        print("%-48s %10.1f %8d" % (name[:48], us / 1000 / steps, calls[name] // steps))


if __name__ == "__main__":
    main()
