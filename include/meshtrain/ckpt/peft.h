// LoRA adapters in peft's format (github.com/huggingface/peft): `meshtrain ckpt export --format
// peft` writes OUT/adapter_model.safetensors + OUT/adapter_config.json, which
// PeftModel.from_pretrained(base, OUT) loads on the base's Hugging Face export (ckpt/hf.h).
//
//   meshtrain (peft/lora.h)                 peft on LlamaForCausalLM
//   layers.L.attn.{q,k,v,o}.lora_a [r, in]   base_model.model.model.layers.L.self_attn.{q,k,v,o}_proj.lora_A.weight
//   layers.L.attn.{q,k,v,o}.lora_b [out, r]  ....lora_B.weight
//   layers.L.mlp.{gate,up,down}.lora_{a,b}   base_model.model.model.layers.L.mlp.{gate,up,down}_proj.lora_{A,B}.weight
//
// Both scale B A by lora_alpha / r (no rsLoRA), so the merged weights are meshtrain's merge.
// GPT-2's attention is one fused Conv1D (c_attn), where peft puts one adapter on q, k and v
// together: meshtrain's separate adapters are refused there with a message.
#pragma once

#include <string>

namespace meshtrain::ckpt {

// Throws std::runtime_error naming what is missing (no adapters, no "lora" settings, a GPT-2
// model); never overwrites without `force`.
void export_peft(const std::string& step_dir, const std::string& out_dir, bool force);

}  // namespace meshtrain::ckpt
