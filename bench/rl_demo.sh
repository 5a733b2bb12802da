#!/usr/bin/env bash
# Issue #18's training numbers. Writes docs/bench-rl-demo.md and docs/rl-demo.svg:
#  1. the RL demo (`make rl-demo`): GRPO from a short SFT on the shipped
#     reverse task; held-out accuracy (greedy, and sampled at the rollout
#     temperature) every 25 steps, reward per step: a table and a plot;
#  2. the same recipe on arithmetic (configs/arith-sft.toml, arith-grpo.toml);
#  3. wall time per RL step split into generation (rollouts and rewards) and
#     training (reference, critic and GAE for PPO, the optimisation steps);
#  4. the memory ledger: per-rank bytes of each model measured by the runtime
#     beside the planner's RL ledger, for PPO with four models (a learned
#     reward model trained first) and GRPO with its reference; peak RSS.
# Usage: bench/rl_demo.sh [BUILD_DIR]
set -euo pipefail
source "$(dirname "$0")/header.sh"
BUILD=${1:-build}
OUT=docs/bench-rl-demo.md
SVG=docs/rl-demo.svg
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
M="$BUILD/meshtrain"

start=$(date +%s)
make -s rl-demo BUILD="$BUILD" > "$dir/demo.log" 2>&1 || { cat "$dir/demo.log" >&2; exit 1; }
demo_s=$(( $(date +%s) - start ))
cp runs/reverse-grpo/log.metrics "$dir/reverse.metrics"

# Arithmetic: the same recipe, a longer SFT (the task is harder).
"$M" tokenize task --name arithmetic --out data/arith --seq 64 --force > "$dir/arith.log" 2>&1
rm -rf runs/arith-sft runs/arith-grpo
"$M" train configs/arith-sft.toml >> "$dir/arith.log" 2>&1 || { cat "$dir/arith.log" >&2; exit 1; }
"$M" train configs/arith-grpo.toml >> "$dir/arith.log" 2>&1 || { cat "$dir/arith.log" >&2; exit 1; }
cp runs/arith-grpo/log.metrics "$dir/arith.metrics"

# The ledger: a reward model on the reverse task's pairs, then 4 steps of PPO
# (actor, critic, reference, reward) and of GRPO with its reference (beta > 0).
cat > "$dir/rm.toml" <<TOML
[model]
preset = "gpt-tiny"
layers = 4
hidden = 128
heads = 4
ffn = 512
vocab = 64
dropout = 0.0
attention = "tiled"
[data]
train = "data/reverse/prefs/train.bin"
[train]
method = "reward"
steps = 40
seq = 64
micro_batch = 8
global_batch = 16
lr = 1e-3
log_every = 40
[checkpoint]
dir = "$dir/rm"
TOML
"$M" train "$dir/rm.toml" > "$dir/rm.log" 2>&1 || { cat "$dir/rm.log" >&2; exit 1; }
rl_run() {  # TAG CONFIG ARGS...
  local tag=$1 config=$2
  shift 2
  "$M" train "$config" --set train.steps=4 --set train.eval_every=1000 --set rl.eval='""' \
    --set checkpoint.dir='""' --set train.metrics="\"$dir/$tag.metrics\"" "$@" > "$dir/$tag.log" 2>&1 ||
    { cat "$dir/$tag.log" >&2; exit 1; }
}
rl_run ppo configs/reverse-ppo.toml --set rl.reward_model="\"$dir/rm\""
rl_run grpo configs/reverse-grpo.toml --set grpo.beta=0.04
ledger() { sed -n '/memory per rank/,/^\[rank 0\] step/p' "$dir/$1.log" | grep -v '\] step' | sed 's/^\[rank 0\] //'; }

python3 - "$dir" > "$dir/tables.md" <<'PY'
import json, statistics, sys
d = sys.argv[1]
def rows(name): return [json.loads(l) for l in open(f"{d}/{name}.metrics") if l.strip()]
def curve(name):
    rs = rows(name)
    print("| step | reward (mean of the steps since the last row) | rollout accuracy | held-out greedy | held-out sampled |")
    print("|---:|---:|---:|---:|---:|")
    window = []
    for r in rs:
        if "reward" in r: window.append(r)
        if "eval_accuracy" in r:
            rw = f"{statistics.mean(w['reward'] for w in window):.3f}" if window else "-"
            acc = f"{statistics.mean(w['accuracy'] for w in window):.3f}" if window else "-"
            print(f"| {r['step']} | {rw} | {acc} | {r['eval_accuracy']:.3f} | {r['eval_sampled_accuracy']:.3f} |")
            window = []
    print()
def split(name, label):
    rs = [r for r in rows(name) if "rollout_s" in r][1:] or [r for r in rows(name) if "rollout_s" in r]
    g, t = statistics.median(r["rollout_s"] for r in rs), statistics.median(r["train_s"] for r in rs)
    print(f"| {label} | {g:.3f} | {t:.3f} | {100 * g / (g + t):.0f}% |")
print("### Reverse (the demo)\n"); curve("reverse")
print("### Arithmetic\n"); curve("arith")
print("### Wall time per step (median over the run's steps after the first)\n")
print("| run | generation s | training s | generation share |")
print("|---|---:|---:|---:|")
split("reverse", "GRPO, reverse demo (16 prompts x 8)")
split("arith", "GRPO, arithmetic (16 prompts x 8)")
split("ppo", "PPO with a reward model (4 steps)")
split("grpo", "GRPO with a reference (4 steps)")
PY
python3 bench/svg_plot.py "$SVG" "GRPO on the reverse task (make rl-demo)" "$dir/reverse.metrics" \
  "reward:reward per step (train rollouts)" "eval_accuracy:held-out accuracy, greedy" \
  "eval_sampled_accuracy:held-out accuracy, sampled at 0.5"
val() { python3 -c "
import json, sys
rs = [json.loads(l) for l in open('$dir/$1.metrics') if '$2' in l]
print('%.3f' % rs[$3]['$2'])"; }
peak() { python3 -c "
import json
print('%.0f' % (max(json.loads(l).get('peak_mem_bytes', 0) for l in open('$dir/$1.metrics')) / 2**20))"; }
{
  echo "# Reinforcement learning: GRPO and PPO runs"
  echo
  echo "Generated by \`bench/rl_demo.sh\` on $(date -u +%Y-%m-%d):"
  machine
  echo
  echo "\`make rl-demo\` (\`configs/reverse-sft.toml\`, \`configs/reverse-grpo.toml\`; ${demo_s} s including the build"
  echo "check and data) then \`configs/arith-sft.toml\` and \`configs/arith-grpo.toml\`, 2 ranks each. Held-out accuracy"
  echo "is on 400 \`eval.jsonl\` prompts that \`meshtrain tokenize task\` keeps out of both the SFT data and the RL prompts."
  echo
  echo "![reward and held-out accuracy against step](rl-demo.svg)"
  echo
  cat "$dir/tables.md"
  echo
  echo "On reverse, GRPO sharpens what the short SFT left uncertain: compare the first and last rows of its table,"
  echo "greedy and sampled. On arithmetic the same recipe does not raise held-out accuracy over SFT's within its 200"
  echo "steps (its first and last rows): this 4-layer, 128-wide model rarely samples the right answer to a two-digit"
  echo "product, so the exact-match reward has little to reinforce, and what it reinforces on the RL prompts does not"
  echo "carry over to the held-out ones."
  echo
  echo "### Memory per rank: measured by the runtime beside the planner"
  echo
  echo "The first step's table of each run (fp32 on CPU: trained models 16 B per parameter, frozen ones 4 B; the"
  echo "plan counts the unpadded vocabulary), and the run's peak resident memory."
  echo
  echo "PPO with four models (peak RSS $(peak ppo) MiB):"
  echo
  echo '```'
  ledger ppo
  echo '```'
  echo
  echo "GRPO with its reference, no critic, no reward model (peak RSS $(peak grpo) MiB):"
  echo
  echo '```'
  ledger grpo
  echo '```'
  quotes_heading
  quote reverse_greedy_before "$(val reverse eval_accuracy 0)" "held-out greedy accuracy on reverse after SFT"
  quote reverse_greedy_after "$(val reverse eval_accuracy -1)" "held-out greedy accuracy on reverse after GRPO"
  quote reverse_sampled_before "$(val reverse eval_sampled_accuracy 0)" "held-out sampled accuracy on reverse after SFT"
  quote reverse_sampled_after "$(val reverse eval_sampled_accuracy -1)" "held-out sampled accuracy on reverse after GRPO"
  quote arith_greedy_before "$(val arith eval_accuracy 0)" "held-out greedy accuracy on arithmetic after SFT"
  quote arith_greedy_after "$(val arith eval_accuracy -1)" "held-out greedy accuracy on arithmetic after GRPO"
} > "$OUT.tmp"
seal "$OUT"
