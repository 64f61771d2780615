"""Moshi's release tensors -> its parameter tree (s2sjax/model/moshi.py): the key map from Kyutai's `LMModel`
module names to the tree's leaves (`rules`), the state dict's spellings read as those names (`LMStateDict`: fused or
per-weight-set attention, LoRA factors merged), the check of a state dict against the map (`plan`) and the leaves it
makes (`convert_leaves`). moshi_release.py converts and verifies a release with them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterator, Mapping

import numpy as np
from flax import traverse_util

from s2sjax.model.families.keymap import check_rules
from s2sjax.model.moshi import MoshiConfig, TransformerConfig, abstract_params

MOSHI_NAME = "model.safetensors"  # moshi.models.loaders.MOSHI_NAME: the LM's file when config.json names none
LORA_SCALING = 2.0  # get_moshi_lm's default when config.json gives no lora_scaling (loaders.py l.401)
# Release modules scoring never runs (extra heads; Mimi's keys when its file sits in the same folder).
SKIPPED_PREFIXES = ("extra_heads.",)


# ---- key map ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Piece:
  key: str
  source_shape: tuple[int, ...]  # the shape the checkpoint must hold under `key`
  rows: tuple[int, int] | None = None  # a [start, stop) row slice of a fused matrix


@dataclasses.dataclass(frozen=True)
class Rule:
  """A target leaf from its pieces, in order (layer-major, then weight set), each transformed ("copy" reshapes;
  "linear" turns a PyTorch [out, in] weight into an [in, out] kernel) to the leaf's trailing shape, then stacked
  over the leaf's `lead` leading dims."""

  target: tuple[str, ...]
  pieces: tuple[Piece, ...]
  kind: str  # copy | linear
  lead: int = 0

  def assemble(self, arrays: list[np.ndarray], target_shape: tuple[int, ...]) -> np.ndarray:
    item_shape = tuple(target_shape[self.lead :])
    out = []
    for piece, array in zip(self.pieces, arrays):
      array = np.asarray(array)
      if piece.rows is not None:
        array = array[piece.rows[0] : piece.rows[1]]
      out.append((array.T if self.kind == "linear" else array).reshape(item_shape))
    return np.stack(out).reshape(target_shape) if self.lead else out[0]


def _transformer_rules(t: TransformerConfig, target: tuple[str, ...], prefix: str, per_step: bool) -> list[Rule]:
  """A StreamingTransformer's layers, in LMModel's module names (`LMStateDict`): attention has one in_projs /
  out_projs module per weight set, an in_projs weight's rows being [q | k | v]."""
  d, kvd, h = t.dim, t.kv_heads * t.head_dim, t.hidden
  out_rows = d + 2 * kvd
  sets = range(t.weight_sets)
  layer = lambda i: f"{prefix}.layers.{i}"
  lead = 2 if per_step else 1
  rules = []

  def projection(name: str, which: str, total: int, start: int, size: int) -> Rule:
    pieces = tuple(Piece(f"{layer(i)}.self_attn.{which}_projs.{s}.weight", (total, d), (start, start + size))
                   for i in range(t.num_layers) for s in sets)
    return Rule((*target, "layers", name), pieces, "linear", lead)

  rules += [projection("q", "in", out_rows, 0, d), projection("k", "in", out_rows, d, kvd),
            projection("v", "in", out_rows, d + kvd, kvd), projection("o", "out", d, 0, d)]
  if per_step:  # the gating is a ModuleList, one per weight set
    gating = lambda part, shape: tuple(Piece(f"{layer(i)}.gating.{s}.{part}.weight", shape)
                                       for i in range(t.num_layers) for s in sets)
  else:
    gating = lambda part, shape: tuple(Piece(f"{layer(i)}.gating.{part}.weight", shape) for i in range(t.num_layers))
  rules += [Rule((*target, "layers", "gate"), tuple(dataclasses.replace(p, rows=(0, h)) for p in
                                                   gating("linear_in", (2 * h, d))), "linear", lead),
            Rule((*target, "layers", "up"), tuple(dataclasses.replace(p, rows=(h, 2 * h)) for p in
                                                 gating("linear_in", (2 * h, d))), "linear", lead),
            Rule((*target, "layers", "down"), gating("linear_out", (d, h)), "linear", lead)]
  per_layer = lambda key, shape: tuple(Piece(f"{layer(i)}.{key}", shape) for i in range(t.num_layers))
  rules += [Rule((*target, "layers", "attn_norm", "scale"), per_layer("norm1.alpha", (1, 1, d)), "copy", 1),
            Rule((*target, "layers", "mlp_norm", "scale"), per_layer("norm2.alpha", (1, 1, d)), "copy", 1)]
  if t.layer_scale:
    rules += [Rule((*target, "layers", "attn_scale"), per_layer("layer_scale_1.scale", (d,)), "copy", 1),
              Rule((*target, "layers", "mlp_scale"), per_layer("layer_scale_2.scale", (d,)), "copy", 1)]
  return rules


def _embedding_rules(target: tuple[str, ...], key: str, rows: int, dim: int, low_rank: int | None) -> list[Rule]:
  rules = [Rule((*target, "embedding"), (Piece(f"{key}.weight", (rows, low_rank or dim)),), "copy")]
  if low_rank:
    rules.append(Rule((*target, "low_rank"), (Piece(f"{key}.low_rank.weight", (dim, low_rank)),), "linear"))
  return rules


def rules(config: MoshiConfig) -> list[Rule]:
  """Every leaf of `abstract_params(config)` from the release's state-dict keys."""
  c, dim = config, config.temporal.dim
  out = _embedding_rules(("text_emb",), "text_emb", c.text_card + 1, dim, None)
  for k in range(c.n_q):
    out += _embedding_rules((f"audio_emb_{k}",), f"emb.{k}", c.card + 1, dim, None)
  out += _transformer_rules(c.temporal, ("transformer",), "transformer", per_step=False)
  out.append(Rule(("out_norm", "scale"), (Piece("out_norm.alpha", (1, 1, dim)),), "copy"))
  out.append(Rule(("text_head", "kernel"), (Piece("text_linear.weight", (c.text_card_out, dim)),), "linear"))
  if c.bias_proj:
    out.append(Rule(("text_head", "bias"), (Piece("text_linear.bias", (c.text_card_out,)),), "copy"))
  if not c.dep_q:
    return out
  t = c.depformer
  out.append(Rule(("depformer", "in_kernel"), tuple(Piece(f"depformer_in.{j}.weight", (t.dim, dim))
                                                   for j in range(c.num_in_linears)), "linear", 1))
  out += _embedding_rules(("depformer", "text_emb"), "depformer_text_emb", c.text_card + 1, t.dim, c.depformer_low_rank)
  for k in range(c.dep_q - 1):
    out += _embedding_rules(("depformer", f"audio_emb_{k}"), f"depformer_emb.{k}", c.card + 1, t.dim,
                            c.depformer_low_rank)
  out += _transformer_rules(t, ("depformer", "transformer"), "depformer", per_step=t.weight_sets > 1)
  if c.depformer_norm is not None:
    out.append(Rule(("depformer", "norm_scale"), tuple(Piece(f"depformer_norms.{k}.alpha", (1, 1, t.dim))
                                                      for k in range(c.dep_q)), "copy", 1))
  out.append(Rule(("depformer", "heads"), tuple(Piece(f"linears.{k}.weight", (c.card, t.dim))
                                               for k in range(c.dep_q)), "linear", 1))
  if c.bias_proj:
    out.append(Rule(("depformer", "heads_bias"), tuple(Piece(f"linears.{k}.bias", (c.card,))
                                                      for k in range(c.dep_q)), "copy", 1))
  return out


# ---- the state dict's spellings --------------------------------------------------------------------------------------

# The fused attention spellings Kyutai's loader splits into LMModel's per-weight-set modules
# (`StreamingMultiheadAttention._load_hook`, moshi/modules/transformer.py l.423-446): a key's suffix after
# `self_attn.` -> (in | out, the LoRA factor it is or ""); weight set i holds the i-th of its equal row blocks.
FUSED_ATTENTION = {
  "in_proj_weight": ("in", ""), "in_proj.weight": ("in", ""), "out_proj.weight": ("out", ""),
  "in_proj.lora_A.weight": ("in", "lora_A."), "in_proj.lora_B.weight": ("in", "lora_B."),
  "out_proj.lora_A.weight": ("out", "lora_A."), "out_proj.lora_B.weight": ("out", "lora_B."),
}
# A LoRA-wrapped linear (moshi/modules/lora.py `LoRALinear`): its base weight under `frozen_W`, its factors beside.
_LORA_PART = re.compile(r"(?P<module>.+)\.(?P<part>frozen_W|lora_A|lora_B)\.(?P<leaf>weight|bias)")


@dataclasses.dataclass(frozen=True)
class _Stored:
  key: str  # the file's key
  rows: tuple[int, int] | None = None  # a row block of a fused tensor


class LMStateDict:
  """A Moshi state dict in `LMModel`'s own module names, whichever spelling the files use: fused attention split
  into its weight sets, a LoRA-wrapped linear's `frozen_W` read as its weight and its factors merged into it
  (W + scaling * B @ A, as `LoRALinear.forward` and `replace_lora_with_linear` compute it, moshi/modules/lora.py).
  `shapes` and `read` speak those names; `problems` lists what does not fit (a tensor stored under two spellings, a
  lone LoRA factor, factors that do not fit their weight) instead of raising, so all are reported together."""

  def __init__(self, config: MoshiConfig, shapes: Mapping[str, tuple[int, ...]], read: Callable[[str], np.ndarray],
               lora_scaling: float = LORA_SCALING):
    self._read, self.lora_scaling = read, float(lora_scaling)
    self.problems: list[str] = []
    self._stored: dict[str, _Stored] = {}
    self.shapes: dict[str, tuple[int, ...]] = {}
    for key, shape in shapes.items():
      for name, stored, stored_shape in self._spellings(config, key, tuple(shape)):
        if name in self._stored:
          self.problems.append(f"{name} is stored twice, as {self._stored[name].key} and as {key}")
        else:
          self._stored[name], self.shapes[name] = stored, stored_shape
    self.lora: dict[str, tuple[str, str]] = {}  # adapted weight -> its (lora_A, lora_B) names
    self._pair_lora_factors()

  def _spellings(self, config: MoshiConfig, key: str, shape: tuple[int, ...]):
    """(name, where it is stored, shape) of each LMModel tensor the file's `key` holds."""
    head, sep, tail = key.rpartition(".self_attn.")
    if sep and tail in FUSED_ATTENTION:
      which, factor = FUSED_ATTENTION[tail]
      sets = config.depformer.weight_sets if key.startswith("depformer.") and config.depformer else 1
      if shape[0] % sets:
        self.problems.append(f"{key}: {shape[0]} rows do not split into the attention's {sets} weight sets")
        return []
      n = shape[0] // sets
      return [(f"{head}.self_attn.{which}_projs.{i}.{factor}weight", _Stored(key, (i * n, (i + 1) * n)),
               (n, *shape[1:])) for i in range(sets)]
    part = _LORA_PART.fullmatch(key)
    if part and part["part"] == "frozen_W":
      return [(f"{part['module']}.{part['leaf']}", _Stored(key), shape)]
    return [(key, _Stored(key), shape)]

  def _pair_lora_factors(self) -> None:
    factors: dict[str, dict[str, str]] = {}
    for name in self.shapes:
      part = _LORA_PART.fullmatch(name)
      if part and part["part"] != "frozen_W" and part["leaf"] == "weight":
        factors.setdefault(part["module"], {})[part["part"]] = name
    for module, names in sorted(factors.items()):
      found = {part: self.shapes.pop(name) for part, name in names.items()}  # merged, never read on their own
      if len(found) == 1:
        (have,) = found
        lack = "lora_B" if have == "lora_A" else "lora_A"
        self.problems.append(f"LoRA factor {module}.{have}.weight has no {module}.{lack}.weight: the update "
                             "W + scaling * B @ A needs both")
        continue
      weight = f"{module}.weight"
      (rank, inputs), (outputs, rank_b) = found["lora_A"], found["lora_B"]
      if weight not in self.shapes:
        self.problems.append(f"LoRA factors {module}.lora_A/lora_B.weight have no {weight} (or frozen_W) to adapt")
      elif rank != rank_b or self.shapes[weight] != (outputs, inputs):
        self.problems.append(f"LoRA factors of {module} do not fit its weight: lora_B {found['lora_B']} @ lora_A "
                             f"{found['lora_A']} against {weight} {self.shapes[weight]}")
      else:
        self.lora[weight] = (names["lora_A"], names["lora_B"])

  def _read_stored(self, name: str) -> np.ndarray:
    stored = self._stored[name]
    array = self._read(stored.key)
    return array if stored.rows is None else array[stored.rows[0] : stored.rows[1]]

  def read(self, name: str) -> np.ndarray:
    array = self._read_stored(name)
    if name not in self.lora:
      return array
    down, up = (np.asarray(self._read_stored(n), np.float32) for n in self.lora[name])
    return np.asarray(array, np.float32) + self.lora_scaling * (up @ down)


def plan(config: MoshiConfig, state: LMStateDict) -> tuple[list[Rule], list[str], list[str]]:
  """(rules, problems, skipped names) of a state dict: what its spellings do not fit, every missing tensor (named
  with the leaf it feeds), every mis-shaped one and every tensor no rule reads."""
  ruled = rules(config)
  problems, rest = check_rules(set(traverse_util.flatten_dict(abstract_params(config))), ruled, state.shapes)
  problems = state.problems + problems
  skipped = [k for k in rest if k.startswith(SKIPPED_PREFIXES)]
  unexpected = [k for k in rest if k not in skipped]
  if unexpected:
    problems.append(f"{len(unexpected)} unexpected key(s) that no rule uses: {', '.join(unexpected[:20])}")
  return ruled, problems, skipped


def convert_leaves(config: MoshiConfig, ruled: list[Rule], read, dtype=np.float32
                   ) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """(leaf path, array) for every rule, reading each rule's source tensors only (`read(key) -> array`)."""
  abstract = traverse_util.flatten_dict(abstract_params(config))
  for rule in ruled:
    target = abstract[rule.target]
    arrays = [np.asarray(read(piece.key), np.float32) for piece in rule.pieces]
    yield rule.target, rule.assemble(arrays, tuple(target.shape)).astype(dtype)
