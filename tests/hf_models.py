"""Tiny random Hugging Face models, saved in the layouts users bring, for tests and benchmarks."""

from __future__ import annotations

import json
import os

import numpy as np
import torch
from transformers import GlmConfig, GlmForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from checkpoints_conversion import safetensors_io

SMALL = dict(
  vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
  num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
)


def tiny_model(family: str, tied: bool = False, seed: int = 0, **overrides):
  """A random transformers model of the family with weights big enough that errors show (std 0.1)."""
  torch.manual_seed(seed)
  kwargs = dict(SMALL, tie_word_embeddings=tied, initializer_range=0.1, **overrides)
  if family == "qwen2":
    model = Qwen2ForCausalLM(Qwen2Config(rope_theta=10000.0, **kwargs))
  elif family == "llama":
    model = LlamaForCausalLM(LlamaConfig(rope_theta=50000.0, **kwargs))
  elif family == "glm":
    model = GlmForCausalLM(GlmConfig(head_dim=16, rope_theta=10000.0, pad_token_id=0, **kwargs))
  else:
    raise ValueError(family)
  with torch.no_grad():  # non-trivial norm scales and biases, so a mis-mapped one cannot hide
    for name, param in model.named_parameters():
      if name.endswith(("norm.weight", "layernorm.weight", ".bias")):
        param.copy_(1.0 + 0.2 * torch.randn_like(param) if "norm" in name else 0.2 * torch.randn_like(param))
  return model.eval()


def save_hf(model, directory: str, **kwargs) -> str:
  model.save_pretrained(directory, **kwargs)
  return directory


def state_numpy(model) -> dict[str, np.ndarray]:
  return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def write_raw_checkpoint(directory: str, config: dict, tensors: dict[str, np.ndarray]) -> str:
  """A checkpoint directory in an arbitrary key layout (ChatGLM, Baichuan-Audio) with its config.json."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)
  safetensors_io.write(os.path.join(directory, "model.safetensors"), tensors)
  return directory


def torch_log_probs(model, ids: np.ndarray, **kwargs) -> np.ndarray:
  with torch.no_grad():
    out = model(torch.from_numpy(ids), **kwargs) if ids is not None else model(**kwargs)
  return torch.log_softmax(out.logits.float(), -1).numpy()
