"""GLM-4 (GLM-4-Voice): q/k/v biases, interleaved-pair rope over part of each head, fused gate/up MLP. Layouts:
transformers' `Glm` (`hf`) and THUDM's ChatGLM files (`chatglm`: fused `query_key_value`, `dense_h_to_4h`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from s2sjax.model.families import hf_config, keymap
from s2sjax.model.families.family import HF, Family, Layout
from s2sjax.model.families.registry import register
from s2sjax.model.config import ConfigError, ModelConfig

NAME = "glm4"


def parse_hf_config(cfg: Mapping[str, Any]) -> ModelConfig:
  # GlmConfig falls back to glm-4-9b's head_dim, kv heads, attention_bias and partial_rotary_factor: one model's
  # values, not the checkpoint's, so all four are required.
  head_dim = hf_config.number(cfg, "head_dim")
  _, factor = hf_config.rope(cfg)
  if factor is None:
    raise ConfigError("config.json has no partial_rotary_factor (top level or in rope_parameters)")
  fields = hf_config.decoder_fields(
    cfg, head_dim=head_dim, num_kv_heads=hf_config.number(cfg, "num_key_value_heads"),
    rotary_dim=int(head_dim * factor),
  )
  bias = bool(hf_config.require(cfg, "attention_bias"))
  with hf_config.named_by():
    return ModelConfig(family=NAME, rope_interleaved=True, qkv_bias=bias, o_bias=False, mlp_bias=False, **fields)


# ModelConfig field -> ChatGLM's config.json key
CHATGLM_KEYS = {"vocab_size": "padded_vocab_size", "hidden_size": "hidden_size", "intermediate_size": "ffn_hidden_size",
                "num_layers": "num_layers", "num_heads": "num_attention_heads", "num_kv_heads": "multi_query_group_num",
                "head_dim": "kv_channels", "rope_theta": "rope_ratio (x 10,000)", "rms_norm_eps": "layernorm_epsilon"}


def parse_chatglm_config(cfg: Mapping[str, Any]) -> ModelConfig:
  number = hf_config.number
  if not cfg.get("rmsnorm", True) or cfg.get("apply_residual_connection_post_layernorm"):
    raise ConfigError("only ChatGLM configs with rmsnorm=true and pre-norm residuals (GLM-4) are supported")
  if cfg.get("add_bias_linear"):
    raise ConfigError("ChatGLM add_bias_linear=true is not supported (GLM-4 has no dense biases)")
  if cfg.get("original_rope") is False:
    raise ConfigError("ChatGLM original_rope=false (non-interleaved GLM rope) is not supported")
  if cfg.get("post_layer_norm") is False:
    raise ConfigError("ChatGLM post_layer_norm=false (no final layernorm) is not supported")
  heads = number(cfg, "num_attention_heads")
  # ChatGLMConfig falls back to ChatGLM2-6B's kv_channels=128 and multi_query_group_num=1: required instead.
  head_dim = number(cfg, "kv_channels")
  # modeling_chatglm.py: RotaryEmbedding(head_dim // 2) with base 10000 * rope_ratio, interleaved pairs.
  with hf_config.named_by(CHATGLM_KEYS):
    return ModelConfig(
      family=NAME,
      vocab_size=number(cfg, "padded_vocab_size", "vocab_size"),
      hidden_size=number(cfg, "hidden_size"),
      intermediate_size=number(cfg, "ffn_hidden_size"),
      num_layers=number(cfg, "num_layers"),
      num_heads=heads,
      num_kv_heads=number(cfg, "multi_query_group_num") if cfg.get("multi_query_attention") else heads,
      head_dim=head_dim,
      rope_theta=10000.0 * float(number({"rope_ratio": 1.0, **cfg}, "rope_ratio")),
      rotary_dim=head_dim // 2,
      rope_interleaved=True,
      rms_norm_eps=float(number(cfg, "layernorm_epsilon")),
      qkv_bias=bool(cfg.get("add_qkv_bias", False)),
      o_bias=False,
      mlp_bias=False,
      tie_embeddings=False,
    )


HF_NAMES = dataclasses.replace(keymap.HF_NAMES, gate=None, up=None, gate_up="model.layers.{i}.mlp.gate_up_proj")
CHATGLM_NAMES = keymap.KeyNames(
  embed="transformer.embedding.word_embeddings",
  final_norm="transformer.encoder.final_layernorm",
  lm_head="transformer.output_layer",
  attn_norm="transformer.encoder.layers.{i}.input_layernorm",
  mlp_norm="transformer.encoder.layers.{i}.post_attention_layernorm",
  qkv="transformer.encoder.layers.{i}.self_attention.query_key_value",
  o="transformer.encoder.layers.{i}.self_attention.dense",
  gate_up="transformer.encoder.layers.{i}.mlp.dense_h_to_4h",
  down="transformer.encoder.layers.{i}.mlp.dense_4h_to_h",
)
# modeling_chatglm.py's SelfAttention.forward: with multi_query_attention the fused output splits as [q | k | v];
# without, it is viewed as [heads, 3 * head_dim] and each head's slice splits into its q, k and v.
CHATGLM_PER_HEAD_NAMES = dataclasses.replace(CHATGLM_NAMES, qkv_per_head=True)


def chatglm_rules(config: ModelConfig, cfg: Mapping[str, Any]) -> list[keymap.Rule]:
  names = CHATGLM_NAMES if cfg.get("multi_query_attention") else CHATGLM_PER_HEAD_NAMES
  return keymap.decoder_rules(config, names)


# THUDM/glm-4-9b's config.json sizes
GLM_4_9B = dict(model_type="chatglm", padded_vocab_size=151552, hidden_size=4096, ffn_hidden_size=13696, num_layers=40,
                num_attention_heads=32, kv_channels=128, multi_query_attention=True, multi_query_group_num=2,
                layernorm_epsilon=1.5625e-07, add_qkv_bias=True)

FAMILY = register(Family(
  name=NAME,
  layouts=(
    Layout(HF, ("glm",), parse_hf_config, keymap.rules_in(HF_NAMES), ignored_suffixes=keymap.HF_IGNORED_SUFFIXES,
           verifiable=True),
    # Its PyTorch model is THUDM's remote code, so --verify cannot run it.
    Layout("chatglm", ("chatglm",), parse_chatglm_config, chatglm_rules,
           ignored_suffixes=("rotary_pos_emb.inv_freq",)),
  ),
  audio_inputs=("extended_vocab",),
  planner_shapes={
    "glm-4-9b": GLM_4_9B,
    # THUDM/glm-4-voice-9b's config.json: glm-4-9b's decoder with a vocabulary widened for its 16,384 speech
    # tokens, a smaller epsilon, rope_ratio 1 (theta 10,000)
    "glm-4-voice-9b": dict(GLM_4_9B, padded_vocab_size=168960, layernorm_epsilon=3.90625e-08, rope_ratio=1),
  },
))
