#!/usr/bin/env python3
"""make check-docs: the numbers in docs/ and README.md are the scripts' own.

1. Every docs/*.md ends with the footer bench/header.sh's `seal` writes, naming
   an existing bench/ script, and the sha256 of the lines above it matches:
   a page edited by hand fails (rerun its script instead).
2. Every quote in the hand-written pages (README.md, the guides in
   docs/guide/ and the design pages in docs/design/), VALUE<!--q PAGE:KEY-->, names a key that PAGE
   (docs/PAGE.md) lists under "Numbers quoted in README.md", with that value.
3. Their prose (outside code) has no measurement-looking number that is
   not such a quote: ratios (1.8x), decimals (4.7), percentages, and numbers
   with a unit of time or rate (2 minutes, 35 ms, 1.0 GB/s, 300 tokens/s).
   Constants of the code (a tolerance, a default) are written as inline code,
   which this check skips, like code blocks.

  check_docs.py [--write] [--root DIR]
    --write: set every quoted value in the hand-written pages from docs/ instead of comparing
    --root:  the tree to check (default: this script's repository)
"""
import hashlib
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if "--root" in sys.argv:
    ROOT = os.path.abspath(sys.argv[sys.argv.index("--root") + 1])
FOOTER = re.compile(r"^<!-- written by (bench/[\w.-]+); sha256 of the lines above: ([0-9a-f]{64}) -->$")
QUOTE_LINE = re.compile(r"^- `([\w.-]+)` = (\S+): ")
MARKER = re.compile(r"(\S*?)<!--q ([\w.-]+):([\w.-]+)-->")
MEASURE = re.compile(
    r"(?<![\w./-])(\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x(?![\w])"             # ratios: 1.8x, 1.4-1.8x
    r"|\d+\.\d+(?![\w.])"                                              # decimals
    r"|\d+(?:\.\d+)?\s?%"                                              # percentages
    r"|\d+(?:\.\d+)?\s?(?:s|ms|us|minutes?|hours?|GB/s|GiB/s|MB/s|GFLOP/s|TFLOP/s|tokens/s)(?![\w/]))")
# Not measurements: versions of the software named just before.
VERSION = re.compile(r"(libtorch|PyTorch|Python|Debian|CUDA|Gloo|C\+\+|>=|version)\s*$", re.I)


def pages():
    out = {}
    d = os.path.join(ROOT, "docs")
    for name in sorted(os.listdir(d)):
        if name.endswith(".md"):
            with open(os.path.join(d, name), encoding="utf-8") as f:
                out[name[:-3]] = f.read()
    return out


def check_pages(docs, errors):
    quotes = {}
    for page, text in docs.items():
        body, _, last = text.rstrip("\n").rpartition("\n")
        m = FOOTER.match(last)
        where = "docs/%s.md" % page
        if not m:
            errors.append("%s: no footer from a bench/ script: it was not written by one (write a script under "
                          "bench/ that produces the whole page and ends with `seal`)" % where)
            continue
        script, digest = m.groups()
        if not os.path.exists(os.path.join(ROOT, script)):
            errors.append("%s: written by %s, which does not exist" % (where, script))
        if hashlib.sha256((body + "\n").encode()).hexdigest() != digest:
            errors.append("%s: changed since %s wrote it (edited by hand?): rerun %s" % (where, script, script))
        for line in body.split("\n"):
            q = QUOTE_LINE.match(line)
            if q:
                quotes[(page, q.group(1))] = q.group(2)
    return quotes


def prose_lines(text):
    """(line number, line) of a hand-written page outside fenced code, with inline code blanked."""
    fenced = False
    for n, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield n, re.sub(r"`[^`]*`", "``", line)


def hand_written():
    """README.md, the guides and the design pages: the pages people write, which quote the scripts' numbers."""
    out = ["README.md"]
    for sub in ("guide", "design"):
        d = os.path.join(ROOT, "docs", sub)
        if os.path.isdir(d):
            out += ["docs/%s/%s" % (sub, n) for n in sorted(os.listdir(d)) if n.endswith(".md")]
    return out


def check_readme(text, quotes, errors, write, name="README.md"):
    def replace(m):
        value, page, key = m.groups()
        if (page, key) not in quotes:
            errors.append("%s quotes %s:%s, which docs/%s.md does not list" % (name, page, key, page))
            return m.group(0)
        if value != quotes[(page, key)]:
            if not write:
                errors.append("%s says %s for %s:%s, docs/%s.md says %s" %
                              (name, value or "(nothing)", page, key, page, quotes[(page, key)]))
                return m.group(0)
        return "%s<!--q %s:%s-->" % (quotes[(page, key)], page, key)

    lines, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:  # quotes live in prose: not in code blocks, not in `inline code`
            parts = line.split("`")
            parts[0::2] = [MARKER.sub(replace, p) for p in parts[0::2]]
            line = "`".join(parts)
        lines.append(line)
    new = "\n".join(lines)
    for n, line in prose_lines(new):
        bare = MARKER.sub("", line)
        for m in MEASURE.finditer(bare):
            if VERSION.search(bare[:m.start()]):
                continue
            errors.append("%s:%d: '%s' reads as a measurement but quotes no docs/ page: cite it as "
                          "VALUE<!--q PAGE:KEY--> from a page a bench/ script writes" % (name, n, m.group(1)))
    return new


def main():
    write = "--write" in sys.argv[1:]
    errors = []
    quotes = check_pages(pages(), errors)
    quoted = 0
    for name in hand_written():
        path = os.path.join(ROOT, name)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = check_readme(text, quotes, errors, write, name)
        if write and new != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            print("%s: quoted values set from docs/" % name)
        quoted += sum(len(MARKER.findall(line)) for _, line in prose_lines(new))
    for e in errors:
        print("check-docs: " + e)
    if errors:
        print("check-docs: %d problem(s)" % len(errors))
        return 1
    print("check-docs: %d pages sealed by their scripts, %d quoted numbers in %d hand-written pages (README.md, "
          "docs/guide/, docs/design/), all match" % (len(pages()), quoted, len(hand_written())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
