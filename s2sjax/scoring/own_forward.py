"""Scoring with a language model's own forward: the model a training stack trains, as it runs it, whatever its
architecture, with no conversion.

`OwnForward(apply, vocab_size)` wraps a function of MaxText's shape, `apply(params, decoder_input_tokens,
decoder_positions, decoder_segment_ids) -> logits [batch, length, vocab]` (maxtext 0.2.5 `models/models.py:183`,
called so by `train.loss_fn`, `trainers/pre_train/train.py:184`): tokens sharing a segment id attend causally to
each other, segment 0 is padding, positions are each token's position within its segment. A levanter model is one
lambda away: `model(input_ids, attn_mask, pos_ids=...)` (levanter `models/llama.py:507`) with
`AttentionMask.causal().with_segment_ids(segments)` (`layers/attention.py:851,878`), in haliax's named arrays
(docs/training.md). `Evaluator(OwnForward(...), data)` scores with it: this module registers it as an
architecture (s2sjax/scoring/architectures) reading token rows.

Such a model reads no prefix tree (a candidate attending to its prefix and not to its sibling candidates), so the
built rows are laid again for it (`unshared_rows`): each candidate in a segment of its own behind its own copy of
the prefix, positions restarting per segment, packed first-fit into rows of the build's length. They come from the
same built data, so the two paths score exactly the same tokens after exactly the same prefixes; the cost is the
prefixes computed once per candidate instead of once per item, and full `[length, vocab]` logits (the model's own
head runs everywhere): a smaller batch than the shared path's is wise for a large vocabulary. On the project's own
decoder (`decoder_forward`) both paths give the same numbers within 1e-5 (tests/test_own_forward.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from s2sjax.scoring import architectures
from s2sjax.data import modalities
from s2sjax.model.attention import packed_attention_mask
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import Decoder
from s2sjax.data.packing import Item, RowShape, empty_rows, pack
from s2sjax.data.rows import TOKEN_ROWS
from s2sjax.scoring.scorer import ScoringError, _RowScorer, by_target_chunks, nll_and_missed

NAME = "own_forward"


@dataclasses.dataclass(frozen=True)
class OwnForward:
  """A model's own forward: `apply(params, tokens, positions, segment_ids) -> logits [B, L, vocab_size]`, ids and
  positions [B, L] int32 (module docstring). Hashable, as every architecture's config is."""

  apply: Callable[[Any, jax.Array, jax.Array, jax.Array], jax.Array]
  vocab_size: int
  name: str = "own forward"


def decoder_forward(config: ModelConfig, dtype=jnp.float32) -> OwnForward:
  """The project's decoder as an own forward (segment-causal attention, the full head): what the shared-prefix path
  is held equal to."""
  model = Decoder(config, dtype=dtype)

  def apply(params, tokens, positions, segment_ids):
    hidden = model.apply({"params": params}, tokens, positions, packed_attention_mask(segment_ids))
    return model.apply({"params": params}, hidden, method=Decoder.logits)

  return OwnForward(apply, config.vocab_size, f"{config.family} decoder")


def forward_batch(forward: OwnForward, target_chunk: int, params, batch: dict) -> dict:
  """Per target [B, M]: `target_nll` (fp32 logsumexp - logit of the target) and `target_missed` (the target is
  not the argmax), from the model's own logits at the positions that predict each target."""
  logits = forward.apply(params, batch["tokens"], batch["positions"], batch["segment_ids"])
  at_targets = jnp.take_along_axis(logits, batch["target_pos"][..., None], axis=1)  # [B, M, V]

  target_nll = lambda chosen, ids: nll_and_missed(chosen.astype(jnp.float32), ids)
  nll, missed = by_target_chunks(target_nll, target_chunk, at_targets, batch["target_ids"])
  return {"target_nll": nll, "target_missed": missed}


def unshared_rows(rows: dict[str, np.ndarray], shape: RowShape) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """Built token rows laid again for a model that reads segments only: every candidate slot becomes an item of its
  own (its segment's prefix, then its target tokens), packed without sharing into rows of `shape`. Returns the
  rows and, per item of them, the (row, slot) of the rows given that it scores."""
  items, origin = [], []
  for r in range(len(rows["segment_ids"])):
    for slot in np.flatnonzero(rows["slot_item"][r] >= 0):
      scored = rows["target_slot"][r] == slot
      segment = rows["segment_ids"][r, rows["target_pos"][r][scored][0]]  # the first is read at the prefix's end
      prefix = rows["tokens"][r][(rows["segment_ids"][r] == segment) & (rows["branch_ids"][r] == 0)]
      items.append(Item(prefix, (rows["target_ids"][r][scored],), name=f"row {r} slot {slot}"))
      origin.append((r, slot))
  laid, _ = pack(items, dataclasses.replace(shape, num_codebooks=0), share_prefix=False)
  return laid, np.asarray(origin, np.int64).reshape(-1, 2)


class OwnForwardScorer(_RowScorer):
  """The scoring step over a model's own forward: rows laid again without sharing (`unshared_rows`), scored, and
  the sums handed back in the given rows' slots."""

  def __init__(self, forward: OwnForward, shape: RowShape, mesh: Mesh | None = None, batch_size: int = 8,
               dtype=jnp.float32, attention: str = "xla", target_chunk: int | None = None):
    del dtype, attention  # the model's own business
    self.forward = forward
    self._laid: dict[str, tuple[dict[str, np.ndarray], np.ndarray]] = {}
    super().__init__(forward, shape, mesh, batch_size, None, None, TOKEN_ROWS.step_fields,
                     {name: 3 for name in TOKEN_ROWS.wide}, lambda count, rows: empty_rows(count, shape),
                     lambda chunk, params, batch: forward_batch(forward, chunk, params, batch), target_chunk)

  def laid(self, rows: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """`unshared_rows` of these rows, made once per distinct set of rows."""
    key = hashlib.sha256(b"".join(np.ascontiguousarray(rows[name]).tobytes()
                                  for name in ("tokens", "segment_ids", "target_ids", "slot_item"))).hexdigest()
    if key not in self._laid:
      self._laid[key] = unshared_rows(rows, self.shape)
    return self._laid[key]

  def score(self, params, rows: dict[str, np.ndarray], progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(nll_sum, n_tokens) [R, C] in the slots of `rows`, as the shared-prefix Scorer returns them."""
    for field in ("tokens", "target_ids"):
      bad = np.argwhere((rows[field] < 0) | (rows[field] >= self.forward.vocab_size))
      if len(bad):
        raise ScoringError(f"{field}[row {bad[0][0]}, position {bad[0][1]}] = {rows[field][tuple(bad[0])]} is outside "
                           f"{self.forward.name}'s {self.forward.vocab_size} ids")
    laid, origin = self.laid(rows)
    slots = self._score_rows(params, laid, progress)
    nll_sum = np.full(rows["slot_item"].shape, np.nan)
    n_tokens = np.zeros(rows["slot_item"].shape, np.int64)
    row, slot = np.nonzero(laid["slot_item"] >= 0)
    source = origin[laid["slot_item"][row, slot]]
    nll_sum[source[:, 0], source[:, 1]] = slots["nll_sum"][row, slot]
    n_tokens[source[:, 0], source[:, 1]] = slots["n_tokens"][row, slot]
    return nll_sum, n_tokens


def check_fit(forward: OwnForward, data) -> None:
  """A model's own forward reads token ids: units in its vocabulary, not codebook tables at a placeholder."""
  if modalities.get(data.modality).speaks and data.metadata.spec.audio_mode != "extended_vocab":
    raise architectures.FitError(f"{data.task}/{data.modality}: spec {data.metadata.spec.name} feeds audio as "
                                 f"{data.metadata.spec.audio_mode}; {forward.name} reads token ids only (audio units "
                                 "in its vocabulary, spec audio_mode extended_vocab)")


def _no_tree(*_):
  raise architectures.FitError("an own forward's parameters are its owner's: it has no parameter tree of this project")


OWN_FORWARD = architectures.register(architectures.Architecture(
  NAME, OwnForward, TOKEN_ROWS, abstract_params=_no_tree, param_logical_axes=_no_tree, scorer=OwnForwardScorer,
  text_rows=lambda forward: forward.vocab_size, check_fit=check_fit))
