"""Masked grouped-query attention: one entry point (`masked_attention`) over the kernels, one module per kernel family,
and the one rule for which kernel `--attention=auto` runs (`auto_implementation`).

  masks   which keys a query sees: the packed rows' dense mask, item-local windows (`LocalWindow`) and their mask
  xla     our einsums with fp32 scores and softmax, any backend: the reference
  fused   `jax.nn.dot_product_attention`: `dot_product` as XLA lowers it, `cudnn` on cuDNN's fused kernel
  flash   the Pallas TPU kernel: `flash` (one pass), `flash_shared` (two cascaded passes, prefix-shared rows)

Precision rules (docs/architecture.md, "Numbers"): the softmax and every logsumexp are computed in fp32 whatever the
compute dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from s2sjax.model.attention import flash, fused, xla
from s2sjax.model.attention.flash import FLASH_IMPLEMENTATIONS
from s2sjax.model.attention.fused import FUSED_IMPLEMENTATIONS
from s2sjax.model.attention.masks import (LOCAL_BLOCK, GatheredWindows, LocalWindow, gathered_windows,
  local_window, local_window_mask, packed_attention_mask)
from s2sjax.model.attention.xla import MASKED_SCORE

ATTENTION_IMPLEMENTATIONS = ("xla",) + tuple(FUSED_IMPLEMENTATIONS) + FLASH_IMPLEMENTATIONS

__all__ = [
  "ATTENTION_IMPLEMENTATIONS", "FLASH_IMPLEMENTATIONS", "FUSED_IMPLEMENTATIONS", "LOCAL_BLOCK", "MASKED_SCORE",
  "GatheredWindows", "LocalWindow", "auto_implementation", "gathered_windows", "local_attention",
  "local_window", "local_window_mask", "masked_attention", "packed_attention_mask",
]


def auto_implementation(shared: bool, windowed: bool, dtype) -> str:
  """What `--attention=auto` runs for rows with prefix-shared branches (`shared`) and item-local windows
  (`windowed`): on TPU the Pallas flash kernel, in one pass without sharing (`flash`), in two cascaded passes merged
  by log-sum-exp with it (`flash_shared`); on a GPU in bf16/fp16 cuDNN's fused kernel (`cudnn`); elsewhere, over
  item-local windows, our einsums (`xla`), and over whole rows `dot_product` as XLA lowers it. Each is the fastest
  measured where it runs (docs/benchmarks/README.md: the GPU's MFU table, and "Which attention `auto` picks on a
  CPU")."""
  if jax.default_backend() == "tpu":
    return "flash_shared" if shared else "flash"
  if jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
    return "cudnn"
  return "xla" if windowed else "dot_product"


def masked_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  mask: jax.Array,
  precision: jax.lax.Precision | None = None,
  implementation: str = "xla",
  segment_ids: jax.Array | None = None,
  branch_ids: jax.Array | None = None,
  window: LocalWindow | None = None,
) -> jax.Array:
  """Masked grouped-query attention.

  q [batch, length, heads, head_dim]; k, v [batch, length, kv_heads, head_dim];
  mask [batch, length(query), length(key)] bool, True where the query may attend to the key (with a `window`: below).
  Returns [batch, length, heads, head_dim] in q's dtype. Implementations:
    xla          einsums, fp32 scores and softmax (any backend; the reference);
    dot_product  `jax.nn.dot_product_attention` as XLA lowers it (jax picks XLA when no implementation is named);
    cudnn        the same call on cuDNN's fused kernel: GPU only, bf16 or fp16;
    flash        the Pallas TPU flash kernel with segment ids + causal masking (interpreted off TPU). It cannot
                 express prefix-shared branches: use it on rows built without sharing.
    flash_shared the same kernel twice, cascaded (flash.py): any packed rows, prefix-shared or not.
  The flash implementations read segment_ids (and branch_ids), never the mask or a window. With a `window` (the
  fused ones and xla) the mask is `local_window_mask`'s [batch, blocks, block, span]: each query block attends
  over the keys of its window only (`local_attention`), or `gathered_windows`' mask and key positions (xla).
  """
  if window is not None and implementation not in FLASH_IMPLEMENTATIONS:
    return local_attention(q, k, v, mask, window, precision, implementation)
  if implementation in FUSED_IMPLEMENTATIONS:
    return fused.dense_attention(q, k, v, mask, precision, implementation)
  if implementation == "flash":
    return flash.flash_attention(q, k, v, segment_ids)
  if implementation == "flash_shared":
    branches = jnp.zeros_like(segment_ids) if branch_ids is None else branch_ids
    return flash.flash_attention(q, k, v, segment_ids, branches)
  if implementation != "xla":
    raise ValueError(f"attention implementation {implementation!r} is not one of {ATTENTION_IMPLEMENTATIONS}")
  return xla.dense_attention(q, k, v, mask, precision)


def local_attention(q, k, v, mask, window: LocalWindow, precision=None, implementation="xla"):
  """Attention of packed rows by query blocks over each block's key window (`mask` from `local_window_mask`):
  cost L x span, not L x L. A padding query (segment 0) sees nothing and gets a uniform softmax over its window,
  not over the row: only padding positions differ from the dense path, and no real token reads them. With
  `GatheredWindows` (shared roots, neighbour-free scoring) each window's keys are read where it says: xla only."""
  if isinstance(mask, GatheredWindows):
    if implementation != "xla":
      raise ValueError(f"attention implementation {implementation!r} has no gathered windows (xla)")
    return xla.local_attention(q, k, v, mask.mask, window, precision, keys=mask.keys)
  if implementation in FUSED_IMPLEMENTATIONS:
    return fused.local_attention(q, k, v, mask, window, precision, implementation)
  if implementation != "xla":
    raise ValueError(f"attention implementation {implementation!r} has no item-local path (xla, dot_product, cudnn)")
  return xla.local_attention(q, k, v, mask, window, precision)
