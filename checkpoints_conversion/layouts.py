"""Where each s2sjax parameter comes from in a source checkpoint: one `Rule` per target leaf.

A rule lists the source tensors (one, or one per layer, stacked on axis 0), the shape each must have, and a small
transform: copy, linear (HF [out, in] weight -> [in..., out...] kernel) or bias (flat -> [heads, head_dim]).
Fused sources (GLM's query_key_value and gate_up_proj, Baichuan's W_pack) are read as row slices.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from s2sjax.model.config import ModelConfig

LeafPath = tuple[str, ...]

# Layouts by source spelling; the converter's --family flag picks among the model types each accepts.
LAYOUT_MODEL_TYPES = {
  "qwen2": ("qwen2",),
  "llama": ("llama",),
  "glm4": ("glm", "chatglm"),
  "baichuan_audio": ("omni",),
}
# Buffers some checkpoints save that carry no weights (recomputed from the config).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_pos_emb.inv_freq")
# Tensors kept verbatim as extras: audio output heads are converted and kept, not used for text scoring.
KEPT_PREFIXES = {"omni": ("audio_head.",)}


@dataclasses.dataclass(frozen=True)
class Piece:
  key: str
  source_shape: tuple[int, ...]  # the shape the checkpoint must hold under `key`
  rows: tuple[int, int] | None = None  # [start, stop) rows of a fused matrix
  normalize_rows: bool = False  # Baichuan's NormHead: rows L2-normalised at every forward, so once here


@dataclasses.dataclass(frozen=True)
class Rule:
  target: LeafPath
  pieces: tuple[Piece, ...]
  kind: str  # "copy" | "linear" | "bias"
  in_dims: int = 1  # linear: how many leading kernel dims are the input
  stacked: bool = False  # one piece per layer, stacked on a new axis 0

  def per_layer_shape(self, target_shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(target_shape[1:]) if self.stacked else tuple(target_shape)

  def to_target(self, array: np.ndarray, piece: Piece, layer_shape: tuple[int, ...]) -> np.ndarray:
    if piece.rows is not None:
      array = array[piece.rows[0] : piece.rows[1]]
    if piece.normalize_rows:
      array32 = np.asarray(array, np.float32)
      array = array32 / np.maximum(np.linalg.norm(array32, axis=-1, keepdims=True), 1e-12)
    if self.kind == "linear":
      return np.asarray(array).T.reshape(layer_shape)
    return np.asarray(array).reshape(layer_shape)

  def to_source(self, leaf: np.ndarray) -> np.ndarray:
    """Inverse of `to_target` for one (unstacked) leaf of an unfused layout; used to export to HF."""
    if self.kind == "linear":
      return leaf.reshape(int(np.prod(leaf.shape[: self.in_dims])), -1).T
    if self.kind == "bias":
      return leaf.reshape(-1)
    return leaf


def _linear(target: LeafPath, pieces, in_dims=1, stacked=True) -> Rule:
  return Rule(target, tuple(pieces), "linear", in_dims, stacked)


def _stacked(kind: str, target: LeafPath, pieces) -> Rule:
  return Rule(target, tuple(pieces), kind, 1, True)


@dataclasses.dataclass(frozen=True)
class _Names:
  """Source key spelling of one layout. Callables take the layer index."""

  embed: str
  final_norm: str
  lm_head: str
  attn_norm: Callable[[int], str]
  mlp_norm: Callable[[int], str]
  o_proj: Callable[[int], str]
  down: Callable[[int], str]


def _hf_names(prefix="model") -> _Names:
  layer = lambda i: f"{prefix}.layers.{i}"
  return _Names(
    embed=f"{prefix}.embed_tokens.weight",
    final_norm=f"{prefix}.norm.weight",
    lm_head="lm_head.weight",
    attn_norm=lambda i: f"{layer(i)}.input_layernorm.weight",
    mlp_norm=lambda i: f"{layer(i)}.post_attention_layernorm.weight",
    o_proj=lambda i: f"{layer(i)}.self_attn.o_proj",
    down=lambda i: f"{layer(i)}.mlp.down_proj",
  )


def _chatglm_names() -> _Names:
  layer = lambda i: f"transformer.encoder.layers.{i}"
  return _Names(
    embed="transformer.embedding.word_embeddings.weight",
    final_norm="transformer.encoder.final_layernorm.weight",
    lm_head="transformer.output_layer.weight",
    attn_norm=lambda i: f"{layer(i)}.input_layernorm.weight",
    mlp_norm=lambda i: f"{layer(i)}.post_attention_layernorm.weight",
    o_proj=lambda i: f"{layer(i)}.self_attention.dense",
    down=lambda i: f"{layer(i)}.mlp.dense_4h_to_h",
  )


def rules_for(config: ModelConfig, model_type: str, extra: dict | None = None) -> list[Rule]:
  """Every target leaf's rule for a source of `model_type` (config.json's)."""
  c = config
  d, f, hd = c.hidden_size, c.intermediate_size, c.head_dim
  q_rows, kv_rows = c.num_heads * hd, c.num_kv_heads * hd
  layers = range(c.num_layers)
  names = _chatglm_names() if model_type == "chatglm" else _hf_names()
  rules = [Rule(("embed", "embedding"), (Piece(names.embed, (c.vocab_size, d)),), "copy")]

  # q, k, v: separate projections, or row slices of one fused matrix.
  qkv_slices = {"q": (0, q_rows), "k": (q_rows, q_rows + kv_rows), "v": (q_rows + kv_rows, q_rows + 2 * kv_rows)}
  for name, (start, stop) in qkv_slices.items():
    if model_type == "chatglm":
      fused = lambda i: f"transformer.encoder.layers.{i}.self_attention.query_key_value"
    elif model_type == "omni":
      fused = lambda i: f"model.layers.{i}.self_attn.W_pack"
    else:
      fused = None
    if fused:
      weight = [Piece(f"{fused(i)}.weight", (q_rows + 2 * kv_rows, d), (start, stop)) for i in layers]
      bias = [Piece(f"{fused(i)}.bias", (q_rows + 2 * kv_rows,), (start, stop)) for i in layers]
    else:
      weight = [Piece(f"model.layers.{i}.self_attn.{name}_proj.weight", (stop - start, d)) for i in layers]
      bias = [Piece(f"model.layers.{i}.self_attn.{name}_proj.bias", (stop - start,)) for i in layers]
    rules.append(_linear(("layers", "attn", name, "kernel"), weight))
    if c.qkv_bias:
      rules.append(_stacked("bias", ("layers", "attn", name, "bias"), bias))

  rules.append(_linear(("layers", "attn", "o", "kernel"), [Piece(f"{names.o_proj(i)}.weight", (d, q_rows)) for i in layers], in_dims=2))
  if c.o_bias:
    rules.append(_stacked("copy", ("layers", "attn", "o", "bias"), [Piece(f"{names.o_proj(i)}.bias", (d,)) for i in layers]))

  # gate and up: separate, or the two halves of GLM's fused matrix (gate first).
  for name, (start, stop) in {"gate": (0, f), "up": (f, 2 * f)}.items():
    if model_type == "chatglm":
      pieces = [Piece(f"transformer.encoder.layers.{i}.mlp.dense_h_to_4h.weight", (2 * f, d), (start, stop)) for i in layers]
    elif model_type == "glm":
      pieces = [Piece(f"model.layers.{i}.mlp.gate_up_proj.weight", (2 * f, d), (start, stop)) for i in layers]
    else:
      pieces = [Piece(f"model.layers.{i}.mlp.{name}_proj.weight", (f, d)) for i in layers]
    rules.append(_linear(("layers", "mlp", name, "kernel"), pieces))
    if c.mlp_bias:
      rules.append(_stacked("copy", ("layers", "mlp", name, "bias"), [Piece(f"model.layers.{i}.mlp.{name}_proj.bias", (f,)) for i in layers]))
  rules.append(_linear(("layers", "mlp", "down", "kernel"), [Piece(f"{names.down(i)}.weight", (d, f)) for i in layers]))
  if c.mlp_bias:
    rules.append(_stacked("copy", ("layers", "mlp", "down", "bias"), [Piece(f"{names.down(i)}.bias", (d,)) for i in layers]))

  rules.append(_stacked("copy", ("layers", "attn_norm", "scale"), [Piece(names.attn_norm(i), (d,)) for i in layers]))
  rules.append(_stacked("copy", ("layers", "mlp_norm", "scale"), [Piece(names.mlp_norm(i), (d,)) for i in layers]))
  rules.append(Rule(("final_norm", "scale"), (Piece(names.final_norm, (d,)),), "copy"))
  if not c.tie_embeddings:
    norm_head = model_type == "omni" and bool((extra or {}).get("use_norm_head", True))
    head = Piece(names.lm_head, (c.vocab_size, d), normalize_rows=norm_head)
    rules.append(_linear(("lm_head", "kernel"), [head], stacked=False))
  for k, size in enumerate(c.audio_codebook_sizes):
    rules.append(Rule((f"audio_embed_{k}", "embedding"), (Piece(f"model.audio_embed_layers.{k}.weight", (size, d)),), "copy"))
  return rules
