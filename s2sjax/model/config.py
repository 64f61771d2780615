"""The decoder's architecture, read from a checkpoint's own `config.json`.

Every switch (biases, rope theta and layout, norm eps, tied head) comes from the checkpoint; nothing is defaulted
silently. Hugging Face (`qwen2`, `llama`, `glm`) and THUDM ChatGLM (`chatglm`, GLM-4 / GLM-4-Voice) configs are
understood, in both the transformers v4 (top-level `rope_theta`) and v5 (`rope_parameters`) spellings.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

FAMILIES = ("qwen2", "llama", "glm4")


class ConfigError(ValueError):
  """A config.json this project cannot turn into a decoder."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of one decoder; hashable, so it can be a static argument of `jax.jit`."""

  family: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float
  rotary_dim: int  # leading dims of each head that are rotated; the rest pass through (GLM-4: head_dim / 2)
  rope_interleaved: bool  # rotate (x0, x1), (x2, x3)... (GLM-4) instead of the two halves (Qwen2, Llama)
  rms_norm_eps: float
  qkv_bias: bool
  o_bias: bool
  mlp_bias: bool
  tie_embeddings: bool
  # Audio inputs in `codebook_tables` mode (Baichuan-Audio): one embedding table per codebook, summed at the
  # positions of `audio_placeholder_id`. Empty for text-only and `extended_vocab` models.
  audio_codebook_sizes: tuple[int, ...] = ()
  audio_placeholder_id: int | None = None

  def __post_init__(self):
    if self.family not in FAMILIES:
      raise ConfigError(f"unknown family {self.family!r}; supported: {', '.join(FAMILIES)}")
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
      raise ConfigError(f"rotary_dim={self.rotary_dim} must be even and in (0, head_dim={self.head_dim}]")
    if self.audio_codebook_sizes and self.audio_placeholder_id is None:
      raise ConfigError("audio_codebook_sizes given without audio_placeholder_id")

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "ModelConfig":
    fields = json.loads(text)
    fields["audio_codebook_sizes"] = tuple(fields.get("audio_codebook_sizes", ()))
    unknown = set(fields) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ConfigError(f"unknown ModelConfig keys: {sorted(unknown)}")
    return cls(**fields)

  def num_params(self) -> int:
    """Parameter count of the text decoder (audio tables and heads excluded)."""
    d, f, h, kv, hd = self.hidden_size, self.intermediate_size, self.num_heads, self.num_kv_heads, self.head_dim
    attn = d * hd * (2 * h + 2 * kv) + (hd * (h + 2 * kv) if self.qkv_bias else 0) + (d if self.o_bias else 0)
    mlp = 3 * d * f + (2 * f + d if self.mlp_bias else 0)
    layer = attn + mlp + 2 * d
    head = 0 if self.tie_embeddings else self.vocab_size * d
    return self.vocab_size * d + self.num_layers * layer + d + head


def _require(cfg: Mapping[str, Any], *keys: str) -> Any:
  for key in keys:
    if key in cfg and cfg[key] is not None:
      return cfg[key]
  raise ConfigError(f"config.json has none of {list(keys)}")


def _rope(cfg: Mapping[str, Any]) -> tuple[float, float | None]:
  """(theta, partial_rotary_factor or None) from either transformers v4 or v5 spelling; rejects scaled ropes."""
  params = dict(cfg.get("rope_parameters") or {})
  scaling = cfg.get("rope_scaling") or {}
  rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
  if rope_type != "default":
    raise ConfigError(f"rope_type {rope_type!r} is not supported (only unscaled 'default' rope)")
  theta = params.get("rope_theta", cfg.get("rope_theta"))
  if theta is None:
    raise ConfigError("config.json gives no rope_theta")
  factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
  return float(theta), None if factor is None else float(factor)


def from_hf_config(cfg: Mapping[str, Any]) -> ModelConfig:
  """Builds a ModelConfig from a parsed Hugging Face / ChatGLM `config.json`."""
  model_type = cfg.get("model_type")
  if model_type == "chatglm":
    return _from_chatglm(cfg)
  if model_type == "omni":
    return _from_baichuan_audio(cfg)
  if model_type not in ("qwen2", "llama", "glm"):
    raise ConfigError(
      f"unsupported model_type {model_type!r}; supported: qwen2, llama, glm, chatglm (GLM-4 / GLM-4-Voice), "
      "omni (Baichuan-Audio)"
    )
  hidden = _require(cfg, "hidden_size")
  heads = _require(cfg, "num_attention_heads")
  theta, factor = _rope(cfg)
  # A key may be absent only where transformers derives it from the others (LlamaConfig: head_dim and kv heads;
  # Qwen2: head_dim). Qwen2Config's fallback of 32 kv heads and GlmConfig's of glm-4-9b's head_dim, kv heads,
  # attention_bias and partial_rotary_factor are one model's values, not the checkpoint's, so those are required.
  head_dim = _require(cfg, "head_dim") if model_type == "glm" else cfg.get("head_dim") or hidden // heads
  if model_type == "llama":
    kv_heads = cfg.get("num_key_value_heads") or heads
  else:
    kv_heads = _require(cfg, "num_key_value_heads")
  if model_type == "glm":
    if factor is None:
      raise ConfigError("config.json has no partial_rotary_factor (top level or in rope_parameters)")
    rotary_dim = int(head_dim * factor)
  elif factor not in (None, 1.0):  # transformers' llama and qwen2 ropes rotate whole heads whatever it says
    raise ConfigError(f"partial_rotary_factor={factor} is not supported for model_type {model_type!r}")
  else:
    rotary_dim = head_dim
  common = dict(
    vocab_size=_require(cfg, "vocab_size"),
    hidden_size=hidden,
    intermediate_size=_require(cfg, "intermediate_size"),
    num_layers=_require(cfg, "num_hidden_layers"),
    num_heads=heads,
    num_kv_heads=kv_heads,
    head_dim=head_dim,
    rope_theta=theta,
    rotary_dim=rotary_dim,
    rms_norm_eps=float(_require(cfg, "rms_norm_eps")),
    tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),  # every family's transformers default
  )
  if model_type == "qwen2":
    if cfg.get("use_sliding_window"):
      raise ConfigError("Qwen2 sliding-window attention is not supported")
    return ModelConfig(family="qwen2", rope_interleaved=False, qkv_bias=True, o_bias=False, mlp_bias=False, **common)
  if model_type == "llama":
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(
      family="llama", rope_interleaved=False, qkv_bias=bias, o_bias=bias, mlp_bias=bool(cfg.get("mlp_bias")), **common
    )
  bias = bool(_require(cfg, "attention_bias"))
  return ModelConfig(family="glm4", rope_interleaved=True, qkv_bias=bias, o_bias=False, mlp_bias=False, **common)


def _from_chatglm(cfg: Mapping[str, Any]) -> ModelConfig:
  if not cfg.get("rmsnorm", True) or cfg.get("apply_residual_connection_post_layernorm"):
    raise ConfigError("only ChatGLM configs with rmsnorm=true and pre-norm residuals (GLM-4) are supported")
  if cfg.get("add_bias_linear"):
    raise ConfigError("ChatGLM add_bias_linear=true is not supported (GLM-4 has no dense biases)")
  if cfg.get("original_rope") is False:
    raise ConfigError("ChatGLM original_rope=false (non-interleaved GLM rope) is not supported")
  heads = _require(cfg, "num_attention_heads")
  # ChatGLMConfig falls back to ChatGLM2-6B's kv_channels=128 and multi_query_group_num=1: required instead.
  head_dim = _require(cfg, "kv_channels")
  # modeling_chatglm.py: RotaryEmbedding(head_dim // 2) with base 10000 * rope_ratio, interleaved pairs.
  return ModelConfig(
    family="glm4",
    vocab_size=_require(cfg, "padded_vocab_size", "vocab_size"),
    hidden_size=_require(cfg, "hidden_size"),
    intermediate_size=_require(cfg, "ffn_hidden_size"),
    num_layers=_require(cfg, "num_layers"),
    num_heads=heads,
    num_kv_heads=_require(cfg, "multi_query_group_num") if cfg.get("multi_query_attention") else heads,
    head_dim=head_dim,
    rope_theta=10000.0 * float(cfg.get("rope_ratio", 1.0)),
    rotary_dim=head_dim // 2,
    rope_interleaved=True,
    rms_norm_eps=float(_require(cfg, "layernorm_epsilon")),
    qkv_bias=bool(cfg.get("add_qkv_bias", False)),
    o_bias=False,
    mlp_bias=False,
    tie_embeddings=False,
  )


def _from_baichuan_audio(cfg: Mapping[str, Any]) -> ModelConfig:
  """Baichuan-Audio (`OmniForCausalLM`): a Qwen2.5 decoder with 8 RVQ embedding tables (one extra row each for
  the end-of-audio code) summed at `audio_pad_token_id`. Its NormHead is folded into lm_head by the converter."""
  audio = cfg.get("audio_config") or {}
  sizes = (audio.get("vq_config") or {}).get("codebook_sizes")
  if not sizes or audio.get("audio_pad_token_id") is None:
    raise ConfigError("Baichuan-Audio config.json lacks audio_config.vq_config.codebook_sizes or audio_pad_token_id")
  text = dict(cfg, model_type="qwen2", rope_theta=cfg.get("rotary_emb_base", cfg.get("rope_theta")))
  base = from_hf_config(text)
  return dataclasses.replace(
    base,
    qkv_bias=bool(cfg.get("attention_qkv_bias", False)),
    audio_codebook_sizes=tuple(int(n) + 1 for n in sizes),
    audio_placeholder_id=int(audio["audio_pad_token_id"]),
  )
