#!/usr/bin/env bash
# Installs every Debian package meshtrain needs to build, test and run its demo, then
# libtorch itself: PyPI's torch wheel in a cached virtual environment (scripts/torch_env.sh).
# Idempotent: packages already present are skipped, a complete environment is reused.
# Uses sudo when not root.
set -euo pipefail

PACKAGES=(
  build-essential cmake ccache pkg-config
  libgloo-dev                         # gloo headers: the torch wheel ships its symbols, not
                                      # the headers ProcessGroupGloo.hpp includes (compat.h)
  python3-venv                        # the torch wheel's environment (scripts/torch_env.sh)
  libcli11-dev nlohmann-json3-dev
  libsentencepiece-dev sentencepiece libxxhash-dev  # tokenizer (spm_encode: bench/tokenize.sh), checksums
  libssl-dev                          # HMAC-SHA256 of the multi-host job token
  zlib1g-dev                          # gzip corpora (meshtrain data)
  libgtest-dev libbenchmark-dev       # tests, micro-benchmarks
  bible-kjv                           # the demo corpus: KJV text + its reader `bible`
  iproute2 util-linux                 # hosts in network namespaces (tests/test_multihost.cpp: ip, unshare)
  slurm-wlm munge openmpi-bin         # Slurm and mpirun for real (scripts/slurm_local.sh, the Mpi test)
  strace                              # which system calls the ranks make (MoeCli.PtracerOnlyWhenCrossMemoryAttachIsUsed)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The wheel's CMake config (TorchConfig -> Caffe2's cuda.cmake) needs a CUDA toolkit at configure
# time, GPU or not: nvcc, cudart and the driver stub. These machines carry CUDA 13.0 under
# /usr/local/cuda; neither Debian nor PyPI serves a whole toolkit that CMake accepts.
if ! command -v nvcc > /dev/null && [ ! -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDACXX:-}" ]; then
  echo "setup: no CUDA toolkit (nvcc not on PATH, no /usr/local/cuda/bin/nvcc, CUDACXX unset): meshtrain builds" \
       "against the CUDA 13.0 torch wheel, whose CMake config needs the toolkit even without a GPU; install" \
       "CUDA 13.0 (NVIDIA's cuda-toolkit-13-0) or set CUDACXX to its nvcc, then run this again" >&2
  exit 1
fi

# libtorch (tensors, autograd, c10d Gloo and NCCL, CUDA): the torch wheel's C++ half.
# CMakeLists.txt finds the environment through scripts/torch_env.sh --check.
echo "setup: libtorch in $("$(dirname "$0")/torch_env.sh")"
# The frameworks the tests compare with (transformers), pinned, in the same environment.
echo "setup: the peers in $("$(dirname "$0")/peers_env.sh")"
