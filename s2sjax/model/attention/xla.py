"""The `xla` kernels, our einsums with fp32 scores and softmax (any backend; the reference the others are held to):
over whole rows with a [batch, L, L] mask, or item-local over each query block's key window."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from s2sjax.model.attention.masks import LocalWindow, key_windows

# A finite "minus infinity": a row whose every key is masked (padding) gets a uniform softmax instead of NaNs.
MASKED_SCORE = -1e30


def dense_attention(q, k, v, mask, precision=None):
  """Grouped-query attention of q [batch, length, heads, head_dim] over k, v [batch, length, kv_heads, head_dim]
  where mask [batch, query, key] is True."""
  batch, length, heads, head_dim = q.shape
  kv_heads = k.shape[2]
  q = q.reshape(batch, length, kv_heads, heads // kv_heads, head_dim)
  scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k, precision=precision, preferred_element_type=jnp.float32)
  scores = jnp.where(mask[:, None, None], scores * head_dim**-0.5, MASKED_SCORE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgqs,bskd->bqkgd", probs, v, precision=precision)
  return out.reshape(batch, length, heads, head_dim)


def loops_over_blocks(platform: str) -> bool:
  """Whether `local_attention` computes its query blocks one after another on this platform (below)."""
  return platform == "cpu"


def local_attention(q, k, v, mask, window: LocalWindow, precision=None, looped: bool | None = None, keys=None):
  """The same by query blocks over their windows (`mask` from `local_window_mask`; with `keys`, the windows'
  key positions from `gathered_windows`, the keys are read from there).

  `looped` (default: `loops_over_blocks` of jax's backend, a CPU) computes the blocks one after another
  (`lax.map` over the blocks, the rows and heads of each at once): a block's scores stay in the caches instead of
  every block's going out to memory and back, the softmax's passes included. Same bits either way; on a 2-core
  CPU a SmolLM2 layer over 12 rows of 1,024 with 768 keys of reach ran 1.29 s all at once and 0.49 s looped
  (docs/benchmarks/README.md). The loop runs along the row, so rows and heads sharded over a mesh stay where they
  are; on an accelerator one batched matmul over every block is the faster form."""
  batch, length, heads, head_dim = q.shape
  kv_heads, block = k.shape[2], window.block
  blocks, groups = length // block, heads // kv_heads
  # A kv head's query group stacked along the block, batch axes leading: each window is one [groups * block,
  # head_dim] x [head_dim, span] matmul that XLA runs without transposing inside the dot.
  q = q.reshape(batch, blocks, block, kv_heads, groups, head_dim).transpose(0, 1, 3, 4, 2, 5)
  q = q.reshape(batch, blocks, kv_heads, groups * block, head_dim)

  def attend(q, k, v, mask):  # [..., kv_heads, queries, d] over [..., kv_heads, span, d]; mask [..., block, span]
    scores = jnp.einsum("...kqd,...ksd->...kqs", q, k, precision=precision, preferred_element_type=jnp.float32)
    mask = jnp.tile(mask, (groups, 1))[..., None, :, :]  # [..., 1, groups * block, span], as q
    scores = jnp.where(mask, scores * head_dim**-0.5, MASKED_SCORE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("...kqs,...ksd->...kqd", probs, v, precision=precision)

  if loops_over_blocks(jax.default_backend()) if looped is None else looped:
    # keys as [batch, kv_heads, reach + length, d], padded on the left: block n's window starts at n * block
    padded = lambda x: jnp.pad(x, [(0, 0), (window.reach, 0), (0, 0), (0, 0)]).transpose(0, 2, 1, 3)
    k, v = padded(k), padded(v)
    if keys is None:
      window_of = lambda x, n: jax.lax.dynamic_slice_in_dim(x, n * block, window.span, axis=2)
      index = jnp.arange(blocks)
    else:  # [batch, span]: block n's key positions
      window_of = lambda x, at: jnp.take_along_axis(x, at[:, None, :, None], axis=2)
      index = keys.swapaxes(0, 1)
    out = jax.lax.map(lambda blk: attend(blk[1], window_of(k, blk[0]), window_of(v, blk[0]), blk[2]),
                      (index, q.swapaxes(0, 1), mask.swapaxes(0, 1))).swapaxes(0, 1)
  else:
    if keys is None:
      k, v = (key_windows(x, window) for x in (k, v))
    else:
      gather = lambda x: jnp.take_along_axis(jnp.pad(x, [(0, 0), (window.reach, 0), (0, 0), (0, 0)]),
                                             keys.reshape(batch, -1)[..., None, None], axis=1)
      k, v = (gather(x).reshape(batch, blocks, window.span, *x.shape[2:]) for x in (k, v))
    k, v = (x.transpose(0, 1, 3, 2, 4) for x in (k, v))  # [batch, blocks, kv_heads, span, d]
    out = attend(q, k, v, mask)
  out = out.reshape(batch, blocks, kv_heads, groups, block, head_dim).transpose(0, 1, 4, 2, 3, 5)
  return out.reshape(batch, length, heads, head_dim)
