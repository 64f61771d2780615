"""A checkpoint's config.json is read as transformers reads it, or refused, and the parameter count is exact."""

import itertools

import pytest

from s2sjax.model.families import from_hf_config
from s2sjax.model.config import ConfigError, ModelConfig
from s2sjax.model.decoder import abstract_params, param_count

import transformers

SMALL = dict(
  vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
  num_key_value_heads=2, rms_norm_eps=1e-6,
)


def _hf(config_class, **kwargs) -> dict:
  return config_class(**dict(SMALL, **kwargs)).to_dict()


def _without(cfg: dict, key: str) -> dict:
  cfg = {k: v for k, v in cfg.items() if k != key}
  if cfg.get("rope_parameters"):  # transformers v5 keeps partial_rotary_factor there
    cfg["rope_parameters"] = {k: v for k, v in cfg["rope_parameters"].items() if k != key}
  return cfg


@pytest.mark.parametrize("qkv_bias, o_bias, mlp_bias, tied", list(itertools.product([False, True], repeat=4)))
def test_num_params_counts_the_real_parameter_tree(qkv_bias, o_bias, mlp_bias, tied):
  config = ModelConfig(
    family="llama", vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
    head_dim=8, rope_theta=1e4, rotary_dim=8, rope_interleaved=False, rms_norm_eps=1e-6, qkv_bias=qkv_bias,
    o_bias=o_bias, mlp_bias=mlp_bias, tie_embeddings=tied,
  )
  assert config.num_params() == param_count(abstract_params(config))  # the tree init_params builds, by shape


def test_glm_reads_rotary_factor_and_bias_from_the_config_in_both_spellings():
  v5 = _hf(transformers.GlmConfig, head_dim=8, partial_rotary_factor=0.5, attention_bias=False)
  assert v5["rope_parameters"]["partial_rotary_factor"] == 0.5
  v4 = dict(_without(v5, "partial_rotary_factor"), partial_rotary_factor=0.5)
  for cfg in (v5, v4):
    config = from_hf_config(cfg)
    assert (config.rotary_dim, config.qkv_bias, config.o_bias) == (4, False, False)
  assert from_hf_config(dict(v5, attention_bias=True)).qkv_bias


@pytest.mark.parametrize("key", ["partial_rotary_factor", "attention_bias", "head_dim", "num_key_value_heads"])
def test_glm_config_lacking_an_architecture_key_is_refused(key):
  # GlmConfig would fill these in with glm-4-9b's values (0.5, True, 128, 2), which need not be this checkpoint's.
  cfg = _without(_hf(transformers.GlmConfig, head_dim=8), key)
  with pytest.raises(ConfigError, match=rf"config\.json has (none of \['{key}'\]|no {key})"):
    from_hf_config(cfg)


def test_qwen2_lacking_kv_heads_is_refused_as_transformers_would_assume_32():
  cfg = _without(_hf(transformers.Qwen2Config), "num_key_value_heads")
  assert transformers.Qwen2Config.from_dict(cfg).num_key_value_heads == 32
  with pytest.raises(ConfigError, match=r"config\.json has none of \['num_key_value_heads'\]"):
    from_hf_config(cfg)


def test_llama_keys_that_transformers_derives_are_derived_the_same_way():
  cfg = _without(_without(_hf(transformers.LlamaConfig), "num_key_value_heads"), "head_dim")
  for key in ("attention_bias", "mlp_bias", "tie_word_embeddings"):
    cfg = _without(cfg, key)
  reference, config = transformers.LlamaConfig.from_dict(cfg), from_hf_config(cfg)
  assert (config.num_kv_heads, config.head_dim, config.rotary_dim) == (reference.num_key_value_heads, 8, 8)
  assert (config.qkv_bias, config.o_bias) == (reference.attention_bias,) * 2
  assert (config.mlp_bias, config.tie_embeddings) == (reference.mlp_bias, reference.tie_word_embeddings)


@pytest.mark.parametrize("config_class", [transformers.LlamaConfig, transformers.Qwen2Config])
def test_partial_rotary_factor_is_refused_where_transformers_rotates_whole_heads(config_class):
  cfg = dict(_hf(config_class), partial_rotary_factor=0.5)
  with pytest.raises(ConfigError, match=r"partial_rotary_factor=0\.5 is not supported for model_type"):
    from_hf_config(cfg)
  assert from_hf_config(dict(cfg, partial_rotary_factor=1.0)).rotary_dim == 8


def test_chatglm_head_size_and_kv_groups_are_required():
  cfg = {
    "model_type": "chatglm", "padded_vocab_size": 96, "hidden_size": 32, "ffn_hidden_size": 48, "num_layers": 2,
    "num_attention_heads": 4, "kv_channels": 8, "multi_query_attention": True, "multi_query_group_num": 2,
    "layernorm_epsilon": 1e-6, "rmsnorm": True,
  }
  config = from_hf_config(cfg)
  assert (config.head_dim, config.num_kv_heads, config.rotary_dim) == (8, 2, 4)
  for key in ("kv_channels", "multi_query_group_num"):  # ChatGLMConfig's fallbacks are ChatGLM2-6B's 128 and 1
    with pytest.raises(ConfigError, match=rf"config\.json has none of \['{key}'\]"):
      from_hf_config(_without(cfg, key))
  assert from_hf_config(_without(dict(cfg, multi_query_attention=False), "multi_query_group_num")).num_kv_heads == 4
