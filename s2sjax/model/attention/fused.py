"""The `dot_product` and `cudnn` kernels: `jax.nn.dot_product_attention` as XLA lowers it, or on cuDNN's fused
kernel (GPU only, bf16 or fp16), over whole rows or item-local over each query block's key window."""

from __future__ import annotations

import contextlib

import jax

from s2sjax.model.attention.masks import LocalWindow, key_windows

# Our names -> the `implementation` jax.nn.dot_product_attention is asked for (None: jax picks XLA).
FUSED_IMPLEMENTATIONS = {"dot_product": None, "cudnn": "cudnn"}


def dense_attention(q, k, v, mask, precision, implementation):
  """`jax.nn.dot_product_attention` over [batch, length, heads, head_dim] with a [batch, q, k] mask."""
  # the fused call takes no precision argument: the context carries fp32's HIGHEST into its matmuls
  highest = precision == jax.lax.Precision.HIGHEST
  with jax.default_matmul_precision("highest") if highest else contextlib.nullcontext():
    out = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=q.shape[-1] ** -0.5,
                                       implementation=FUSED_IMPLEMENTATIONS[implementation])
  return out.astype(q.dtype)


def local_attention(q, k, v, mask, window: LocalWindow, precision, implementation):
  """The same call with each query block a batch row of its own, over its window's keys (`mask` from
  `local_window_mask`)."""
  batch, length, heads, head_dim = q.shape
  blocks = length // window.block
  flat = lambda x: x.reshape(batch * blocks, *x.shape[2:])
  q_blocks = q.reshape(batch * blocks, window.block, heads, head_dim)
  out = dense_attention(q_blocks, flat(key_windows(k, window)), flat(key_windows(v, window)), flat(mask), precision,
                        implementation)
  return out.reshape(batch, length, heads, head_dim)
