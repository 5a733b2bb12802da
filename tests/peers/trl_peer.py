"""trl as a peer of meshtrain's preference training (issue 42).

  trl_peer.py dpo HF_DIR PAIRS STEPS LR BETA LOSS OUT
      trl's DPOTrainer on meshtrain's files: HF_DIR is a `meshtrain ckpt export --format hf
      --tokenizer` directory (the policy, and a frozen copy of it the reference); PAIRS is JSON,
      a list of {"prompt_ids", "chosen_ids", "rejected_ids"}: the token ids meshtrain's
      `tokenize prefs` wrote (the chat template's rendering, the trained answer tokens apart),
      given to trl as they are (its own tokenization of text is bypassed: _prepare_dataset
      returns the ids, which is what it would have produced from the same text and template).
      Every step trains on all pairs (one batch; their order within it changes nothing of a mean),
      AdamW (0.9, 0.95, 1e-8, no weight decay) at a constant LR, no clipping (max_grad_norm huge,
      so that the Trainer still logs the norm), fp32, dropout off, loss_type LOSS (sigmoid or
      hinge), beta BETA. OUT: JSON, per step: loss, grad_norm, rewards/chosen, rewards/rejected,
      rewards/margins, rewards/accuracies, as trl logs them.
"""
import json
import sys
import tempfile

import torch
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer

KEYS = ("loss", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")


class PreTokenized(DPOTrainer):
    """DPOTrainer on token ids given as they are (trl's text preparation left out)."""

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        return dataset


def dpo(hf_dir, pairs, steps, lr, beta, loss, out):
    torch.manual_seed(0)
    rows = json.load(open(pairs))
    model = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True, dtype=torch.float32,
                                                 attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    with tempfile.TemporaryDirectory() as d:
        args = DPOConfig(output_dir=d, per_device_train_batch_size=len(rows), gradient_accumulation_steps=1,
                         max_steps=int(steps), learning_rate=float(lr), lr_scheduler_type="constant", warmup_steps=0,
                         weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8, optim="adamw_torch",
                         max_grad_norm=1e30, logging_steps=1, save_strategy="no", report_to=[], beta=float(beta),
                         loss_type=[loss], max_length=None, bf16=False, fp16=False, use_cpu=True, seed=0,
                         disable_dropout=True, dataloader_num_workers=0)
        trainer = PreTokenized(model=model, args=args, train_dataset=Dataset.from_list(rows),
                               processing_class=tokenizer)
        trainer.train()
        logs = [e for e in trainer.state.log_history if "rewards/chosen" in e]
    result = {k: [e[k] for e in logs] for k in KEYS}
    result["trl"] = trl.__version__
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    if len(sys.argv) == 9 and sys.argv[1] == "dpo":
        dpo(*sys.argv[2:])
    else:
        sys.exit(__doc__)
