"""Reading and writing transformers' config.json spelling: the helpers every family's parser and exporter share.

Every switch comes from the checkpoint; a key is defaulted only where transformers itself derives it from the
others. Both the transformers v4 (top-level `rope_theta`) and v5 (`rope_parameters`) spellings are read.

Values are checked in one place, `ModelConfig` (sizes positive, epsilon and rope base positive and finite); a
family's parser builds it within `named_by`, which names a refused value by its config.json key in the
layout's spelling. The readers here check only that a number is a number, so the parser's own arithmetic (a head
size from the hidden size) never fails first.
"""

from __future__ import annotations

import contextlib
from typing import Any, Mapping

from s2sjax.model.config import ConfigError, ConfigValueError, ModelConfig

# ModelConfig field -> transformers' config.json key (a layout with other spellings names its own)
HF_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
           "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
           "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "rope_theta": "rope_theta",
           "rms_norm_eps": "rms_norm_eps", "max_positions": "max_position_embeddings"}


def require(cfg: Mapping[str, Any], *keys: str) -> Any:
  """The first of `keys` config.json gives (aliases of one setting), or a ConfigError naming them all."""
  for key in keys:
    if key in cfg and cfg[key] is not None:
      return cfg[key]
  raise ConfigError(f"config.json has none of {list(keys)}")


LLAMA3_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _rope_type(cfg: Mapping[str, Any]) -> tuple[str, dict]:
  """(rope_type, the dict that spells it) from either transformers v4 (`rope_scaling`) or v5 (`rope_parameters`)."""
  for key in ("rope_parameters", "rope_scaling"):
    spelled = dict(cfg.get(key) or {})
    rope_type = spelled.get("rope_type") or spelled.get("type")
    if rope_type:
      return rope_type, spelled
  return "default", {}


def number(cfg: Mapping[str, Any], *keys: str) -> int | float:
  """`require`, and a JSON number (not a string, a boolean or a list), or a ConfigError naming the key."""
  value = require(cfg, *keys)
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    key = next(k for k in keys if cfg.get(k) is not None)
    raise ConfigError(f"config.json {key}={value!r} is not a number")
  return value


def derived_head_dim(cfg: Mapping[str, Any]) -> int | float:
  """config.json's head_dim, else hidden_size / num_attention_heads as transformers derives it (0 when the heads
  are no positive count: ModelConfig then refuses them by name)."""
  if cfg.get("head_dim"):
    return number(cfg, "head_dim")
  hidden, heads = number(cfg, "hidden_size"), number(cfg, "num_attention_heads")
  return hidden // heads if heads > 0 else 0


@contextlib.contextmanager
def named_by(keys: Mapping[str, str] = HF_KEYS):
  """Within it, a value ModelConfig refuses is named by its config.json key (`keys`: field -> key, in the layout's
  spelling)."""
  try:
    yield
  except ConfigValueError as e:
    where = f"config.json {keys[e.field]}" if e.field in keys else f"{e.field} (derived from config.json)"
    raise ConfigError(f"{where}={e.value!r}: {e.requirement}") from None


def rope(cfg: Mapping[str, Any]) -> tuple[float, float | None]:
  """(theta, partial_rotary_factor or None) from either transformers v4 or v5 spelling; rejects scaled ropes other
  than Llama 3.1's (`rope_scaling`)."""
  params = dict(cfg.get("rope_parameters") or {})
  rope_type, _ = _rope_type(cfg)
  if rope_type not in ("default", "llama3"):
    raise ConfigError(f"rope_type {rope_type!r} is not supported (only unscaled 'default' rope and 'llama3')")
  merged = {**cfg, **params}  # v5's rope_parameters over v4's top-level keys
  factor = None if merged.get("partial_rotary_factor") is None else number(merged, "partial_rotary_factor")
  return float(number(merged, "rope_theta")), None if factor is None else float(factor)


def rope_scaling(cfg: Mapping[str, Any]) -> tuple[float, ...]:
  """ModelConfig.rope_scaling: Llama 3.1's four numbers for rope_type "llama3", () for unscaled rope."""
  rope_type, spelled = _rope_type(cfg)
  if rope_type != "llama3":
    return ()
  missing = [key for key in LLAMA3_SCALING_KEYS if spelled.get(key) is None]
  if missing:
    raise ConfigError(f"rope_type 'llama3' without {missing}")
  return tuple(float(spelled[key]) for key in LLAMA3_SCALING_KEYS)


def whole_head_rotary_dim(cfg: Mapping[str, Any], head_dim: int) -> int:
  """head_dim, for families whose transformers rope rotates whole heads whatever partial_rotary_factor says."""
  _, factor = rope(cfg)
  if factor not in (None, 1.0):
    raise ConfigError(f"partial_rotary_factor={factor} is not supported for model_type {cfg.get('model_type')!r}")
  return head_dim


def decoder_fields(cfg: Mapping[str, Any], *, head_dim: int, num_kv_heads: int, rotary_dim: int) -> dict[str, Any]:
  """The ModelConfig fields transformers' decoder configs spell alike; the family works out the rest."""
  act = cfg.get("hidden_act", "silu")  # every transformers decoder config here defaults to silu
  if act != "silu":
    raise ConfigError(f"config.json hidden_act={act!r} is not supported (the decoder's MLP is SwiGLU with silu)")
  return dict(
    vocab_size=number(cfg, "vocab_size"),
    hidden_size=number(cfg, "hidden_size"),
    intermediate_size=number(cfg, "intermediate_size"),
    num_layers=number(cfg, "num_hidden_layers"),
    num_heads=number(cfg, "num_attention_heads"),
    num_kv_heads=num_kv_heads,
    head_dim=head_dim,
    rope_theta=rope(cfg)[0],
    rotary_dim=rotary_dim,
    rms_norm_eps=float(number(cfg, "rms_norm_eps")),
    tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),  # every family's transformers default
    rope_scaling=rope_scaling(cfg),
  )


def export_fields(config: ModelConfig) -> dict[str, Any]:
  """The inverse of `decoder_fields`: a ModelConfig's architecture in transformers' spelling."""
  return dict(
    vocab_size=config.vocab_size,
    hidden_size=config.hidden_size,
    intermediate_size=config.intermediate_size,
    num_hidden_layers=config.num_layers,
    num_attention_heads=config.num_heads,
    num_key_value_heads=config.num_kv_heads,
    head_dim=config.head_dim,
    rms_norm_eps=config.rms_norm_eps,
    rope_theta=config.rope_theta,
    tie_word_embeddings=config.tie_embeddings,
    **({"rope_scaling": {"rope_type": "llama3", **dict(zip(LLAMA3_SCALING_KEYS, config.rope_scaling))}}
       if config.rope_scaling else {}),
  )
