#!/usr/bin/env bash
# tests/check_skips.py on made-up ledgers: passes when every test ran somewhere,
# fails when one ran nowhere, honours and polices tests/allowed_skips.txt, and
# treats a missing ledger as a partial run (77) unless MESHTRAIN_TEST_FULL_SUITE=1.
set -euo pipefail
check=$(cd "$(dirname "$0")" && pwd)/check_skips.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
expect() {  # expect CODE WHAT [env...]
  local want=$1 what=$2 got=0
  shift 2
  env -u MESHTRAIN_TEST_FULL_SUITE "$@" python3 "$check" "$tmp/l" "$tmp/allowed" a b > "$tmp/out" 2>&1 || got=$?
  if [ "$got" = "$want" ]; then echo "ok: $what (exit $got)"; else echo "FAIL: $what: exit $got, want $want"; cat "$tmp/out"; fail=1; fi
}
reset() { rm -rf "$tmp/l"; mkdir -p "$tmp/l"; : > "$tmp/allowed"; }
reset
printf 'RAN S.x\nFILTERED S.y\n' > "$tmp/l/a.txt"; printf 'FILTERED S.x\nRAN S.y\n' > "$tmp/l/b.txt"
expect 0 "every test ran in one entry"
printf 'RAN S.x\nSKIPPED S.y\tneeds 4 ranks\n' > "$tmp/l/a.txt"
expect 0 "skipped in one entry, ran in the other"
printf 'RAN S.x\nSKIPPED S.y\tneeds 4 ranks\n' > "$tmp/l/a.txt"; printf 'RAN S.x\nSKIPPED S.y\tno torch\n' > "$tmp/l/b.txt"
expect 1 "skipped in every entry"
echo "S.y  needs a GPU" > "$tmp/allowed"
expect 0 "skipped everywhere but allowed"
printf 'RAN S.x\nRAN S.y\n' > "$tmp/l/b.txt"
expect 1 "allowed to skip, but ran: the list is stale"
reset
printf 'RAN S.x\nFILTERED S.y\n' > "$tmp/l/a.txt"; printf 'RAN S.x\nFILTERED S.y\n' > "$tmp/l/b.txt"
expect 1 "filtered out of every entry"
rm "$tmp/l/b.txt"
expect 77 "an entry without a ledger: a partial run"
expect 1 "an entry without a ledger in the full suite" MESHTRAIN_TEST_FULL_SUITE=1
exit $fail
