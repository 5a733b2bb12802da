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

  trl_peer.py grpo POLICY_HF REF_HF INPUTS OUT
      trl's GRPOTrainer loss on fixed rollouts: INPUTS is safetensors with "tokens" (int64 [R, P + C]:
      every row's prompt of P tokens, then its completion, right-padded), "mask" (float [R, C]: 1
      on generated tokens), "old_logp" ([R, C]: the sampling policy's log-probabilities) and
      "advantages" ([R]). For each loss type (grpo, bnpo, dr_grpo, dapo) and KL setting (beta 0;
      beta 0.04 with use_bias_correction_kl False, "0.04", and True, trl's default, "0.04 ratio"),
      GRPOTrainer._compute_loss on those inputs (epsilon 0.2 / 0.28, temperature 1,
      max_completion_length C, the reference's log-probabilities computed by trl from REF_HF's
      weights), then backward. OUT: JSON {"LOSS SETTING": {"loss", "grad_norm"}}.
"""
import json
import sys
import tempfile

import torch
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from safetensors.torch import load_file
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer

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


def grpo(policy_hf, ref_hf, inputs, out):
    def load(d):
        return AutoModelForCausalLM.from_pretrained(d, local_files_only=True, dtype=torch.float32,
                                                    attn_implementation="eager")

    x = load_file(inputs)
    completion = x["mask"].shape[1]
    prompt = x["tokens"].shape[1] - completion
    rows = x["tokens"].shape[0]
    model, ref = load(policy_hf).train(), load(ref_hf).eval()
    tokenizer = AutoTokenizer.from_pretrained(policy_hf, local_files_only=True)
    result = {}
    for loss in ("grpo", "bnpo", "dr_grpo", "dapo"):
        for beta, ratio, setting in ((0.0, False, "0"), (0.04, False, "0.04"), (0.04, True, "0.04 ratio")):
            with tempfile.TemporaryDirectory() as d:
                args = GRPOConfig(output_dir=d, loss_type=loss, beta=beta, use_bias_correction_kl=ratio,
                                  epsilon=0.2, epsilon_high=0.28,
                                  temperature=1.0, max_completion_length=completion, num_generations=2,
                                  per_device_train_batch_size=rows, gradient_accumulation_steps=1, report_to=[],
                                  use_cpu=True, bf16=False, fp16=False, disable_dropout=True)
                trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                                      args=args, train_dataset=Dataset.from_list([{"prompt": "x"}] * rows),
                                      processing_class=tokenizer)
            trainer.current_gradient_accumulation_steps = 1
            ids = x["tokens"]
            mask = x["mask"]
            attention = torch.cat([torch.ones(rows, prompt, dtype=torch.long), mask.long()], dim=1)
            batch = {"prompt_ids": ids[:, :prompt], "prompt_mask": attention[:, :prompt],
                     "completion_ids": ids[:, prompt:], "completion_mask": mask.long(),
                     "old_per_token_logps": x["old_logp"], "advantages": x["advantages"],
                     "num_items_in_batch": mask.sum()}
            if beta:  # trl builds its reference from the policy's directory: REF_HF's weights put in it
                trainer.ref_model.load_state_dict(ref.state_dict())
                with torch.no_grad():
                    batch["ref_per_token_logps"], _, _ = trainer._get_per_token_logps_and_entropies(
                        trainer.ref_model, ids, attention, completion)
            model.zero_grad(set_to_none=True)
            value = trainer._compute_loss(trainer.model, batch)
            value.backward()
            norm = sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None).sqrt()
            result[f"{loss} {setting}"] = {"loss": value.item(), "grad_norm": norm.item()}
    result["trl"] = trl.__version__
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    if len(sys.argv) == 9 and sys.argv[1] == "dpo":
        dpo(*sys.argv[2:])
    elif len(sys.argv) == 6 and sys.argv[1] == "grpo":
        grpo(*sys.argv[2:])
    else:
        sys.exit(__doc__)
