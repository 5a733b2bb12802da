#!/usr/bin/env python3
"""Runs the commands of docs/guide/, so that no guide goes stale (issue 47).

  run_guides.py BUILD_DIR [--show] [GUIDE ...]

The guides are read in the order docs/guide/README.md links them (or the GUIDE names given,
e.g. quickstart), as a reader works through them: every fenced ```sh block, in order, in one
scratch directory shared by all of them, which looks like the repository's root to the
commands: `build` links to BUILD_DIR, `configs` and `scripts` to the repository's. A block fenced
```toml or ```console is shown, not run. Each guide runs as one bash script (set -euo
pipefail) from that directory; the first failing block stops the run with the guide's name,
the block's number and first line, and the output's tail. Blocks that only a real cluster can
run (Slurm, several machines) are fenced ```sh-cluster: shown, not run.

--show prints each guide's output. Exit status: 0 when every block of every guide ran, 1 otherwise.
"""
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDES = os.path.join(ROOT, "docs", "guide")
FENCE = re.compile(r"^```(\S*)\s*$")


def ordered_guides():
    """The guides in the order the index (docs/guide/README.md) links them."""
    index = open(os.path.join(GUIDES, "README.md"), encoding="utf-8").read()
    names = []
    for name in re.findall(r"\]\(([\w-]+)\.md\)", index):
        if name not in names:
            names.append(name)
    on_disk = sorted(f[:-3] for f in os.listdir(GUIDES) if f.endswith(".md") and f != "README.md")
    missing = sorted(set(on_disk) - set(names))
    if missing:
        sys.exit(f"run_guides: docs/guide/README.md does not link {', '.join(missing)}: add them to the index")
    return names


def blocks(path):
    """The ```sh blocks of a guide: (first line number, text)."""
    out, lang, start, lines = [], None, 0, []
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        m = FENCE.match(line.rstrip("\n"))
        if m and lang is None:
            lang, start, lines = m.group(1), n + 1, []
        elif m and lang is not None and not m.group(1):
            if lang == "sh":
                out.append((start, "".join(lines)))
            lang = None
        elif lang is not None:
            lines.append(line)
    if lang is not None:
        sys.exit(f"run_guides: {path}: a code block opened at line {start - 1} is never closed")
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    build = os.path.abspath(sys.argv[1])
    if not os.path.exists(os.path.join(build, "meshtrain")):
        sys.exit(f"run_guides: no meshtrain binary in {build}: build first (cmake --build {sys.argv[1]})")
    show = "--show" in sys.argv[2:]
    names = [a for a in sys.argv[2:] if a != "--show"] or ordered_guides()
    work = tempfile.mkdtemp(prefix="meshtrain_guides_")
    os.symlink(build, os.path.join(work, "build"))
    for shared in ("configs", "scripts"):
        os.symlink(os.path.join(ROOT, shared), os.path.join(work, shared))
    for name in names:
        path = os.path.join(GUIDES, name + ".md")
        if not os.path.exists(path):
            sys.exit(f"run_guides: no guide {path}")
        script = ["set -euo pipefail"]
        for i, (line, text) in enumerate(blocks(path), 1):
            script.append(f"echo '::block {i} line {line}::'")
            script.append(text)
        start = time.time()
        run = subprocess.run(["bash", "-c", "\n".join(script)], cwd=work, capture_output=True, text=True)
        out = run.stdout + run.stderr
        if run.returncode != 0:
            marks = re.findall(r"::block (\d+) line (\d+)::", out)
            where = f"block {marks[-1][0]} (docs/guide/{name}.md line {marks[-1][1]})" if marks else "its first block"
            print(f"run_guides: {name}: {where} failed with status {run.returncode}; output's tail:\n"
                  + out[-4000:], file=sys.stderr)
            print(f"run_guides: the scratch directory is kept: {work}", file=sys.stderr)
            return 1
        if show:
            print(out)
        print(f"run_guides: {name}: {len(blocks(path))} blocks ran ({time.time() - start:.0f} s)")
    subprocess.run(["rm", "-rf", work], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
