#!/usr/bin/env bash
# scripts/check_layers.py must pass on the tree as committed and fail on each
# way an include can run up: a lower layer including a higher one (public and
# private headers), a layer including a peer on its own line, a folder with no
# layer. Runs on a copy of src/, include/ and labs/.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fresh() { rm -rf "$tmp/t"; mkdir -p "$tmp/t"; cp -r "$src/src" "$src/include" "$src/labs" "$tmp/t/"; }
check() { python3 "$src/scripts/check_layers.py" "$tmp/t" > "$tmp/out" 2>&1; }
fail=0
expect_failure() {
  if check; then echo "FAIL: check_layers passed after: $1"; fail=1; else echo "ok: fails after: $1 ($(head -1 "$tmp/out"))"; fi
}
fresh
check || { echo "FAIL: check_layers fails on the tree as committed:"; cat "$tmp/out"; exit 1; }
fresh; echo '#include "meshtrain/train/trainer.h"' >> "$tmp/t/src/comm/comm.cpp"; expect_failure "comm includes train/"
fresh; echo '#include "comm/backend.h"' >> "$tmp/t/src/platform/device.cpp"; expect_failure "platform includes comm's private header"
fresh; echo '#include "meshtrain/parallel/context/attention.h"' >> "$tmp/t/src/parallel/tensor/layers.cpp"; expect_failure "parallel/tensor includes its peer parallel/context"
fresh; mkdir -p "$tmp/t/src/newthing"; echo 'int x;' > "$tmp/t/src/newthing/a.cpp"; expect_failure "a folder with no layer"
exit $fail
