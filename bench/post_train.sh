#!/usr/bin/env bash
# Issue #14's post-training numbers. Writes docs/bench-post-train.md:
#  1. the post-training demo (`make post-train-demo`): exact match of the
#     verse-quoting answers before SFT, after SFT and after DPO, and DPO's
#     reward margin and accuracy at its first and last step;
#  2. full SFT vs LoRA vs QLoRA on the gpt2-124m shape (one process, fp32,
#     sequence 128, micro-batch 1, 4 per step): per-rank model-state bytes
#     measured after the first step beside the planner's ledger (--check-plan,
#     which fails beyond 5%), step time and peak resident memory;
#  3. packing: the shipped SFT data one conversation per block (--no-pack),
#     packed once, or repacked by the loader each epoch: padding, trained
#     fraction, tokens/s and trained tokens/s of the demo model.
# Usage: bench/post_train.sh [BUILD_DIR]
set -euo pipefail
source "$(dirname "$0")/header.sh"
BUILD=${1:-build}
OUT=docs/bench-post-train.md
POST=data/kjv-post
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

make -s post-train-demo BUILD="$BUILD" > "$dir/demo.log" 2>&1 || { cat "$dir/demo.log" >&2; exit 1; }
em() { grep "$1.*exact match" "$dir/demo.log" | sed -E 's/.*exact match ([0-9]+\/[0-9]+) = ([0-9.]+);.*/\1/'; }
dpo_first=$(grep -E '^\[rank 0\] step +1 \| loss [0-9.]+ \| rewards' "$dir/demo.log" | sed 's/^\[rank 0\] //' | cut -d'|' -f1-6)
dpo_last=$(grep -E '^\[rank 0\] step +40 \| loss [0-9.]+ \| rewards' "$dir/demo.log" | sed 's/^\[rank 0\] //' | cut -d'|' -f1-6)

# The gpt2-124m shape on the shipped SFT data.
cat > "$dir/g.toml" <<TOML
[model]
preset = "gpt2-124m"
dropout = 0.0
[data]
train = "$POST/sft/train.bin"
[train]
method = "sft"
steps = 4
micro_batch = 1
global_batch = 4
seq = 128
lr = 1e-4
log_every = 1
[parallel]
nproc = 1
TOML
"$BUILD/meshtrain" train "$dir/g.toml" --set train.steps=1 --set checkpoint.dir="\"$dir/base\"" > "$dir/base.log" 2>&1 ||
  { cat "$dir/base.log" >&2; exit 1; }
# variant TAG ARGS...: 4 steps from the base with --check-plan; prints the
# check-plan table to $dir/TAG.plan and "SECONDS_PER_STEP PEAK_RSS" (steps 2-4).
variant() {
  local tag=$1
  shift
  "$BUILD/meshtrain" train "$dir/g.toml" --set init.from="\"$dir/base\"" --check-plan \
    --set train.metrics="\"$dir/$tag.metrics\"" "$@" > "$dir/$tag.log" 2>&1 || { cat "$dir/$tag.log" >&2; exit 1; }
  sed -n '/^check-plan/,/tied-embedding/p' "$dir/$tag.log" | grep -v 'bytes sent' > "$dir/$tag.plan"
  python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
print("%.2f %.0f" % (sum(512 / r["tokens_per_s"] for r in rows) / len(rows), max(r["peak_mem_bytes"] for r in rows) / 2**20))' \
    "$dir/$tag.metrics"
}
read -r full_s full_rss < <(variant full)
read -r lora_s lora_rss < <(variant lora --set lora.rank=8 --set lora.alpha=16 --set 'lora.targets=["all"]')
read -r qlora_s qlora_rss < <(variant qlora --set lora.rank=8 --set lora.alpha=16 --set 'lora.targets=["all"]' \
  --set lora.quantize=nf4)
state() { awk '/check-plan/ {next} /per rank/ {next} {print}' "$dir/$1.plan"; }
ratio_max() { awk 'NF && $NF ~ /^[0-9.]+$/ && $(NF-1) != "B" {r=$NF; d=(r>1?r-1:1-r); if (d>m) m=d} END {printf "%.4f", m}' "$dir/$1.plan"; }
measured_total() {
  python3 - "$dir/$1.plan" <<'PY'
import re, sys
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
total = 0
for line in open(sys.argv[1]):
    m = re.match(r"\s+(.+?)\s+([0-9.]+) (B|KiB|MiB|GiB)\s+([0-9.]+) (B|KiB|MiB|GiB)\s+([0-9.]+)$", line)
    if m:
        total += float(m.group(4)) * units[m.group(5)]
print("%.0f" % (total / 2**20))
PY
}

# Packing: the demo model on the shipped chats, 30 SFT steps, one process:
# pack_run DATA TAG ARGS... prints "PADDING TRAINED_FRACTION TOKENS_PER_S TRAINED_PER_S"
# (padding: the data's, as tokenize packed it; trained fraction: trained targets
# per row token, mean of steps 3-30, which counts the loader's own packing).
"$BUILD/meshtrain" tokenize chat --input $POST/chats.jsonl --tokenizer data/kjv/tokenizer.model --out "$dir/unpacked" \
  --seq 128 --no-pack > "$dir/unpacked.log" 2>&1
pack_run() {
  local data=$1 tag=$2
  shift 2
  "$BUILD/meshtrain" train configs/kjv-sft.toml --set data.train="\"$data\"" --set parallel.nproc=1 --set train.steps=30 \
    --set init.from='""' --set checkpoint.dir='""' --set train.metrics="\"$dir/$tag.metrics\"" "$@" > "$dir/$tag.log" 2>&1 ||
    { cat "$dir/$tag.log" >&2; exit 1; }
  python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
pad = json.load(open(sys.argv[2]))["padding_fraction"]
row_tokens = 8 * 128  # global batch x sequence (configs/kjv-sft.toml)
trained = sum(r["tokens"] for r in rows) / len(rows) / row_tokens
tps = sum(r["tokens_per_s"] for r in rows) / len(rows)
print("%.3f %.3f %.0f %.0f" % (pad, trained, tps, tps * trained))' "$dir/$tag.metrics" "$(dirname "$data")/sft.json"
}
read -r single_pad single_tr single_tps single_real < <(pack_run "$dir/unpacked/train.bin" single --set train.repack=false)
read -r static_pad static_tr static_tps static_real < <(pack_run "$POST/sft/train.bin" static --set train.repack=false)
read -r repack_pad repack_tr repack_tps repack_real < <(pack_run "$POST/sft/train.bin" repack)

{
  echo "# Post-training: SFT, DPO, LoRA and QLoRA"
  echo
  echo "Generated by \`bench/post_train.sh\` on $(date -u +%Y-%m-%d):"
  machine
  echo
  echo "## The post-training demo"
  echo
  echo "\`make post-train-demo\`: the demo model (\`configs/kjv-tiny.toml\`) fine-tuned to quote the 56 verses of"
  echo "Genesis 1-2 (\"Quote Genesis 1:3\" -> the verse; \`configs/kjv-sft.toml\`, 300 steps), then DPO with LoRA"
  echo "against another verse as the rejected answer (\`configs/kjv-dpo.toml\`, 40 steps, beta 0.1, the reference"
  echo "being the SFT model with the adapters off). Exact match: every answer token the greedy choice"
  echo "(\`meshtrain eval exact-match\`, on the training prompts: this demo measures learning, not generalisation)."
  echo
  echo '```'
  echo "exact match before SFT: $(em kjv-tiny)"
  echo "exact match after SFT:  $(em kjv-sft)"
  echo "exact match after DPO:  $(em kjv-dpo)"
  echo "DPO $dpo_first"
  echo "DPO $dpo_last"
  echo '```'
  echo
  echo "## Full SFT vs LoRA vs QLoRA on the gpt2-124m shape"
  echo
  echo "One process, fp32, sequence 128, 4 sequences per step (micro-batch 1), Adam; LoRA rank 8 on every block"
  echo "linear; QLoRA the same over NF4 block linears (double-quantised scales). The planner's bytes"
  echo "(\`plan/posttrain.h\`, \`plan/memory.h\`) beside those measured after the first step (\`--check-plan\`,"
  echo "which fails the run beyond 5%). Step time: mean of steps 2-4; peak: the process's resident high-water mark."
  echo
  for v in full lora qlora; do
    echo "### $v"
    echo
    echo '```'
    state $v
    echo '```'
    echo
  done
  echo "| method | model states measured | seconds per step | peak resident memory |"
  echo "|---|---|---|---|"
  echo "| full SFT | $(measured_total full) MiB | $full_s | $full_rss MiB |"
  echo "| LoRA | $(measured_total lora) MiB | $lora_s | $lora_rss MiB |"
  echo "| QLoRA | $(measured_total qlora) MiB | $qlora_s | $qlora_rss MiB |"
  echo
  echo "QLoRA's peak resident memory is LoRA's: the run loads the fp32 [init] weights before quantising them"
  echo "(and the allocator keeps the pages); its model states are what it holds while training. It is slower per"
  echo "step on the CPU: every forward and backward dequantises each block linear (no fused 4-bit kernel here)."
  echo
  echo "## Packing"
  echo
  echo "The shipped SFT data (56 chats, \`$POST/sft\`) in rows of 128 tokens: one conversation per block"
  echo "(\`tokenize chat --no-pack\`), packed once by \`tokenize chat\` (blocks shuffled each epoch), or repacked by"
  echo "the loader each epoch in a new order (\`train.repack\`, the SFT default). The demo model, one process, 30 SFT"
  echo "steps of 8 rows; means of steps 3-30. Trained fraction: assistant-token targets per row token; trained"
  echo "tokens/s = tokens/s x that fraction: the rate that matters. (Padding: the data as tokenized.)"
  echo
  echo "| layout | padding in the data | trained fraction | tokens/s | trained tokens/s |"
  echo "|---|---|---|---|---|"
  echo "| one per block | $single_pad | $single_tr | $single_tps | $single_real |"
  echo "| packed once | $static_pad | $static_tr | $static_tps | $static_real |"
  echo "| repacked each epoch | $repack_pad | $repack_tr | $repack_tps | $repack_real |"
  quotes_heading
  quote post_em_sft "$(em kjv-sft)" "exact match after SFT (before: $(em kjv-tiny))"
  quote post_em_dpo "$(em kjv-dpo)" "exact match after DPO"
  quote post_dpo_margin "$(echo "$dpo_last" | sed -E 's/.*margin ([-0-9.]+).*/\1/')" "DPO reward margin at its last step"
  quote post_plan_off "$(python3 -c "print(max($(ratio_max full), $(ratio_max lora), $(ratio_max qlora)))")" \
    "largest |measured / plan - 1| over the three ledgers"
  quote post_states_full "$(measured_total full)" "full SFT model states, MiB"
  quote post_states_qlora "$(measured_total qlora)" "QLoRA model states, MiB"
  quote post_pack_trained "$(python3 -c "print('%.2f' % ($repack_tr / $single_tr))")" \
    "trained tokens per row token, repacked over one conversation per block"
} > "$OUT.tmp"
seal "$OUT"
