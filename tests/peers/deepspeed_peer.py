"""DeepSpeed's ZeRO as a peer of meshtrain's (issue 42): the same model, weights, tokens and
optimizer, trained by DeepSpeed on CPU (DS_ACCELERATOR=cpu, Gloo), per-step loss and gradient norm.

  deepspeed_peer.py STAGE HF_DIR WINDOWS STEPS LR OUT
      STAGE: zero1, zero2 or zero3 (DeepSpeed's zero_optimization.stage 1, 2, 3). HF_DIR,
      WINDOWS, STEPS, LR, OUT as pytorch_peer.py takes them: two ranks, rank r trains rows
      r x B/2 .. of each step's global batch; AdamW (torch's, "torch_adam": DeepSpeed's own CPU
      Adam is a C++ extension it would compile) with betas 0.9/0.95, eps 1e-8, no weight decay, a
      constant LR, no clipping, fp32. The loss is the ranks' mean of their mean token
      cross-entropy; the gradient norm is DeepSpeed's own (engine.get_global_grad_norm(): the
      2-norm of the reduced gradients before the update).
"""
import faulthandler
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from pytorch_peer import WORLD, finish  # noqa: E402


def worker(rank, stage, hf_dir, windows, steps, lr, out, store):
    faulthandler.enable()
    import deepspeed
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD))
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)  # adopts the group above
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True, dtype=torch.float32,
                                                 attn_implementation="eager").train()
    w = load_file(windows)["windows"]
    per = w.shape[0] // WORLD
    config = {
        "train_batch_size": w.shape[0], "train_micro_batch_size_per_gpu": per, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0,
                                                  "torch_adam": True}},
        "zero_optimization": {"stage": int(stage[-1])},
        "gradient_clipping": 0.0, "fp16": {"enabled": False}, "bf16": {"enabled": False},
        "steps_per_print": 1 << 30, "wall_clock_breakdown": False,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    mine = w[rank * per:(rank + 1) * per]
    losses, norms, seconds = [], [], []
    for _ in range(steps):
        start = time.perf_counter()
        logits = engine(input_ids=mine[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), mine[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
        summed = loss.detach().clone()
        dist.all_reduce(summed)
        losses.append(summed.item() / WORLD)
        norms.append(float(engine.get_global_grad_norm()))
        seconds.append(time.perf_counter() - start)
    finish(rank, out, losses, norms, {"step_s": seconds, "deepspeed": deepspeed.__version__})


if __name__ == "__main__":
    if len(sys.argv) != 7 or sys.argv[1] not in ("zero1", "zero2", "zero3"):
        sys.exit(__doc__)
    stage, hf_dir, windows, steps, lr, out = sys.argv[1:]
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(stage, hf_dir, windows, int(steps), float(lr), out, os.path.join(d, "store")),
                 nprocs=WORLD, join=True)
