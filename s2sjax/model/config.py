"""The decoder's architecture (`ModelConfig`), read from a checkpoint's own `config.json`.

Every switch (biases, rope theta and layout, norm eps, tied head) comes from the checkpoint; nothing is defaulted
silently. How each config.json spelling is read is its family's business (`s2sjax.families`); `from_hf_config`
finds the family by the config's `model_type`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping


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
    from s2sjax import families  # lazy: the registry's modules import this one

    families.get(self.family)  # a ConfigError naming the registered families when unknown
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


def from_hf_config(cfg: Mapping[str, Any]) -> ModelConfig:
  """Builds a ModelConfig from a parsed `config.json`: the layout that reads its `model_type` parses it."""
  from s2sjax import families  # lazy: family modules build ModelConfigs

  return families.layout_for_model_type(cfg.get("model_type")).parse_config(cfg)
