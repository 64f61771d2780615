"""The decoder's architecture (`ModelConfig`), read from a checkpoint's own `config.json`.

Every switch (biases, rope theta and layout, norm kind and eps, positions, MLP kind, tied head) comes from the
checkpoint; nothing is defaulted silently. The switches added for decoders unlike Llama (OPT's LayerNorm, post-norm
residuals, ReLU MLP, learned positions, embedding projections) default to the Llama-style decoder, so configs
written before they existed read as they did. How each config.json spelling is read is its family's business
(`s2sjax.model.families.from_hf_config` finds the family by the config's `model_type`); which families exist is the
family registry's to say, which every ModelConfig asks, named lazily (`FAMILY_LOOKUP`): model/ imports nothing
above it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from typing import Any

from s2sjax.runtime.errors import UserError
from s2sjax.runtime.registry import load_object


class ConfigError(UserError, ValueError):
  """A config.json this project cannot turn into a decoder."""


class ConfigValueError(ConfigError):
  """A ModelConfig field holding a value no decoder has: `field`, `value` and the `requirement` it fails (a family's
  parser names the field by its config.json key: `s2sjax.model.families.hf_config.named_by`)."""

  def __init__(self, field: str, value: Any, requirement: str):
    super().__init__(f"{field}={value!r}: {requirement}")
    self.field, self.value, self.requirement = field, value, requirement


NORMS = ("rms", "layer")
MLPS = ("swiglu", "relu")
POSITION_EMBEDDINGS = ("rope", "learned")

# The family registry's lookup: a ConfigError naming the registered families for an unknown name.
FAMILY_LOOKUP = "s2sjax.model.families:get"

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
  rope_theta: float  # 0 without rope
  rotary_dim: int  # leading dims of each head that are rotated, the rest pass through (GLM-4: head_dim / 2); 0: no rope
  rope_interleaved: bool  # rotate (x0, x1), (x2, x3)... (GLM-4) instead of the two halves (Qwen2, Llama)
  rms_norm_eps: float  # every norm's epsilon (named for RMSNorm, the default `norm`)
  qkv_bias: bool
  o_bias: bool
  mlp_bias: bool
  tie_embeddings: bool
  # Audio inputs in `codebook_tables` mode (Baichuan-Audio): one embedding table per codebook, summed at the
  # positions of `audio_placeholder_id`. Empty for text-only and `extended_vocab` models.
  audio_codebook_sizes: tuple[int, ...] = ()
  audio_placeholder_id: int | None = None
  norm: str = "rms"  # of NORMS: "rms" (RMSNorm, a scale) or "layer" (LayerNorm, a scale and a bias: OPT)
  pre_norm: bool = True  # norm each block's input; False: norm after each residual sum (post-LN, OPT-350m)
  final_norm: bool = True  # a norm after the last layer
  mlp: str = "swiglu"  # of MLPS: "swiglu" (gate, up, down) or "relu" (up, relu, down: OPT's fc1 / fc2)
  # Of POSITION_EMBEDDINGS: "rope", or "learned": a table of `max_positions + position_offset` rows added to the
  # token embeddings, read at each token's position + `position_offset` (OPT keeps 2 unused rows in front).
  position_embedding: str = "rope"
  max_positions: int = 0
  position_offset: int = 0
  # Width of the token embeddings and the head when it is not hidden_size (OPT's word_embed_proj_dim): the decoder
  # then projects the embeddings in (`project_in`) and its output back out (`project_out`), neither with a bias.
  word_embed_dim: int | None = None
  # Llama 3.1's frequency scaling of the rotary angles (transformers' rope_type "llama3"): (factor, low_freq_factor,
  # high_freq_factor, original_max_position_embeddings); empty: the angles are unscaled.
  rope_scaling: tuple[float, ...] = ()

  def __post_init__(self):
    load_object(FAMILY_LOOKUP)(self.family)
    self._check_values()
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    for name, known in (("norm", NORMS), ("mlp", MLPS), ("position_embedding", POSITION_EMBEDDINGS)):
      if getattr(self, name) not in known:
        raise ConfigError(f"{name}={getattr(self, name)!r} is not one of {known}")
    if self.position_embedding == "rope":
      if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
        raise ConfigError(f"rotary_dim={self.rotary_dim} must be even and in (0, head_dim={self.head_dim}]")
    elif self.rotary_dim or self.max_positions <= 0:
      raise ConfigError(f"learned positions need rotary_dim=0 (got {self.rotary_dim}) and max_positions > 0 "
                        f"(got {self.max_positions})")
    if self.rope_scaling and (len(self.rope_scaling) != 4 or self.position_embedding != "rope"):
      raise ConfigError(f"rope_scaling={self.rope_scaling} must be (factor, low_freq_factor, high_freq_factor, "
                        "original_max_position_embeddings), for a rope model")
    if self.audio_codebook_sizes and self.audio_placeholder_id is None:
      raise ConfigError("audio_codebook_sizes given without audio_placeholder_id")

  def _check_values(self) -> None:
    """Each number within what a decoder can have, in field order (sizes first: the rules after divide by them)."""
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim"):
      _require(name, getattr(self, name), _is_int(getattr(self, name)) and getattr(self, name) > 0,
               "must be a positive integer")
    for name in ("rotary_dim", "max_positions", "position_offset"):
      _require(name, getattr(self, name), _is_int(getattr(self, name)) and getattr(self, name) >= 0,
               "must be a non-negative integer")
    rope = self.position_embedding == "rope"
    _require("rope_theta", self.rope_theta, _is_real(self.rope_theta) and (self.rope_theta > 0 if rope else True),
             "must be a positive number (the rotary base)" if rope else "must be a finite number")
    _require("rms_norm_eps", self.rms_norm_eps, _is_real(self.rms_norm_eps) and self.rms_norm_eps > 0,
             "must be a positive number (the norm's epsilon)")
    if self.word_embed_dim is not None:
      _require("word_embed_dim", self.word_embed_dim, _is_int(self.word_embed_dim) and self.word_embed_dim > 0,
               "must be a positive integer")
    _require("audio_codebook_sizes", self.audio_codebook_sizes,
             all(_is_int(n) and n > 0 for n in self.audio_codebook_sizes), "must be positive integers")
    if self.audio_placeholder_id is not None:
      _require("audio_placeholder_id", self.audio_placeholder_id,
               _is_int(self.audio_placeholder_id) and 0 <= self.audio_placeholder_id < self.vocab_size,
               f"must be a token id below vocab_size={self.vocab_size}")

  @property
  def embed_dim(self) -> int:
    """Width of the token embeddings and of the head's input."""
    return self.word_embed_dim or self.hidden_size

  @property
  def projects_embeddings(self) -> bool:
    return self.embed_dim != self.hidden_size

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "ModelConfig":
    fields = json.loads(text)
    fields["audio_codebook_sizes"] = tuple(fields.get("audio_codebook_sizes", ()))
    fields["rope_scaling"] = tuple(fields.get("rope_scaling", ()))
    unknown = set(fields) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ConfigError(f"unknown ModelConfig keys: {sorted(unknown)}")
    return cls(**fields)

  def num_params(self) -> int:
    """Parameter count of the text decoder (audio tables excluded)."""
    d, f, h, kv, hd = self.hidden_size, self.intermediate_size, self.num_heads, self.num_kv_heads, self.head_dim
    e, gated = self.embed_dim, self.mlp == "swiglu"
    norm = d * (2 if self.norm == "layer" else 1)
    attn = d * hd * (2 * h + 2 * kv) + (hd * (h + 2 * kv) if self.qkv_bias else 0) + (d if self.o_bias else 0)
    mlp = (3 if gated else 2) * d * f + ((2 if gated else 1) * f + d if self.mlp_bias else 0)
    layer = attn + mlp + 2 * norm
    head = 0 if self.tie_embeddings else self.vocab_size * e
    positions = (self.max_positions + self.position_offset) * d if self.position_embedding == "learned" else 0
    projections = 2 * e * d if self.projects_embeddings else 0
    final = norm if self.final_norm else 0
    return self.vocab_size * e + positions + projections + self.num_layers * layer + final + head



def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _require(field: str, value: Any, holds: bool, requirement: str) -> None:
  if not holds:
    raise ConfigValueError(field, value, requirement)


class AroundDecoder:
  """For the config of a model built around a shared-decoder stack (`self.decoder`: Kimi-Audio's main stack,
  MiMo-Audio's global one, Step-Audio 2's LLM): its text table's rows, and the layers of its top-level `layers`
  stack, which the checkpoint stores one at a time."""

  decoder: ModelConfig

  @property
  def vocab_size(self) -> int:
    return self.decoder.vocab_size

  @property
  def num_layers(self) -> int:
    return self.decoder.num_layers
