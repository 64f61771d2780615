"""The `xla` kernels, our einsums with fp32 scores and softmax (any backend; the reference the others are held to):
over whole rows with a [batch, L, L] mask, or item-local over each query block's key window."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from s2sjax.scoring.model.attention.masks import LocalWindow, key_windows

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


def local_attention(q, k, v, mask, window: LocalWindow, precision=None):
  """The same by query blocks over their windows (`mask` from `local_window_mask`)."""
  batch, length, heads, head_dim = q.shape
  kv_heads, block = k.shape[2], window.block
  blocks, groups = length // block, heads // kv_heads
  # A kv head's query group stacked along the block, batch axes leading: each window is one [groups * block,
  # head_dim] x [head_dim, span] matmul that XLA runs without transposing inside the dot.
  q = q.reshape(batch, blocks, block, kv_heads, groups, head_dim).transpose(0, 1, 3, 4, 2, 5)
  q = q.reshape(batch, blocks, kv_heads, groups * block, head_dim)
  k, v = (key_windows(x, window).transpose(0, 1, 3, 2, 4) for x in (k, v))  # [batch, blocks, kv_heads, span, d]
  scores = jnp.einsum("bnkqd,bnksd->bnkqs", q, k, precision=precision, preferred_element_type=jnp.float32)
  mask = jnp.tile(mask[:, :, None], (1, 1, 1, groups, 1))  # [batch, blocks, 1, groups * block, span], as q
  scores = jnp.where(mask, scores * head_dim**-0.5, MASKED_SCORE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bnkqs,bnksd->bnkqd", probs, v, precision=precision)
  out = out.reshape(batch, blocks, kv_heads, groups, block, head_dim).transpose(0, 1, 4, 2, 3, 5)
  return out.reshape(batch, length, heads, head_dim)
