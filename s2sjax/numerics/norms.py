"""RMSNorm and LayerNorm as transformers and torch compute them, shared by the decoder and the audio tokenizers.

Precision rule (docs/architecture.md, "Numbers"): the statistics are computed in fp32 whatever the compute dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """HF's RMSNorm: variance in fp32, normalised value cast back to the input dtype, then scaled."""
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return scale.astype(x.dtype) * normed.astype(x.dtype)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
  """torch's LayerNorm (OPT): mean and variance in fp32, normalised value cast back to the input dtype, then scaled
  and shifted."""
  x32 = x.astype(jnp.float32)
  centered = x32 - jnp.mean(x32, axis=-1, keepdims=True)
  normed = centered * jax.lax.rsqrt(jnp.mean(centered * centered, axis=-1, keepdims=True) + eps)
  return scale.astype(x.dtype) * normed.astype(x.dtype) + bias.astype(x.dtype)
