#!/usr/bin/env bash
# The one-shot device check (issue #40), on a machine with a CUDA device, python3 with
# torch 2.11.0+cu130 and no package registry. Writes raw results into OUT_DIR; here,
# bench/gpu.sh OUT_DIR turns them into docs/gpu-<device>.md.
#   1. the GPU tests (tests/test_cuda.cpp, skipped on machines without a device): the
#      device equals the CPU, NCCL at world size 1, two ranks sharing the GPU over Gloo
#      (DDP, ZeRO-3, tp 2 + SP), resume, fp16 with the loss scaler, the log's device memory;
#   2. single-GPU bf16 training steps of GPT-2 124M and a ~1B Llama (Llama 3.2 1B's shape):
#      meshtrain's trainer and bare loop, and PyTorch eager (bench/torch_gpt.py, SDPA,
#      fused AdamW) on the same GPU, each in its own process: s/step, tokens/s, MFU against
#      the device's measured bf16 GEMM rate, peak device memory;
#   3. the ~1B Llama with train.precision = fp8 (the blocks' linears through Hopper's FP8
#      GEMM; current and delayed scaling): the trainer's s/step beside bf16's (issue #45).
#   4. the ~1B Llama bf16 with the optimizer offloaded (ZeRO-2 over one rank, bf16 weights on
#      the device, fp32 masters and AdamW on the 16 host cores): tokens/s and peak device
#      memory beside the resident run (issue #45);
#   5. the fused loss at the ~1B Llama's head shape: default chunks (at least hidden rows),
#      64 MiB chunks, one chunk and the unfused pair (meshtrain bench loss --device cuda).
#
#   scripts/gpu_check.sh OUT_DIR    with .device/ from scripts/device_bundle.sh carried along
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
exec > >(tee "$OUT/check.txt") 2>&1
PY=${PYTHON:-python3}
want=$(awk '/^TORCH/ {print $2}' .device/paths.txt)
have=$($PY -c 'import torch; print(torch.__version__)')
if [ "$want" != "$have" ]; then
  echo "gpu_check: the bundle was built against torch $want, this machine has $have: rebuild here instead"
  exit 1
fi
# This machine's libtorch, its CUDA runtime (the binaries link libcudart directly) and the bundle's libxxhash.
SITE=$($PY -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
LIBS="$SITE/torch/lib"
for d in "$SITE"/nvidia/*/lib "$SITE"/nvidia/cu13/lib; do [ -d "$d" ] && LIBS="$LIBS:$d"; done
export LD_LIBRARY_PATH="$LIBS:$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}  # ranks on one machine: loopback, whatever the hostname resolves to
bin=$(awk '/^MESHTRAIN_BIN/ {print $2}' .device/paths.txt)  # where test_unit looks for meshtrain
mkdir -p "$(dirname "$bin")"
cp .device/bin/meshtrain "$bin"
cp .device/bin/libmeshtrain_cuda.so "$(dirname "$bin")/"  # the CUDA plugin, found beside the binary
MT=$bin
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
echo "torch $have, $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" >> "$OUT/gpu.txt"

echo "== GPU tests"
start=$(date +%s)
.device/bin/test_unit --gtest_filter='Cuda.*:Device.*:SdpaAttention.*' 2>&1 | tee "$OUT/tests.txt" | grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure|error" | head -60
echo "tests: $(( $(date +%s) - start )) s"

echo "== training steps (bf16, one GPU)"
bench() {  # LABEL MODEL MICRO SEQ
  local label=$1 model=$2 mb=$3 seq=$4 common="--micro-batch $3 --seq $4 --precision bf16 --warmup 2 --steps 5 --rounds 1"
  for loop in trainer bare; do
    line=$("$MT" bench train --device cuda --model "$model" --loop "$loop" $common 2>&1 | tee -a "$OUT/bench_log.txt" |
           awk '/^RESULT/ {print $2, $3, $4, $5}')
    echo "$label $model $mb $seq meshtrain_$loop $line" | tee -a "$OUT/bench.txt"
  done
  shape=$(sed -n 's/^shape: //p' "$OUT/bench_log.txt" | tail -1)  # this model's, printed by the runs above
  line=$($PY bench/torch_gpt.py $shape --micro-batch "$mb" --seq "$seq" --precision bf16 --warmup 2 --steps 5 \
         --threads "$(nproc)" --attention sdpa --device cuda 2>&1 | tee -a "$OUT/bench_log.txt" | awk '/^RESULT/ {print $2, $3}')
  echo "$label $model $mb $seq torch_eager $line" | tee -a "$OUT/bench.txt"
}
bench gpt2 gpt2-124m 16 1024
bench llama1b llama-1b 4 2048
echo "== ZeRO-Offload (bf16, one GPU): the optimizer's slices and AdamW on the host"
line=$("$MT" bench train --device cuda --model llama-1b --loop trainer --offload --micro-batch 4 --seq 2048 \
       --precision bf16 --warmup 2 --steps 5 --rounds 1 2>&1 | tee -a "$OUT/bench_log.txt" | awk '/^RESULT/ {print $2, $3, $4, $5}')
echo "llama1b_offload llama-1b 4 2048 meshtrain_trainer $line" | tee -a "$OUT/bench.txt"
echo "== training steps (fp8, one GPU)"
for scaling in current delayed; do
  line=$("$MT" bench train --device cuda --model llama-1b --loop trainer --micro-batch 4 --seq 2048 --precision fp8 \
         --fp8-scaling "$scaling" --warmup 2 --steps 5 --rounds 1 2>&1 | tee -a "$OUT/bench_log.txt" |
         awk '/^RESULT/ {print $2, $3, $4, $5}')
  echo "llama1b_fp8_$scaling llama-1b 4 2048 meshtrain_trainer $line" | tee -a "$OUT/bench.txt"
done
echo "== the fused loss's chunks (the ~1B Llama's head: 8192 rows x 2048 against 128256)"
"$MT" bench loss --device cuda --model llama-1b --micro-batch 4 --seq 2048 --rounds 5 2>&1 | tee "$OUT/loss.txt"
echo "gpu_check: done in $SECONDS s"
