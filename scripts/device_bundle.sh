#!/usr/bin/env bash
# Collects what scripts/gpu_check.sh needs on a CUDA machine that reaches no package
# registry into .device/ (ignored by git; carried to the machine): the meshtrain binary and
# the test binary built here against the same torch wheel as the machine's (2.11.0+cu130:
# the same libtorch ABI), and the one Debian library they need beyond libtorch and glibc
# (libxxhash). paths.txt records where the test binary looks for the meshtrain binary
# (MESHTRAIN_BIN is compiled in), so the check can put it there.
#
#   scripts/device_bundle.sh [BUILD_DIR]     (default build; builds meshtrain and test_unit first)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
cmake --build "$BUILD" -j2 --target meshtrain test_unit meshtrain_cuda >/dev/null
rm -rf .device
mkdir -p .device/bin .device/lib
cp "$BUILD/meshtrain" "$BUILD/tests/test_unit" "$BUILD/libmeshtrain_cuda.so" .device/bin/
strip --strip-unneeded .device/bin/meshtrain .device/bin/test_unit .device/bin/libmeshtrain_cuda.so
xxhash=$(ldd "$BUILD/meshtrain" | awk '/libxxhash/ {print $3}')
cp -L "$xxhash" .device/lib/
echo "MESHTRAIN_BIN $(realpath "$BUILD/meshtrain")" > .device/paths.txt
echo "TORCH $("$(scripts/torch_env.sh --check)/bin/python" -c 'import torch; print(torch.__version__)')" >> .device/paths.txt
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
du -sh .device | awk '{print "device bundle: " $1 " in .device/"}'
