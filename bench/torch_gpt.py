#!/usr/bin/python3
"""PyTorch eager training steps of meshtrain's decoder, for bench/train.sh.

The same architecture as meshtrain's Transformer (pre-norm blocks, separate q,
k, v and o projections, naive causal attention with an fp32 softmax, GELU-tanh
or SwiGLU MLP, final norm, the head tied or not, the vocabulary padded as
meshtrain pads it), written the way a PyTorch user writes it (nn.Module,
F.cross_entropy, torch.optim.AdamW, torch.autocast for bf16). Random tokens,
dropout 0. Prints "RESULT <median seconds per step> <peak RSS bytes>".

  torch_gpt.py --layers 12 --hidden 768 --heads 12 --kv-heads 12 --ffn 3072
               --vocab 50304 --norm layernorm --norm-eps 1e-05 --activation gelu
               --position learned --rope-theta 10000 --tied 1 --bias 1
               --micro-batch 4 --seq 256 --precision fp32 --steps 3 --warmup 1 --threads 2
               [--attention naive|sdpa]   (sdpa: F.scaled_dot_product_attention, PyTorch >= 2.0)
               [--compile]                (torch.compile(model), inductor: its compilation happens in the
                                           warm-up steps, printed on a line "WARMUP <seconds>")
               [--device cpu|cuda]        (cuda: the model on cuda:0, fused AdamW, timed after a synchronize;
                                           the peak is torch.cuda.max_memory_allocated)
"""
import argparse
import math
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Norm(nn.Module):
    def __init__(self, h, kind, eps):
        super().__init__()
        self.kind, self.eps = kind, eps
        self.weight = nn.Parameter(torch.ones(h))
        self.bias = nn.Parameter(torch.zeros(h)) if kind == "layernorm" else None

    def forward(self, x):
        if self.kind == "layernorm":
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope(x, theta):  # x [b, heads, s, d], "rotate half" layout
    s, d = x.shape[2], x.shape[3]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    ang = torch.arange(s, dtype=torch.float32, device=x.device)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        h, d = a.hidden, a.hidden // a.heads
        self.a, self.d = a, d
        self.norm1, self.norm2 = Norm(h, a.norm, a.norm_eps), Norm(h, a.norm, a.norm_eps)
        self.q = nn.Linear(h, a.heads * d, bias=a.bias)
        self.k = nn.Linear(h, a.kv_heads * d, bias=a.bias)
        self.v = nn.Linear(h, a.kv_heads * d, bias=a.bias)
        self.o = nn.Linear(a.heads * d, h, bias=a.bias)
        if a.activation == "swiglu":
            self.gate = nn.Linear(h, a.ffn, bias=a.bias)
            self.up = nn.Linear(h, a.ffn, bias=a.bias)
        else:
            self.fc1 = nn.Linear(h, a.ffn, bias=a.bias)
        self.fc2 = nn.Linear(a.ffn, h, bias=a.bias)

    def attention(self, x):
        a, d = self.a, self.d
        b, s, _ = x.shape
        q = self.q(x).view(b, s, a.heads, d).transpose(1, 2)
        k = self.k(x).view(b, s, a.kv_heads, d).transpose(1, 2)
        v = self.v(x).view(b, s, a.kv_heads, d).transpose(1, 2)
        if a.position == "rope":
            q, k = rope(q, a.rope_theta), rope(k, a.rope_theta)
        if a.kv_heads < a.heads:
            k = k.repeat_interleave(a.heads // a.kv_heads, 1)
            v = v.repeat_interleave(a.heads // a.kv_heads, 1)
        if a.attention == "sdpa":  # PyTorch >= 2.0's fused kernel (flash / memory-efficient on CPU)
            return self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
                          .reshape(b, s, a.heads * d))
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), -1, dtype=torch.float32).to(q.dtype)
        return self.o((probs @ v).transpose(1, 2).reshape(b, s, a.heads * d))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        y = self.norm2(x)
        hidden = F.silu(self.gate(y)) * self.up(y) if self.a.activation == "swiglu" else \
            F.gelu(self.fc1(y), approximate="tanh")
        return x + self.fc2(hidden)


class Model(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.embed = nn.Embedding(a.vocab, a.hidden)
        self.pos = nn.Embedding(a.seq, a.hidden) if a.position == "learned" else None
        self.blocks = nn.ModuleList([Block(a) for _ in range(a.layers)])
        self.final = Norm(a.hidden, a.norm, a.norm_eps)
        self.head = None if a.tied else nn.Linear(a.hidden, a.vocab, bias=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos.weight[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        x = self.final(x)
        logits = x @ self.embed.weight.t() if self.head is None else self.head(x)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    for name in ("layers", "hidden", "heads", "kv-heads", "ffn", "vocab", "tied", "bias", "micro-batch", "seq",
                 "steps", "warmup", "threads"):
        p.add_argument("--" + name, type=int, required=True)
    for name in ("norm", "activation", "position", "precision"):
        p.add_argument("--" + name, required=True)
    p.add_argument("--attention", choices=("naive", "sdpa"), default="naive")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--compile", action="store_true")
    for name in ("norm-eps", "rope-theta"):
        p.add_argument("--" + name, type=float, required=True)
    a = p.parse_args()
    a.tied, a.bias = bool(a.tied), bool(a.bias)
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = Model(a)
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
    cuda = a.device == "cuda"
    model.to(a.device)
    step_model = torch.compile(model) if a.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=True if cuda else None)
    data = torch.randint(0, a.vocab, (64 * a.micro_batch * a.seq + 1,)).to(a.device)
    n = a.micro_batch * a.seq
    times = []
    warmup_start = time.perf_counter()
    for i in range(a.warmup + a.steps):
        w = data[(i % 64) * n: (i % 64) * n + n + 1]
        tokens, targets = w[:-1].view(a.micro_batch, a.seq), w[1:].view(a.micro_batch, a.seq)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = step_model(tokens, targets)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
        elif i == a.warmup - 1:
            print("WARMUP %.3f" % (time.perf_counter() - warmup_start))
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RESULT %.6f %d" % (statistics.median(times), peak))


if __name__ == "__main__":
    main()
