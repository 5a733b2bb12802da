#!/usr/bin/env python3
"""Fails when an #include runs up the layers: data flows down, nothing points up.

The layers, top to bottom (README.md's layout section says what each holds). A file's
unit is its folder under src/ or include/meshtrain/ (parallel/ by its subfolder); a unit
may include its own files and any unit on a lower line, never one on its own line or above.

    python3 scripts/check_layers.py [ROOT]     # exit 1 and one line per include that runs up
"""
import os
import re
import sys

LAYERS = [
    ["cli", "labs"],                      # the binary: parses arguments, calls the library
    ["methods"],                          # registers the methods below with the core (builtin.h)
    ["rl", "dpo"],                        # methods: their section, checks, objective (rl: their own loop)
    ["train"],                            # the trainer core: loop, engine, checkpoints, metrics
    ["ckpt"],                             # sharded checkpoints, import/export
    ["parallel/pipeline"],                # stages and schedules over a model
    ["parallel/data"],                    # DDP, ZeRO 1/2/3, HSDP
    ["peft"],                             # LoRA, QLoRA, adapters: attached to a built model
    ["model"],                            # the decoder
    ["moe"],                              # router, experts, dispatch
    ["parallel/tensor", "parallel/context"],  # the layers a model is built from, split over ranks
    ["optim"],                            # AdamW, schedules, scaling
    ["nn"],                               # layers on one rank, parameters, recomputation
    ["data"],                             # shards, loader, validation sets
    ["runtime"],                          # rendezvous, launcher, the device mesh
    ["comm"],                             # Comm: collectives over c10d, shared memory
    ["cuda"],                             # the CUDA plugin (loaded where a driver is)
    ["platform"],                         # device, CUDA loader, threads, processes, faults
    ["plan"],                             # the planner: plain C++
    ["(root)"],                           # compat.h
]
RANK = {unit: i for i, line in enumerate(LAYERS) for unit in line}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')


def unit_of(parts):
    """The unit of a path below src/ or include/meshtrain/, as a list of its parts."""
    if len(parts) == 1:
        return "(root)"
    if parts[0] == "parallel" and len(parts) > 2:
        return "parallel/" + parts[1]
    return parts[0]


def included_unit(inc, src_units):
    parts = inc.split("/")
    if parts[0] == "meshtrain":
        return unit_of(parts[1:])
    if len(parts) > 1 and parts[0] in src_units:  # a private header: "comm/backend.h"
        return unit_of(parts)
    return None


def violations(root):
    src_units = set(os.listdir(os.path.join(root, "src")))
    found = []
    for base in ("src", "include/meshtrain", "labs"):
        top = os.path.join(root, base)
        for d, _, files in os.walk(top):
            for f in sorted(files):
                if not f.endswith((".h", ".cpp", ".cu")):
                    continue
                path = os.path.join(d, f)
                rel = os.path.relpath(path, top).split(os.sep)
                unit = "labs" if base == "labs" else unit_of(rel)
                if unit not in RANK:
                    found.append(f"{os.path.relpath(path, root)}: its folder '{unit}' has no layer: add it to LAYERS in {__file__}")
                    continue
                with open(path, errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        to = included_unit(m.group(1), src_units)
                        if to is None or to == unit:
                            continue
                        if to not in RANK:
                            found.append(f"{os.path.relpath(path, root)}:{n}: includes {m.group(1)} of unknown unit '{to}'")
                        elif RANK[to] <= RANK[unit]:
                            where = "on the same layer as" if RANK[to] == RANK[unit] else "above"
                            found.append(f"{os.path.relpath(path, root)}:{n}: {unit} includes {m.group(1)}, "
                                         f"{where} it ({to}): move the shared part down or pass it in")
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    found = violations(root)
    for v in found:
        print(v)
    if found:
        print(f"check_layers: {len(found)} include(s) run up the layers (scripts/check_layers.py lists the order)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
