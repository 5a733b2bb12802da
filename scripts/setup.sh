#!/usr/bin/env bash
# Installs every Debian package meshtrain needs to build, test and run its demo.
# Idempotent: packages already present are skipped. Uses sudo when not root.
set -euo pipefail

PACKAGES=(
  build-essential cmake ccache pkg-config
  libtorch-dev libgloo-dev            # tensors, autograd, c10d (Gloo)
  libopenblas0-pthread                # fp32 GEMM: without it libtorch falls back to
                                      # the reference BLAS, ~60x slower (docs/build.md)
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libfmt-dev
  libsentencepiece-dev sentencepiece libxxhash-dev  # tokenizer (spm_encode: bench/tokenize.sh), checksums
  zlib1g-dev                          # gzip corpora (meshtrain data)
  libgtest-dev libbenchmark-dev       # tests, micro-benchmarks
  python3-torch                       # the independent reference model (tests/reference/)
  bible-kjv                           # the demo corpus: KJV text + its reader `bible`
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
