#!/usr/bin/python3
"""An independent reference for meshtrain's decoder (GPT-2 and Llama style).

Shares no code with meshtrain: written from the papers and the Hugging Face
models' definitions, in PyTorch eager, computing in float64 so that its own
rounding does not count against meshtrain's fp32.

  reference_model.py WEIGHTS INPUTS OUT

WEIGHTS: a `meshtrain ckpt export` file (safetensors; the model description is
the JSON in its metadata under "model"). INPUTS: safetensors with "tokens" and
"targets" (int64, [batch, seq]; targets < 0 are ignored). OUT: safetensors with
"logits" [batch, seq, vocab] and "loss" [batch, seq] (per-token cross-entropy,
0 where ignored), float64.

Conventions checked (each is a choice a model can get wrong):
  - attention: softmax(q k^T / sqrt(d) + causal mask) v, per head;
  - GQA: query head j reads kv head j // (heads / kv_heads) (consecutive query
    heads share a kv head, as Llama's repeat_kv);
  - RoPE (Su et al., arXiv 2104.09864) in the "rotate half" layout of GPT-NeoX
    and Hugging Face Llama: dimension i pairs with i + d/2, angle p * theta^(-2i/d);
  - GELU in GPT-2's tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
    SwiGLU: down(silu(gate x) * up x) (Shazeer, arXiv 2002.05202);
  - LayerNorm with biased variance; RMSNorm x / sqrt(mean(x^2) + eps) * w
    (Zhang & Sennrich, arXiv 1910.07467);
  - pre-norm residual blocks, a final norm, the head tied to the embedding or not;
  - the vocabulary is the model's own (no padding rows take part in the softmax).
"""
import json
import math
import struct
import sys

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=DTYPES[e["dtype"]]) if end > b else \
            torch.empty(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out, meta


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        b = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


class Reference:
    def __init__(self, weights, cfg):
        self.w = {k: v.to(torch.float64) for k, v in weights.items()}
        self.cfg = cfg
        self.heads, self.kv_heads = cfg["heads"], cfg["kv_heads"]
        self.d = cfg["hidden"] // cfg["heads"]

    def linear(self, x, name):
        y = x @ self.w[name + ".weight"].t()
        bias = self.w.get(name + ".bias")
        return y if bias is None else y + bias

    def norm(self, x, name):
        eps = self.cfg["norm_eps"]
        if self.cfg["norm"] == "rmsnorm":
            return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * self.w[name + ".weight"]
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def rope(self, x):  # x [b, heads, s, d]
        s, d = x.shape[2], x.shape[3]
        inv_freq = 1.0 / self.cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        angle = torch.arange(s, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [s, d/2]
        cos, sin = torch.cos(angle), torch.sin(angle)
        x1, x2 = x[..., :d // 2], x[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def attention(self, x, p):
        b, s, _ = x.shape
        q = self.linear(x, p + "attn.q").view(b, s, self.heads, self.d).transpose(1, 2)
        k = self.linear(x, p + "attn.k").view(b, s, self.kv_heads, self.d).transpose(1, 2)
        v = self.linear(x, p + "attn.v").view(b, s, self.kv_heads, self.d).transpose(1, 2)
        if self.cfg["position"] == "rope":
            q, k = self.rope(q), self.rope(k)
        kv_of = torch.arange(self.heads) // (self.heads // self.kv_heads)
        k, v = k[:, kv_of], v[:, kv_of]
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        future = torch.ones(s, s, dtype=torch.bool).triu(1)
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), -1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, self.heads * self.d)
        return self.linear(ctx, p + "attn.o")

    def mlp(self, x, p):
        if self.cfg["activation"] == "swiglu":
            g = self.linear(x, p + "mlp.gate")
            return self.linear(g * torch.sigmoid(g) * self.linear(x, p + "mlp.up"), p + "mlp.down")
        u = self.linear(x, p + "mlp.fc1")
        gelu = 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))
        return self.linear(gelu, p + "mlp.fc2")

    def logits(self, tokens):
        emb = self.w["embed.weight"]
        x = emb[tokens]
        if self.cfg["position"] == "learned":
            x = x + self.w["pos.weight"][: tokens.shape[1]]
        for i in range(self.cfg["layers"]):
            p = "layers.%d." % i
            x = x + self.attention(self.norm(x, p + "norm1"), p)
            x = x + self.mlp(self.norm(x, p + "norm2"), p)
        x = self.norm(x, "final_norm")
        head = emb if self.cfg["tied"] else self.w["head.weight"]
        return x @ head.t()


def main():
    weights, meta = read_safetensors(sys.argv[1])
    inputs, _ = read_safetensors(sys.argv[2])
    cfg = json.loads(meta["model"])
    model = Reference(weights, cfg)
    for name, t in model.w.items():
        if name in ("embed.weight", "head.weight") and t.shape[0] != cfg["vocab"]:
            sys.exit("%s has %d rows, the model's vocabulary is %d" % (name, t.shape[0], cfg["vocab"]))
    with torch.no_grad():
        logits = model.logits(inputs["tokens"])
        targets = inputs["targets"]
        keep = targets >= 0
        logp = torch.log_softmax(logits, -1)
        loss = -logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * keep
    write_safetensors(sys.argv[3], {"logits": logits, "loss": loss})


if __name__ == "__main__":
    main()
