"""Hugging Face transformers as a peer of meshtrain's export and import (issue 42).

  transformers_peer.py logits HF_DIR INPUTS OUT
      Loads HF_DIR (what `meshtrain ckpt export --format hf` writes) as transformers loads any
      model: AutoModelForCausalLM.from_pretrained(dir, local_files_only=True, dtype=float32,
      attn_implementation="eager"). INPUTS: safetensors with "tokens" (int64 [batch, seq]).
      OUT: safetensors with "logits" (float32 [batch, seq, vocab]).

  transformers_peer.py save FAMILY OUT_DIR
      A randomly initialised model of FAMILY (gpt2, or llama: GQA 4 query heads on 2 kv heads,
      untied head, rotary base 500000 as Llama 3 has it; or mixtral: as llama, with 4 experts of
      which each token takes 2, saved in shards of 200 kB with model.safetensors.index.json, as
      large models are) written by save_pretrained: the layout and config.json transformers
      itself writes, for `meshtrain ckpt import`.

  transformers_peer.py generate HF_DIR PROMPT NEW TEXT...
      The export as a user meets it: AutoTokenizer.from_pretrained(dir) and
      pipeline("text-generation", dir) (greedy, NEW new tokens at most, stopping at the end of
      sequence). Prints one JSON line: the tokenizer's class, its bos/eos ids, the ids of each
      TEXT, the generated ids decoded as one text (the prompt included), and the pipeline's own
      text (transformers 5 decodes the new ids alone and appends them to the prompt, so a
      SentencePiece word's leading space at the join is dropped).

  transformers_peer.py peft BASE_HF ADAPTERS MERGED_HF INPUTS
      peft on meshtrain's files: PeftModel.from_pretrained(BASE_HF's model, ADAPTERS) (what
      `ckpt export --format peft` writes) against MERGED_HF (meshtrain's own merge, exported with
      --format hf). Prints one JSON line: how many LoRA modules peft loaded, the largest relative
      difference of its logits (adapters unmerged) from MERGED_HF's on INPUTS' tokens, and of
      its merge_and_unload() weights from MERGED_HF's.
"""
import json
import sys

import torch
from safetensors.torch import load_file, save_file
import transformers
from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MixtralConfig, MixtralForCausalLM)


def logits(hf_dir, inputs, out):
    model = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    tokens = load_file(inputs)["tokens"]
    with torch.no_grad():
        result = model(input_ids=tokens).logits
    save_file({"logits": result.contiguous()}, out)
    print(f"transformers {transformers.__version__}: {type(model).__name__} logits {tuple(result.shape)}")


def save(family, out_dir):
    torch.manual_seed(5)
    if family == "gpt2":
        config = GPT2Config(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4, n_inner=128)
        model = GPT2LMHeadModel(config)
    elif family == "llama":
        config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             rope_theta=500000.0, tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
    elif family == "mixtral":
        config = MixtralConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                               num_local_experts=4, num_experts_per_tok=2, rope_theta=500000.0,
                               tie_word_embeddings=False)
        model = MixtralForCausalLM(config)
    else:
        sys.exit(f"family {family!r}: use gpt2, llama or mixtral")
    # Weights of a trained model's size everywhere (the initialiser's zeros would hide a swapped bias).
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size="200KB" if family == "mixtral" else "5GB")
    print(f"transformers {transformers.__version__}: {type(model).__name__} saved in {out_dir}")


def generate(hf_dir, prompt, new, *texts):
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    generator = transformers.pipeline("text-generation", model=hf_dir, tokenizer=tokenizer, dtype=torch.float32)
    ids = generator(prompt, max_new_tokens=int(new), do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    text = generator(prompt, max_new_tokens=int(new), do_sample=False)[0]["generated_text"]
    print(json.dumps({"class": type(tokenizer).__name__, "bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id,
                      "ids": [tokenizer.encode(t) for t in texts], "generated": tokenizer.decode(ids, skip_special_tokens=True),
                      "pipeline_text": text}))


def peft_check(base_hf, adapters, merged_hf, inputs):
    from peft import PeftModel

    def load(d):
        return AutoModelForCausalLM.from_pretrained(d, local_files_only=True, dtype=torch.float32,
                                                    attn_implementation="eager").eval()

    def rel(a, b):
        return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()

    model = PeftModel.from_pretrained(load(base_hf), adapters).eval()
    modules = sum(1 for n, _ in model.named_modules() if n.endswith(".lora_A"))
    ours = load(merged_hf)
    tokens = load_file(inputs)["tokens"]
    with torch.no_grad():
        logits = rel(model(input_ids=tokens).logits, ours(input_ids=tokens).logits)
    merged = model.merge_and_unload().state_dict()
    weights = max(rel(merged[k], v) for k, v in ours.state_dict().items() if v.abs().max() > 0)
    print(json.dumps({"modules": modules, "logits": logits, "weights": weights}))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "logits":
        logits(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "save":
        save(*sys.argv[2:])
    elif len(sys.argv) == 6 and sys.argv[1] == "peft":
        peft_check(*sys.argv[2:])
    elif len(sys.argv) >= 5 and sys.argv[1] == "generate":
        generate(*sys.argv[2:])
    else:
        sys.exit(__doc__)
