"""Where each s2sjax parameter comes from in a source checkpoint: one `Rule` per target leaf, built from a layout's
`KeyNames` (where that layout keeps each decoder tensor).

A rule lists the source tensors (one, or one per layer, stacked on axis 0), the shape each must have, and a small
transform: copy, linear (HF [out, in] weight -> [in..., out...] kernel) or bias (flat -> [heads, head_dim]).
Fused sources (one matrix holding q, k and v, or gate and up) are read as row slices: in that order, or, for a
fused qkv laid out per head (`KeyNames.qkv_per_head`), each head's q, k and v rows in turn.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from s2sjax.model.config import ModelConfig

LeafPath = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Piece:
  key: str
  source_shape: tuple[int, ...]  # the shape the checkpoint must hold under `key`
  rows: tuple[tuple[int, int], ...] | None = None  # [start, stop) row ranges of a fused matrix, concatenated
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
      array = np.concatenate([array[start:stop] for start, stop in piece.rows])
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


@dataclasses.dataclass(frozen=True)
class KeyNames:
  """Where one layout keeps each decoder tensor: module names, to which `.weight` / `.bias` is appended; per-layer
  names are format strings of the layer index `{i}`. Attention has q, k and v separately or one fused `qkv`; the
  MLP has gate and up separately or one fused `gate_up`, or only up for an MLP without a gate (OPT's fc1). The
  modules only some decoders have (a learned position table, embedding projections) are named when the layout has
  them."""

  embed: str
  final_norm: str
  lm_head: str
  attn_norm: str
  mlp_norm: str
  o: str
  down: str
  q: str | None = None
  k: str | None = None
  v: str | None = None
  qkv: str | None = None
  gate: str | None = None
  up: str | None = None
  gate_up: str | None = None
  # The fused qkv's rows are [heads, (q, k, v), head_dim] (ChatGLM without multi-query attention), not [q | k | v].
  qkv_per_head: bool = False
  positions: str | None = None  # ModelConfig.position_embedding == "learned"
  project_in: str | None = None  # ModelConfig.projects_embeddings
  project_out: str | None = None

  def __post_init__(self):
    given = [getattr(self, name) is not None for name in ("q", "k", "v")]
    if (self.qkv is not None) == any(given) or any(given) != all(given):
      raise ValueError("KeyNames needs either qkv or all of q, k, v, not both or neither")
    if (self.gate_up is not None) == (self.up is not None) or (self.gate is not None and self.up is None):
      raise ValueError("KeyNames needs either gate_up or up (with gate for a gated MLP), not both or neither")
    if self.qkv_per_head and self.qkv is None:
      raise ValueError("KeyNames.qkv_per_head describes a fused qkv: give qkv")


# transformers' spelling of a decoder (LlamaForCausalLM, Qwen2ForCausalLM and most others).
HF_NAMES = KeyNames(
  embed="model.embed_tokens",
  final_norm="model.norm",
  lm_head="lm_head",
  attn_norm="model.layers.{i}.input_layernorm",
  mlp_norm="model.layers.{i}.post_attention_layernorm",
  q="model.layers.{i}.self_attn.q_proj",
  k="model.layers.{i}.self_attn.k_proj",
  v="model.layers.{i}.self_attn.v_proj",
  o="model.layers.{i}.self_attn.o_proj",
  gate="model.layers.{i}.mlp.gate_proj",
  up="model.layers.{i}.mlp.up_proj",
  down="model.layers.{i}.mlp.down_proj",
)
# Buffers transformers checkpoints may save that carry no weights (recomputed from the config).
HF_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class _Rows:
  """Where a per-layer tensor's rows are: a whole source tensor, or a row slice of a fused one."""

  module: str
  total_rows: int
  rows: tuple[tuple[int, int], ...] | None = None


def _projections(fused: str | None, separate: Mapping[str, str | None], rows: Mapping[str, int]) -> dict[str, _Rows]:
  if fused is None:
    return {name: _Rows(separate[name], n) for name, n in rows.items()}
  out, start = {}, 0
  for name, n in rows.items():
    out[name] = _Rows(fused, sum(rows.values()), ((start, start + n),))
    start += n
  return out


def _per_head_projections(fused: str, heads: int, head_dim: int, names: tuple[str, ...]) -> dict[str, _Rows]:
  """Rows of a fused matrix laid out [heads, len(names), head_dim]: head h's rows of names[j] start at
  (h * len(names) + j) * head_dim."""
  block = len(names) * head_dim
  return {
    name: _Rows(fused, heads * block, tuple((h * block + j * head_dim, h * block + (j + 1) * head_dim)
                                           for h in range(heads)))
    for j, name in enumerate(names)
  }


def check_rules(targets: set[LeafPath], rules: list[Rule], shapes: Mapping[str, tuple[int, ...]]
                ) -> tuple[list[str], list[str]]:
  """(problems, source keys no rule reads) of `rules` against a source's {key: shape}: every target leaf without a
  rule, every missing key (named with the leaf it feeds), every mis-shaped one."""
  problems = [f"no conversion rule for target {'/'.join(p)}" for p in sorted(targets - {r.target for r in rules})]
  used = set()
  for rule in rules:
    for piece in rule.pieces:
      used.add(piece.key)
      if piece.key not in shapes:
        problems.append(f"missing key {piece.key} (for {'/'.join(rule.target)})")
      elif tuple(shapes[piece.key]) != piece.source_shape:
        problems.append(f"shape mismatch at {piece.key}: checkpoint has {tuple(shapes[piece.key])}, config.json "
                        f"implies {piece.source_shape}")
  return problems, sorted(set(shapes) - used)


def copy_rule(target: LeafPath, key: str, shape: tuple[int, ...]) -> Rule:
  """A leaf read as it is stored (embedding tables, norms)."""
  return Rule(target, (Piece(key, shape),), "copy")


def _require(names: KeyNames, name: str, needed_by: str) -> str:
  if getattr(names, name) is None:
    raise ValueError(f"KeyNames has no {name}, which the config's {needed_by} needs")
  return getattr(names, name)


def decoder_rules(config: ModelConfig, names: KeyNames, normalize_head: bool = False) -> list[Rule]:
  """Every text-decoder leaf's rule for a source spelled `names` (audio tables are the layout's own business)."""
  c = config
  d, e, f, hd = c.hidden_size, c.embed_dim, c.intermediate_size, c.head_dim
  q_rows, kv_rows = c.num_heads * hd, c.num_kv_heads * hd

  def stacked(part: _Rows, target: LeafPath, kind: str, suffix: str, columns=(), in_dims=1) -> Rule:
    shape = (part.total_rows, *columns)
    pieces = tuple(Piece(f"{part.module.format(i=i)}.{suffix}", shape, part.rows) for i in range(c.num_layers))
    return Rule(("layers", *target), pieces, kind, in_dims, stacked=True)

  if names.qkv_per_head:
    if c.num_kv_heads != c.num_heads:
      raise ValueError(f"a per-head fused qkv has as many kv heads as heads, not {c.num_kv_heads} of {c.num_heads}")
    attn = _per_head_projections(names.qkv, c.num_heads, hd, ("q", "k", "v"))
  else:
    attn = _projections(names.qkv, {"q": names.q, "k": names.k, "v": names.v},
                        {"q": q_rows, "k": kv_rows, "v": kv_rows})
  if c.mlp == "swiglu":
    if names.gate_up is None:
      _require(names, "gate", "swiglu MLP")
    mlp = _projections(names.gate_up, {"gate": names.gate, "up": names.up}, {"gate": f, "up": f})
  elif names.gate is not None or names.gate_up is not None:
    raise ValueError(f"KeyNames has a gate, which a {c.mlp} MLP does not")
  else:
    mlp = {"up": _Rows(names.up, f)}
  rules = [copy_rule(("embed", "embedding"), f"{names.embed}.weight", (c.vocab_size, e))]
  if c.position_embedding == "learned":
    table = f"{_require(names, 'positions', 'learned positions')}.weight"
    rules.append(copy_rule(("position_embed", "embedding"), table, (c.max_positions + c.position_offset, d)))
  if c.projects_embeddings:
    for target, rows, columns in (("project_in", d, e), ("project_out", e, d)):
      key = f"{_require(names, target, f'word_embed_dim={e}')}.weight"
      rules.append(Rule((target, "kernel"), (Piece(key, (rows, columns)),), "linear"))
  for name, part in attn.items():
    rules.append(stacked(part, ("attn", name, "kernel"), "linear", "weight", (d,)))
    if c.qkv_bias:
      rules.append(stacked(part, ("attn", name, "bias"), "bias", "bias"))
  o = _Rows(names.o, d)
  rules.append(stacked(o, ("attn", "o", "kernel"), "linear", "weight", (q_rows,), in_dims=2))
  if c.o_bias:
    rules.append(stacked(o, ("attn", "o", "bias"), "copy", "bias"))
  for name, part in {**mlp, "down": _Rows(names.down, d)}.items():
    rules.append(stacked(part, ("mlp", name, "kernel"), "linear", "weight", (f if name == "down" else d,)))
    if c.mlp_bias:
      rules.append(stacked(part, ("mlp", name, "bias"), "copy", "bias"))
  # A LayerNorm's bias is stored as `.bias` beside its `.weight` scale.
  norm_parts = (("scale", "weight"), ("bias", "bias")) if c.norm == "layer" else (("scale", "weight"),)
  for norm, module in (("attn_norm", names.attn_norm), ("mlp_norm", names.mlp_norm)):
    rules += [stacked(_Rows(module, d), (norm, leaf), "copy", suffix) for leaf, suffix in norm_parts]
  if c.final_norm:
    rules += [copy_rule(("final_norm", leaf), f"{names.final_norm}.{suffix}", (d,)) for leaf, suffix in norm_parts]
  if not c.tie_embeddings:
    head = Piece(f"{names.lm_head}.weight", (c.vocab_size, e), normalize_rows=normalize_head)
    rules.append(Rule(("lm_head", "kernel"), (head,), "linear"))
  return rules


def rules_in(names: KeyNames) -> Callable[[ModelConfig, Mapping[str, Any]], list[Rule]]:
  """A layout's `rules` for a plain decoder spelled `names` (nothing read from config.json beyond the config)."""
  return lambda config, source_config: decoder_rules(config, names)


# llama.cpp's tensor names (convert_hf_to_gguf), shared by its llama-style architectures, in HF spelling.
_LLAMA_CPP_GLOBAL = {"token_embd": HF_NAMES.embed, "output_norm": HF_NAMES.final_norm, "output": HF_NAMES.lm_head}
_LLAMA_CPP_LAYER = {
  "attn_norm": HF_NAMES.attn_norm, "attn_q": HF_NAMES.q, "attn_k": HF_NAMES.k, "attn_v": HF_NAMES.v,
  "attn_output": HF_NAMES.o, "ffn_norm": HF_NAMES.mlp_norm, "ffn_gate": HF_NAMES.gate, "ffn_up": HF_NAMES.up,
  "ffn_down": HF_NAMES.down,
}


def llama_cpp_to_hf_key(name: str) -> str:
  """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; unknown names are returned unchanged, so
  they surface as unexpected keys."""
  parts = name.split(".")
  if len(parts) == 2 and parts[0] in _LLAMA_CPP_GLOBAL:
    return f"{_LLAMA_CPP_GLOBAL[parts[0]]}.{parts[1]}"
  if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LLAMA_CPP_LAYER:
    return f"{_LLAMA_CPP_LAYER[parts[2]].format(i=parts[1])}.{parts[3]}"
  return name
