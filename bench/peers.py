"""meshtrain side by side with its peers (issue 42), one run: the same Llama of the gpt2-124m shape,
the same starting weights, tokens and AdamW, on 2 ranks of this host; each pair's agreement (loss
and gradient norm per step), tokens/s and peak resident memory per rank.

  peers.py BUILD_DIR [--rounds N] [--steps N] [--layers N] [--hidden N] [--seq N] [--micro N]

Prints the body of docs/peers.md (bench/peers.sh adds the machine line and the seal).

What is measured, the same way on both sides:
  - tokens/s: the global batch's tokens over the median of steps 3.. (rank 0's step times:
    meshtrain's metrics file; the peers time each step from its start to after the update);
  - peak resident memory per rank: VmHWM of each rank's process (/proc/PID/status), polled every
    0.1 s while the run goes on (the high-water mark only grows; a run's last poll is its peak);
    the rank processes are the launcher's children (meshtrain launch's ranks; the peers'
    torch.multiprocessing.spawn workers);
  - threads: OMP_NUM_THREADS = 1 for both (2 ranks on 2 cores; meshtrain's default is cores /
    ranks, the peers call torch.set_num_threads(1)); the same environment otherwise.
Rounds interleave the two sides (meshtrain first in odd rounds, the peer first in even ones).
"""
import argparse
import json
import re
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "..", "tests", "peers")

# (name, meshtrain's [parallel] lines, peer script, peer mode)
PAIRS = [
    ("DDP", "zero = 0", "pytorch_peer.py", "ddp"),
    ("ZeRO-1", "zero = 1", "deepspeed_peer.py", "zero1"),
    ("ZeRO-2", "zero = 2", "deepspeed_peer.py", "zero2"),
    ("ZeRO-3", "zero = 3", "deepspeed_peer.py", "zero3"),
    ("ZeRO-3", "zero = 3", "pytorch_peer.py", "fsdp2"),
    ("tp 2", "tp = 2", "pytorch_peer.py", "tp"),
    ("tp 2 + SP", "tp = 2\nsp = true", "pytorch_peer.py", "sp"),
    ("pp 2 1F1B", "pp = 2\nschedule = \"1f1b\"\npp_balance = \"compute\"", "pytorch_peer.py", "1f1b"),
    ("pp 2 1F1B, cut in half", "pp = 2\nschedule = \"1f1b\"\npp_balance = \"parameters\"", "pytorch_peer.py",
     "1f1b_even"),
]
PEER_NAMES = {"ddp": "PyTorch DDP", "zero1": "DeepSpeed ZeRO-1", "zero2": "DeepSpeed ZeRO-2",
              "zero3": "DeepSpeed ZeRO-3", "fsdp2": "PyTorch FSDP2 (fully_shard)",
              "tp": "DTensor tp (Colwise/Rowwise)", "sp": "DTensor tp + SequenceParallel, loss_parallel",
              "1f1b": "torch.distributed.pipelining Schedule1F1B, the same cut",
              "1f1b_even": "torch.distributed.pipelining Schedule1F1B, cut in half"}


def write_shard(path, tokens):
    """meshtrain's token shard (src/data/shard.cpp): magic, version 1, 4-byte tokens, count, one
    document starting at 0; the tokens; the document starts."""
    with open(path, "wb") as f:
        f.write(b"MTSHARD1" + struct.pack("<IIQQ", 1, 4, len(tokens), 1))
        f.write(struct.pack(f"<{len(tokens)}I", *tokens))
        f.write(struct.pack("<Q", 0))


def children(pid):
    """The pids whose parent is pid."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


def vmhwm_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def run(cmd, log, is_rank):
    """Runs cmd; returns the peak VmHWM (KiB) of each rank process (children of cmd's process
    for which is_rank(cmdline) holds), polled every 0.1 s."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        peaks = {}
        while p.poll() is None:
            for c in children(p.pid):
                try:
                    with open(f"/proc/{c}/cmdline", "rb") as g:
                        cmdline = g.read().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if is_rank(cmdline):
                    h = vmhwm_kib(c)
                    if h is not None:
                        peaks[c] = max(peaks.get(c, 0), h)
            time.sleep(0.1)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}); its log: {log}\n" + open(log).read()[-4000:])
    if len(peaks) != 2:
        sys.exit(f"{' '.join(cmd)}: found {len(peaks)} rank processes, not 2")
    return sorted(peaks.values())


def import_hwm_mib(modules):
    """The peak resident memory (MiB) of a python that imports `modules` and computes nothing: its own
    VmHWM (a child's ru_maxrss would count the pages it shared with this process before exec)."""
    out = subprocess.run([sys.executable, "-c", f"import {modules}\n"
                          "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))"],
                         check=True, capture_output=True, text=True).stdout
    return int(out.split()[-1]) / 1024


def compute_balanced_split(a):
    """Layers of the first of 2 pipeline stages when the stages balance matmul work per token, as
    meshtrain's pp_balance = "compute" does (src/plan/partition.cpp: a layer's weights each, the
    head's V x h on the last stage, the embedding lookup free); both sides of the first pp pair cut
    the model there (the peer's stages are the script's to choose, and an even cut leaves the head's
    stage with about twice the work at this vocabulary). meshtrain's log states its cut, checked
    against this one."""
    layer = a.hidden * a.hidden * 2 + 2 * a.hidden * (a.hidden * a.kv_heads // a.heads) + 3 * a.hidden * a.ffn \
        + 2 * a.hidden
    head = a.vocab * a.hidden
    return min(range(1, a.layers), key=lambda k: (max(k * layer, (a.layers - k) * layer + head), -k))


def peer_args(mode, split):
    """The peer script's mode and optional arguments for a PAIRS mode: both 1F1B rows run the
    script's 1f1b, one at meshtrain's compute-balanced cut, one at its own default (half the layers a
    stage), where meshtrain runs its parameter-balanced cut."""
    if mode == "1f1b":
        return "1f1b", [str(split)]
    if mode == "1f1b_even":
        return "1f1b", []
    return mode, []


def median_tail(xs):
    return statistics.median(xs[2:]) if len(xs) > 2 else statistics.median(xs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated peer modes (default: all)")
    a = ap.parse_args()
    bin_ = os.path.join(a.build, "meshtrain")
    unknown = sorted(set(a.only.split(",")) - {p[3] for p in PAIRS}) if a.only else []
    if unknown:
        sys.exit(f"--only {','.join(unknown)}: the peer modes are {','.join(p[3] for p in PAIRS)}")
    if min(a.rounds, a.steps - 2, a.micro, a.seq) < 1:
        sys.exit("--rounds, --micro and --seq must be at least 1, --steps at least 3 (the median starts at step 3)")
    pairs = [p for p in PAIRS if not a.only or p[3] in a.only.split(",")]
    split = compute_balanced_split(a)
    batch = 2 * a.micro  # the global batch: one micro-batch per data-parallel rank
    d = tempfile.mkdtemp(prefix="meshtrain_peers_")
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(a.vocab, (batch * a.seq + 1,), generator=g)
    write_shard(os.path.join(d, "train.bin"), tokens.tolist())
    # An epoch a step: every step of both sides trains on these windows.
    windows = torch.stack([tokens[w * a.seq: w * a.seq + a.seq + 1] for w in range(batch)])
    save_file({"windows": windows.contiguous()}, os.path.join(d, "windows.safetensors"))
    model = (f'[model]\npreset = "llama-tiny"\nvocab = {a.vocab}\nlayers = {a.layers}\nhidden = {a.hidden}\n'
             f'heads = {a.heads}\nkv_heads = {a.kv_heads}\nffn = {a.ffn}\ntied = false\ndropout = 0.0\n')

    def config(name, more):
        path = os.path.join(d, name + ".toml")
        with open(path, "w") as f:
            f.write(model + f'[data]\ntrain = "{d}/train.bin"\n[train]\nmicro_batch = {a.micro}\n'
                    f'global_batch = {batch}\nseq = {a.seq}\nlog_every = 1\nschedule = "constant"\nwarmup = 0\n'
                    f'weight_decay = 0.0\nclip = 0.0\nmetrics = "{d}/{name}.metrics"\n' + more)
        return path

    # The starting weights: one step of one process, exported for the peers.
    base = os.path.join(d, "base")
    subprocess.run([bin_, "train", config("base", f'steps = 1\nlr = 1e-2\n[checkpoint]\ndir = "{base}"\nevery = 1\n')],
                   check=True, capture_output=True)
    subprocess.run([bin_, "ckpt", "export", base, "--format", "hf", "--out", base + "_hf"], check=True,
                   capture_output=True)

    # What a peer's process holds before it computes anything (`import torch` maps libtorch's CUDA half
    # always); meshtrain's ranks print theirs before the model is built ("resident at start").
    idle = {"torch": import_hwm_mib("torch"), "torch + transformers": import_hwm_mib("torch, transformers")}
    ours_done = {}  # meshtrain's runs by mesh, per round (ZeRO-3 serves two peers)
    results = []
    for r in range(a.rounds):
        ours_done.clear()
        for name, mesh, script, mode in pairs:
            def ours():
                if mesh in ours_done:
                    return ours_done[mesh]
                tag = f"ours_{mode}_{r}"
                cfg = config(tag, f'steps = {a.steps}\nlr = 1e-3\n[init]\nfrom = "{base}"\n[parallel]\nnproc = 2\n{mesh}\n')
                peaks = run([bin_, "train", cfg], os.path.join(d, tag + ".log"), lambda c: "meshtrain" in c)
                log = open(os.path.join(d, tag + ".log")).read()
                cut = re.search(r"layers per stage \[(\d+), \d+\]", log)
                want = a.layers // 2 if mode == "1f1b_even" else split
                if "pp = 2" in mesh and (not cut or int(cut.group(1)) != want):
                    sys.exit(f"meshtrain's pipeline cut ({cut.group(0) if cut else 'not in its log'}) is not the "
                             f"peer's: {want} layers on the first stage")
                start = re.search(r"([0-9.]+) MiB resident at start", log)
                if start:
                    idle.setdefault("meshtrain rank", float(start.group(1)))
                rows = [json.loads(line) for line in open(os.path.join(d, tag + ".metrics"))]
                rows = [x for x in rows if "loss" in x and "step" in x]
                ours_done[mesh] = {"loss": [x["loss"] for x in rows], "grad_norm": [x["grad_norm"] for x in rows],
                                   "tokens_per_s": median_tail([x["tokens_per_s"] for x in rows]), "hwm": peaks}
                return ours_done[mesh]

            def theirs():
                out = os.path.join(d, f"peer_{mode}_{r}.json")
                peer_mode, extra = peer_args(mode, split)
                peaks = run([sys.executable, os.path.join(PEERS, script), peer_mode, base + "_hf",
                             os.path.join(d, "windows.safetensors"), str(a.steps), "1e-3", out] + extra,
                            os.path.join(d, f"peer_{mode}_{r}.log"), lambda c: "spawn_main" in c)
                j = json.load(open(out))
                j["tokens_per_s"] = batch * a.seq / median_tail(j["step_s"])
                j["hwm"] = peaks
                return j

            m, t = (ours(), theirs()) if r % 2 == 0 else (theirs(), ours())[::-1]
            results.append((r, name, mode, m, t))
    emit(a, results, idle)
    shutil.rmtree(d)  # a failed run keeps it: its error names a log there


def emit(a, results, idle):
    params = a.layers * (a.hidden * a.hidden * 2 + 2 * a.hidden * (a.hidden * a.kv_heads // a.heads)
                         + 3 * a.hidden * a.ffn + 2 * a.hidden) + 2 * a.vocab * a.hidden + a.hidden
    print(f"Model: a Llama of the gpt2-124m shape ({a.layers} layers, hidden {a.hidden}, {a.heads} heads on "
          f"{a.kv_heads} kv heads, SwiGLU ffn {a.ffn}, vocabulary {a.vocab}, untied: {params / 1e6:.1f}M parameters), "
          f"fp32, sequence {a.seq}, micro-batch {a.micro} per data-parallel rank, global batch {2 * a.micro} "
          f"({2 * a.micro * a.seq} tokens a step); AdamW (0.9, 0.95, 1e-8, no weight decay) at a constant 1e-3, no "
          f"clipping, no dropout; {a.steps} steps from the same weights (meshtrain's one-step base, exported with "
          f"`ckpt export --format hf`, loaded by the peer with transformers, eager attention); 2 ranks, Gloo, "
          f"OMP_NUM_THREADS=1 each; {a.rounds} interleaved rounds. pp 2: meshtrain cuts the model after layer "
          f"{compute_balanced_split(a)} of {a.layers}, where the stages' matmul work per token balances "
          f"(`parallel.pp_balance = \"compute\"`; the head's multiply is about "
          f"{a.vocab / (2 * a.hidden + 2 * a.hidden * a.kv_heads / a.heads + 3 * a.ffn):.1f} layers' worth); the peer "
          f"runs at the same cut. The second pp row cuts both sides in half, the peer script's default: meshtrain "
          f"with `parallel.pp_balance = \"parameters\"` (the stages' parameter counts balance; the embedding and the "
          f"untied head are the same size), which is its memory-balanced cut.")
    print()
    print("## Agreement (round 1)")
    print()
    print("Largest relative difference over the steps, meshtrain against the peer; step 1 is the same weights, "
          "later steps follow each side's own updates.")
    print()
    print("| meshtrain | peer | loss, step 1 | gradient norm, step 1 | loss, all steps | gradient norm, all steps |")
    print("|---|---|---|---|---|---|")
    for r, name, mode, m, t in results:
        if r:
            continue
        rel = [[abs(x - y) / abs(y) for x, y in zip(m[k], t[k])] for k in ("loss", "grad_norm")]
        print(f"| {name} | {PEER_NAMES[mode]} | {rel[0][0]:.1e} | {rel[1][0]:.1e} | {max(rel[0]):.1e} | "
              f"{max(rel[1]):.1e} |")
    print()
    print("## Speed and memory")
    print()
    print("tokens/s: the global batch's tokens over rank 0's median step time (steps 3 on); memory: the larger "
          "rank's VmHWM. Each round's pair ran back to back.")
    print()
    print("| meshtrain | peer | round | meshtrain tokens/s | peer tokens/s | ratio | meshtrain VmHWM per rank | "
          "peer VmHWM per rank | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = {}
    for r, name, mode, m, t in results:
        speed = m["tokens_per_s"] / t["tokens_per_s"]
        mem = max(m["hwm"]) / max(t["hwm"])
        ratios.setdefault((name, mode), []).append((speed, mem))
        mib = lambda h: " / ".join(f"{x / 1024:.0f}" for x in h) + " MiB"  # noqa: E731
        print(f"| {name} | {PEER_NAMES[mode]} | {r + 1} | {m['tokens_per_s']:.0f} | {t['tokens_per_s']:.0f} | "
              f"{speed:.2f} | {mib(m['hwm'])} | {mib(t['hwm'])} | {mem:.2f} |")
    print()
    print("Before computing anything (libraries loaded; resident): "
          + ", ".join(f"{k} {v:.0f} MiB" for k, v in idle.items())
          + " (the peers' imports: their VmHWM; meshtrain's rank: its log's \"resident at start\", before the model "
          "is built). meshtrain maps libtorch's CUDA half (libtorch_cuda, cuBLAS, NCCL) only where a CUDA driver "
          "is (this machine has none); `import torch` maps it always.")
    print()
    print("Per pair, the rounds' median (the issue's target: tokens/s ratio at least 1.3, memory ratio at most 0.8):")
    print()
    print("| meshtrain | peer | tokens/s ratio | memory ratio |")
    print("|---|---|---|---|")
    for (name, mode), rs in ratios.items():
        print(f"| {name} | {PEER_NAMES[mode]} | {statistics.median(s for s, _ in rs):.2f} | "
              f"{statistics.median(x for _, x in rs):.2f} |")
    json.dump({f"{name}|{mode}": rs for (name, mode), rs in ratios.items()}, open(os.environ.get("PEERS_JSON", os.devnull), "w"))


if __name__ == "__main__":
    main()
