"""Llama (and SmolLM2, TinyLlama...): optional attention and MLP biases, whole-head rotate-half rope. Layout:
transformers' (`hf`), also read from GGUF, where llama.cpp stores the q/k rows permuted for its own rope."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from s2sjax.model.families import hf_config, keymap
from s2sjax.model.families.family import HF, Family, GgufLayout, HfExport, Layout
from s2sjax.model.families.registry import register
from s2sjax.model.config import ModelConfig

NAME = "llama"


def parse_hf_config(cfg: Mapping[str, Any]) -> ModelConfig:
  # LlamaConfig derives head_dim and the kv heads when absent; so do we.
  head_dim = hf_config.derived_head_dim(cfg)
  kv_heads = "num_key_value_heads" if cfg.get("num_key_value_heads") is not None else "num_attention_heads"
  fields = hf_config.decoder_fields(
    cfg, head_dim=head_dim, num_kv_heads=hf_config.number(cfg, kv_heads),
    rotary_dim=hf_config.whole_head_rotary_dim(cfg, head_dim),
  )
  bias = bool(cfg.get("attention_bias", False))
  with hf_config.named_by():
    return ModelConfig(family=NAME, rope_interleaved=False, qkv_bias=bias, o_bias=bias,
                       mlp_bias=bool(cfg.get("mlp_bias", False)), **fields)


def export_config(config: ModelConfig) -> dict[str, Any]:
  return dict(hf_config.export_fields(config), model_type="llama", attention_bias=config.qkv_bias,
              mlp_bias=config.mlp_bias)


def unpermute_gguf_qk(hf_key: str, array: np.ndarray, cfg: Mapping[str, Any]) -> np.ndarray:
  """llama.cpp interleaves each head's q/k rows for its rope; put them back exactly as transformers' GGUF loader
  does."""
  if ".q_proj." not in hf_key and ".k_proj." not in hf_key:
    return array
  heads = cfg["num_attention_heads" if ".q_proj." in hf_key else "num_key_value_heads"]
  pairs = array.reshape(heads, array.shape[0] // heads // 2, 2, *array.shape[1:])
  return pairs.swapaxes(1, 2).reshape(array.shape)


def _llama_mimi(hidden: int, intermediate: int, layers: int, tied: bool) -> dict:
  """Llama-Mimi (llm-jp/Llama-Mimi): Llama-3.x with Mimi's 2,048 codes x 4 quantizers as `<{code}_{q}>` tokens and
  `<audio>`, `</audio>` appended to its 128,256 (torchtitan/train.py expand_tokenizer_with_unit_tokens;
  config/llama3_2_1b.toml num_quantizers = 4). Sizes only: the releases' llama3 rope scaling changes none."""
  return dict(model_type="llama", hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
              num_attention_heads=32, num_key_value_heads=8, vocab_size=128256 + 2048 * 4 + 2,
              tie_word_embeddings=tied, rope_theta=500000.0, rms_norm_eps=1e-5)


FAMILY = register(Family(
  name=NAME,
  layouts=(Layout(HF, ("llama",), parse_hf_config, keymap.rules_in(keymap.HF_NAMES),
                  ignored_suffixes=keymap.HF_IGNORED_SUFFIXES, verifiable=True),),
  audio_inputs=("codebook_tables", "extended_vocab"),
  export=HfExport("LlamaForCausalLM", HF, export_config),
  gguf=GgufLayout("llama", "llama", keymap.llama_cpp_to_hf_key, unpermute_gguf_qk),
  planner_shapes={
    "llama-mimi-1.3b": _llama_mimi(2048, 8192, 16, True),  # Llama-3.2-1B's sizes
    "llama-mimi-8b": _llama_mimi(4096, 14336, 32, False),  # Llama-3.1-8B's sizes
  },
))
