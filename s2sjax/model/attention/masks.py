"""Which keys each query of a packed row may attend to: the dense [L, L] mask, and item-local windows (queries in
blocks, each over the keys its items can reach) with their own mask."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp


def packed_attention_mask(segment_ids: jax.Array, branch_ids: jax.Array | None = None) -> jax.Array:
  """[batch, L, L] bool for packed rows: query i sees key j when they share a non-zero segment, j <= i, and j is
  in the shared prefix (branch 0) or in i's own branch. Without branch ids: plain causal packed sequences."""
  length = segment_ids.shape[-1]
  causal = jnp.tril(jnp.ones((length, length), dtype=bool))
  mask = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, :, None] > 0) & causal
  if branch_ids is None:
    return mask
  return mask & ((branch_ids[:, None, :] == 0) | (branch_ids[:, :, None] == branch_ids[:, None, :]))


@dataclasses.dataclass(frozen=True)
class LocalWindow:
  """Item-local attention's static shape: queries in blocks of `block`, each seeing the `reach` keys before its
  block and the block itself. Exact when no item spans more than `reach + 1` tokens: items are laid contiguously,
  so a query never sees a key further back than its item's first token."""

  block: int
  reach: int

  @property
  def span(self) -> int:
    return self.reach + self.block


# Queries per block: narrower blocks waste fewer keys (a block sees up to block - 1 keys of the next item), wider
# ones make larger matmuls; 32 ran fastest on a CPU (docs/benchmarks/README.md, "Which attention `auto` picks").
LOCAL_BLOCK = 32


def local_window(max_item: int, length: int) -> LocalWindow | None:
  """The window for rows of `length` whose items span at most `max_item` tokens (0: unknown), or None when none
  applies (a row length that is not a multiple of the block) or it would not be narrower than the row."""
  if max_item <= 0 or length % LOCAL_BLOCK:
    return None
  window = LocalWindow(LOCAL_BLOCK, -(-(max_item - 1) // LOCAL_BLOCK) * LOCAL_BLOCK)
  return window if window.span < length else None


def key_windows(x: jax.Array, window: LocalWindow) -> jax.Array:
  """[batch, length, ...] -> [batch, blocks, span, ...]: block n's window is row positions n*block - reach up to
  its own last one, padded on the left; built from reach/block + 1 shifted views of the blocks, not one slice each."""
  batch, length = x.shape[:2]
  blocks, shifts = length // window.block, window.reach // window.block
  padded = jnp.pad(x, [(0, 0), (window.reach, 0)] + [(0, 0)] * (x.ndim - 2))
  by_block = padded.reshape(batch, blocks + shifts, window.block, *x.shape[2:])
  return jnp.concatenate([by_block[:, j : j + blocks] for j in range(shifts + 1)], axis=2)


def local_window_mask(segment_ids: jax.Array, branch_ids: jax.Array | None, window: LocalWindow) -> jax.Array:
  """[batch, blocks, block, span] bool: `packed_attention_mask` read through the windows, query a of block n being
  row position n*block + a and key t of its window position n*block - reach + t. Built once per step, outside
  the layers. Padding keys (left of the row) are segment 0 and so masked."""
  batch, length = segment_ids.shape
  by_block = lambda x: x.reshape(batch, length // window.block, window.block)
  query_segment, key_segment = by_block(segment_ids)[..., :, None], key_windows(segment_ids, window)[..., None, :]
  causal = jnp.arange(window.span)[None, :] <= jnp.arange(window.block)[:, None] + window.reach
  mask = (query_segment == key_segment) & (query_segment > 0) & causal
  if branch_ids is None:
    return mask
  query_branch, key_branch = by_block(branch_ids)[..., :, None], key_windows(branch_ids, window)[..., None, :]
  return mask & ((key_branch == 0) | (query_branch == key_branch))


class GatheredWindows(NamedTuple):
  """Item-local windows whose keys are read from where `keys` says (`gathered_windows`): `mask` as
  `local_window_mask`'s [batch, blocks, block, span], `keys` [batch, blocks, span] the position of each window key
  in the row padded on the left by the window's reach."""

  mask: jax.Array
  keys: jax.Array


def gathered_windows(segment_ids: jax.Array, branch_ids: jax.Array, key_shift: jax.Array,
                     window: LocalWindow) -> GatheredWindows:
  """Windows for rows whose shared roots' items lie `key_shift` [batch, L] past where each item alone lays them
  (packing.SharedRoot; 0 everywhere else): every query block sees the window it would see with its item laid alone,
  key for key, so its scores are the same bits. A block's shift is its first position's (a shifted rest starts
  at a block). Its window's key t is the one at c = block start - shift - reach + t in the item-alone layout: read
  from c + shift when that is a token of the block's own branch (the item's rest), else from c (the root, whatever
  lies before it, and keys the causal mask drops). With no shift the windows are `key_windows`' and the mask is
  `local_window_mask`'s."""
  batch, length = segment_ids.shape
  blocks = length // window.block
  first = lambda x: x[:, :: window.block][..., None]  # [batch, blocks, 1]: each block's first position
  shift = first(key_shift)
  alone = (jnp.arange(blocks) * window.block)[:, None] - shift + jnp.arange(window.span) - window.reach
  padded = lambda x: jnp.pad(x, [(0, 0), (window.reach, 0)])
  at = lambda x, positions: jnp.take_along_axis(padded(x), (positions + window.reach).reshape(batch, -1),
                                                axis=1).reshape(positions.shape)
  moved = alone + shift
  own = (at(segment_ids, moved) == first(segment_ids)) & (at(branch_ids, moved) == first(branch_ids))
  keys = jnp.where(own, moved, alone) + window.reach
  by_block = lambda x: x.reshape(batch, blocks, window.block)[..., :, None]
  key_at = lambda x: jnp.take_along_axis(padded(x), keys.reshape(batch, -1), axis=1).reshape(keys.shape)[..., None, :]
  query_segment, key_segment = by_block(segment_ids), key_at(segment_ids)
  causal = jnp.arange(window.span)[None, :] <= jnp.arange(window.block)[:, None] + window.reach
  mask = (query_segment == key_segment) & (query_segment > 0) & causal
  query_branch, key_branch = by_block(branch_ids), key_at(branch_ids)
  return GatheredWindows(mask & ((key_branch == 0) | (query_branch == key_branch)), keys)
