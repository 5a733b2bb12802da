#!/usr/bin/env bash
# The libtorch meshtrain builds against: PyPI's torch wheel (its C++ headers, libraries and
# CMake config; CUDA 13.0, cuDNN, NCCL) in a virtual environment under ~/.cache/meshtrain,
# keyed by the pinned version, so a second checkout and CI reuse it (4.6 GB, ~1.5 min).
#
#   scripts/torch_env.sh          install when needed; print the environment's directory
#   scripts/torch_env.sh --check  print it when complete, else exit 1 (installs nothing)
#
# Invariant: an environment is used only when its .complete marker holds the pinned
# version and was written after torch imported and its CMake config was found. Anything
# else in that directory (an interrupted download, a broken venv) is removed and redone.
set -euo pipefail

TORCH_VERSION=2.11.0
TORCH_LOCAL=cu130              # the wheel PyPI serves for Linux x86_64: CUDA 13.0, NCCL 2.28.9
NUMPY_VERSION=2.4.6            # torch warns at import without it; the reference model's python
ROOT="${MESHTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshtrain}"
ENV_DIR="$ROOT/torch-$TORCH_VERSION-$TORCH_LOCAL"
MARKER="$ENV_DIR/.complete"
WANT="torch $TORCH_VERSION+$TORCH_LOCAL numpy $NUMPY_VERSION"
PYTHON="${MESHTRAIN_VENV_PYTHON:-/usr/bin/python3}"

complete() { [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ] && [ -x "$ENV_DIR/bin/python" ]; }

if [ "${1:-}" = "--check" ]; then
  complete && { echo "$ENV_DIR"; exit 0; }
  exit 1
fi

mkdir -p "$ROOT"
exec 9>"$ROOT/.torch-env.lock"
flock 9                         # two checkouts installing at once: the second waits, then reuses
if complete; then
  echo "$ENV_DIR"
  exit 0
fi

if [ -e "$ENV_DIR" ]; then
  echo "torch_env: $ENV_DIR is incomplete (no $WANT marker): removing it and installing again" >&2
  rm -rf "$ENV_DIR"
fi
echo "torch_env: installing $WANT into $ENV_DIR (about 4.6 GB)" >&2
"$PYTHON" -m venv "$ENV_DIR" >&2
"$ENV_DIR/bin/pip" install --no-input --quiet --disable-pip-version-check "torch==$TORCH_VERSION" "numpy==$NUMPY_VERSION" >&2
got=$("$ENV_DIR/bin/python" - <<PY
import os, numpy, torch, torch.utils
assert torch.__version__ == "$TORCH_VERSION+$TORCH_LOCAL", torch.__version__
assert numpy.__version__ == "$NUMPY_VERSION", numpy.__version__
cfg = os.path.join(torch.utils.cmake_prefix_path, "Torch", "TorchConfig.cmake")
assert os.path.isfile(cfg), cfg
print("torch", torch.__version__, "numpy", numpy.__version__)
PY
)
echo "$got" > "$MARKER.tmp" && mv "$MARKER.tmp" "$MARKER"
echo "torch_env: $got ready" >&2
echo "$ENV_DIR"
