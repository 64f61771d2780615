"""Llama (and SmolLM2, TinyLlama...): optional attention and MLP biases, whole-head rotate-half rope. Layout:
transformers' (`hf`), also read from GGUF, where llama.cpp stores the q/k rows permuted for its own rope."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from s2sjax.families import hf_config, keymap
from s2sjax.families.family import HF, Family, GgufLayout, HfExport, Layout
from s2sjax.families.registry import register
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


FAMILY = register(Family(
  name=NAME,
  layouts=(Layout(HF, ("llama",), parse_hf_config, keymap.rules_in(keymap.HF_NAMES),
                  ignored_suffixes=keymap.HF_IGNORED_SUFFIXES, verifiable=True),),
  audio_inputs=("codebook_tables", "extended_vocab"),
  export=HfExport("LlamaForCausalLM", HF, export_config),
  gguf=GgufLayout("llama", "llama", keymap.llama_cpp_to_hf_key, unpermute_gguf_qk),
))
