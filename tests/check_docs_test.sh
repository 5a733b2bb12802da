#!/usr/bin/env bash
# bench/check_docs.py must fail on each hand edit a person could make: a quoted
# README number changed, a docs/ page changed after its script wrote it, a new
# README or guide measurement quoted from nothing. Runs on a copy of README.md, docs/, bench/.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fresh() { rm -rf "$tmp/t"; mkdir -p "$tmp/t"; cp -r "$src/README.md" "$src/docs" "$src/bench" "$tmp/t/"; }
check() { python3 "$src/bench/check_docs.py" --root "$tmp/t" > "$tmp/out" 2>&1; }
fail=0
expect_failure() {
  if check; then echo "FAIL: check-docs passed after: $1"; fail=1; else echo "ok: check-docs fails after: $1 ($(grep -m1 'check-docs: ' "$tmp/out"))"; fi
}
fresh
check || { echo "FAIL: check-docs fails on the tree as committed:"; cat "$tmp/out"; exit 1; }
# 1. A quoted number edited by hand (the first quote's value, one digit changed).
fresh
python3 - "$tmp/t/README.md" <<'PY'
import re, sys
p = sys.argv[1]; s = open(p).read()
m = re.search(r"(\d)(\S*?<!--q )", s)
s = s[:m.start(1)] + str((int(m.group(1)) + 1) % 10) + s[m.end(1):]
open(p, "w").write(s)
PY
expect_failure "a quoted README number edited by hand"
# 2. A docs/ page edited by hand.
fresh
page=$(ls "$tmp/t/docs/"*.md | head -1)
sed -i '3s/$/ (edited)/' "$page"
expect_failure "docs/$(basename "$page") edited by hand"
# 3. A measurement typed into the README without a source.
fresh
sed -i '0,/^## /s//The trainer runs 3.5x faster than PyTorch.\n\n## /' "$tmp/t/README.md"
expect_failure "an unquoted measurement added to README.md"
# 4. The same in a guide (docs/guide/: hand-written pages, held to the README's rule).
fresh
sed -i '0,/^## /s//ZeRO-3 trains 40% faster here.\n\n## /' "$tmp/t/docs/guide/quickstart.md"
expect_failure "an unquoted measurement added to a guide"
exit $fail
