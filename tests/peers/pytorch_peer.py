"""PyTorch's own data parallelism as a peer of meshtrain's (issue 42): the same model, weights,
tokens and optimizer, trained by torch.distributed on CPU (Gloo), per-step loss and gradient norm.

  pytorch_peer.py MODE HF_DIR WINDOWS STEPS LR OUT [FIRST_STAGE_LAYERS]
      MODE: ddp (DistributedDataParallel), fsdp2 (fully_shard on every decoder layer, then the
      model), tp (DTensor tensor parallelism, parallelize_module with Colwise/RowwiseParallel:
      every rank trains the whole batch), sp (tp with sequence parallelism: SequenceParallel
      norms, the residual stream split by positions, the head's logits split by vocabulary into
      loss_parallel's cross-entropy), or gpipe / 1f1b (torch.distributed.pipelining: the model
      cut into 2 stages, one per rank, the batch in 2 micro-batches; the first stage holds
      FIRST_STAGE_LAYERS decoder layers, half of them by default). HF_DIR: the starting
      weights (`meshtrain ckpt export --format hf`), loaded with
      AutoModelForCausalLM (fp32, eager attention). WINDOWS: safetensors with "windows" (int64
      [global batch, seq + 1]), each step's global batch; rank r trains rows r x B/2 .. of it.
      Two ranks; AdamW (betas 0.9/0.95, eps 1e-8, no weight decay) at a constant LR, no clipping.
      The loss is each rank's mean token cross-entropy, averaged over ranks (the global mean:
      both ranks hold as many tokens); the gradient norm is the 2-norm over every parameter
      after the reduction, before the update. OUT: JSON {"loss": [...], "grad_norm": [...],
      "step_s": [...]} (rank 0's seconds per step).
"""
import faulthandler
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

WORLD = 2


class Stage(torch.nn.Module):
    """Pipeline stage `index` of 2 of transformers' Llama: the embedding and the first `split`
    decoder layers, or the rest, the final norm and the head. Rotary embeddings and the causal
    mask are made here (transformers' LlamaModel.forward makes them for its layers)."""

    def __init__(self, model, index, split):
        super().__init__()
        self.index = index
        self.embed = model.model.embed_tokens if index == 0 else None
        self.layers = torch.nn.ModuleList(model.model.layers[:split] if index == 0 else model.model.layers[split:])
        self.rotary = model.model.rotary_emb
        self.norm = model.model.norm if index == 1 else None
        self.head = model.lm_head if index == 1 else None

    def forward(self, x):
        h = self.embed(x) if self.index == 0 else x
        h = run_layers(self.rotary, self.layers, h, h.shape[1])
        return self.head(self.norm(h)) if self.index == 1 else h


def run_layers(rotary, layers, h, seq):
    """transformers' Llama decoder layers on h over `seq` positions (sequence parallelism's h holds
    a rank's share of them; the attention gathers all), with the rotary tables and causal mask
    that LlamaModel.forward would make from h's own length."""
    positions = torch.arange(seq).unsqueeze(0)
    tables = rotary(h, positions)
    mask = torch.full((seq, seq), float("-inf")).triu(1)[None, None]
    for layer in layers:
        h = layer(h, attention_mask=mask, position_ids=positions, position_embeddings=tables)
    return h


def sequence_parallel(model, mesh):
    """torchtitan's tensor + sequence parallel plan for Llama, on transformers' module names:
    between the column- and row-parallel pairs the activations are split by positions (Shard(1))
    and the norms run on them (SequenceParallel); each block's input is gathered before q, k, v
    and gate/up, and reduce-scattered after o and down; the head's logits stay split by
    vocabulary (Shard(-1)) for loss_parallel."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "model.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)}
    for i in range(len(model.model.layers)):
        layer = f"model.layers.{i}."
        plan[layer + "input_layernorm"] = SequenceParallel()
        plan[layer + "self_attn"] = PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                       desired_input_kwarg_layouts={"hidden_states": Replicate()})
        plan[layer + "post_attention_layernorm"] = SequenceParallel()
        plan[layer + "mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[layer + name] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[layer + name] = RowwiseParallel(output_layouts=Shard(1))
    parallelize_module(model, mesh, plan)

    def forward(input_ids):
        h = run_layers(model.model.rotary_emb, model.model.layers, model.model.embed_tokens(input_ids),
                       input_ids.shape[1])
        return model.lm_head(model.model.norm(h))
    return forward


def pipeline_worker(rank, mode, model, w, steps, lr, split):
    """torch.distributed.pipelining: 2 stages, one per rank, the global batch in 2 micro-batches."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    n = len(model.model.layers)
    split = n // 2 if split is None else split
    if not 1 <= split < n:
        sys.exit(f"FIRST_STAGE_LAYERS = {split}: each of the 2 stages needs a layer of the model's {n}")
    stage_module = Stage(model, rank, split)
    stage = PipelineStage(stage_module, rank, WORLD, torch.device("cpu"))
    micro = 2

    def loss_fn(logits, target):  # each micro-batch's mean; the schedule divides the gradients by micro
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    schedule = (ScheduleGPipe if mode == "gpipe" else Schedule1F1B)(stage, n_microbatches=micro, loss_fn=loss_fn)
    opt = torch.optim.AdamW(stage_module.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    losses, norms, seconds = [], [], []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            schedule.step(w[:, :-1].contiguous())
            loss = torch.zeros(())
        else:
            parts = []
            schedule.step(target=w[:, 1:].contiguous(), losses=parts)
            loss = sum(p.detach() for p in parts) / micro
        measuring = time.perf_counter()
        squares = sum(grad_square(p.grad) for p in stage_module.parameters() if p.grad is not None)
        both = torch.stack([loss.double(), squares])
        dist.all_reduce(both)
        losses.append(both[0].item())
        norms.append(both[1].sqrt().item())
        measured = time.perf_counter() - measuring  # the comparison's, not the training step's
        opt.step()
        seconds.append(time.perf_counter() - start - measured)
    return losses, norms, {"step_s": seconds}


def grad_square(grad):
    """A gradient's squared 2-norm, summed in float64 as meshtrain sums it (optim/adamw.cpp). Not
    torch.linalg.vector_norm in fp32, clip_grad_norm_'s: on the CPU it accumulates in fp32, 1.1e-5
    relative off at 1M elements and 2.7e-3 at 38.6M (the gpt2-124m shape's embedding), measured on
    torch 2.11 with one thread. A DTensor's over its shards."""
    square = torch.linalg.vector_norm(grad.double()) ** 2
    return square.full_tensor() if hasattr(square, "full_tensor") else square


def finish(rank, out, losses, norms, extra):
    """Rank 0 writes the results (with `extra`: its step times, "step_s", each from the step's
    start to after the optimizer's update); then both ranks leave together. The process ends with os._exit
    once the group is destroyed: torch 2.11's Gloo can abort a process in interpreter
    finalization ("terminate called without an active exception", pytorch/pytorch#190489 and the
    abandoned #179291). A 1F1B run aborted so once in CI, at a moment the log does not show (the
    faulthandler below prints it, should it happen again)."""
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"loss": losses, "grad_norm": norms, "torch": torch.__version__, **extra}, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def worker(rank, mode, hf_dir, windows, steps, lr, out, store, split):
    faulthandler.enable()  # a native abort prints every thread's Python stack
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True, dtype=torch.float32,
                                                 attn_implementation="eager").train()
    if mode in ("gpipe", "1f1b"):
        finish(rank, out, *pipeline_worker(rank, mode, model, load_file(windows)["windows"], steps, lr, split))
    if mode == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    elif mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        wrapped = model
    elif mode == "tp":
        # Megatron-style tensor parallelism through DTensor (torchtitan's plan for Llama): q, k, v,
        # gate, up split by output columns; o and down by input rows; the embedding by rows, the
        # head by columns, gathered.
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("cpu", (WORLD,))
        plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
                "lm_head": ColwiseParallel(output_layouts=Replicate())}
        for i in range(len(model.model.layers)):
            for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
                plan[f"model.layers.{i}.{name}"] = ColwiseParallel()
            for name in ("self_attn.o_proj", "mlp.down_proj"):
                plan[f"model.layers.{i}.{name}"] = RowwiseParallel()
        wrapped = parallelize_module(model, mesh, plan)
    elif mode == "sp":
        from torch.distributed.device_mesh import init_device_mesh
        forward = sequence_parallel(model, init_device_mesh("cpu", (WORLD,)))
        wrapped = model
    else:
        sys.exit(f"mode {mode!r}: use ddp, fsdp2, tp, sp, gpipe or 1f1b")
    opt = torch.optim.AdamW(wrapped.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                            foreach=False)  # tp: DTensor and plain parameters side by side
    w = load_file(windows)["windows"]
    per = w.shape[0] // WORLD
    tensor_parallel = mode in ("tp", "sp")
    mine = w if tensor_parallel else w[rank * per:(rank + 1) * per]  # tp, sp: every rank the whole batch
    losses, norms, seconds = [], [], []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if mode == "sp":
            from torch.distributed.tensor.parallel import loss_parallel
            with loss_parallel():  # the cross-entropy of vocabulary-split logits, and its backward
                loss = torch.nn.functional.cross_entropy(forward(mine[:, :-1]).flatten(0, 1), mine[:, 1:].flatten())
                loss.backward()
            loss = loss.full_tensor()
        else:
            logits = wrapped(input_ids=mine[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), mine[:, 1:].reshape(-1))
            loss.backward()
        measuring = time.perf_counter()
        # The 2-norm over the whole gradients (a DTensor's over its shards: a scalar all-reduce; tp's norm
        # weights are plain tensors).
        norm = sum(grad_square(p.grad) for p in wrapped.parameters()).sqrt()
        summed = loss.detach().clone()
        if not tensor_parallel:
            dist.all_reduce(summed)
            summed /= WORLD
        losses.append(summed.item())
        norms.append(norm.item())
        measured = time.perf_counter() - measuring  # the comparison's, not the training step's
        opt.step()
        seconds.append(time.perf_counter() - start - measured)
    finish(rank, out, losses, norms, {"step_s": seconds})


if __name__ == "__main__":
    if len(sys.argv) not in (7, 8):
        sys.exit(__doc__)
    mode, hf_dir, windows, steps, lr, out = sys.argv[1:7]
    split = int(sys.argv[7]) if len(sys.argv) == 8 else None
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(mode, hf_dir, windows, int(steps), float(lr), out, os.path.join(d, "store"), split),
                 nprocs=WORLD, join=True)
