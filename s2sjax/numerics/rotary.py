"""Pure functions for the decoder's math: rotary embeddings (the norms, which the audio tokenizers run too, are
s2sjax/numerics/norms.py; masked grouped-query attention, its kernels, masks and `auto` rule, s2sjax/model/attention/).

Precision rule (docs/architecture.md, "Numbers"): the rotary angles are computed in fp32 whatever the compute dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rotary_angles(positions: jax.Array, rotary_dim: int, theta: float,
                  scaling: tuple[float, ...] = ()) -> tuple[jax.Array, jax.Array]:
  """cos and sin, [batch, length, rotary_dim // 2] in fp32, for integer positions [batch, length]; `scaling`:
  Llama 3.1's (`llama3_frequencies`), or () for none."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim))
  if scaling:
    inv_freq = llama3_frequencies(inv_freq, *scaling)
  angles = positions.astype(jnp.float32)[..., None] * inv_freq
  return jnp.cos(angles), jnp.sin(angles)


def llama3_frequencies(inv_freq: jax.Array, factor: float, low_freq_factor: float, high_freq_factor: float,
                       original_context: float) -> jax.Array:
  """Llama 3.1's rope frequencies (transformers' rope_type "llama3"; MaxText's LLaMARotaryEmbedding, maxtext 0.2.5
  layers/embeddings.py:501): wavelengths shorter than original_context / high_freq_factor are kept, those longer
  than original_context / low_freq_factor slowed by `factor`, and the band between blended linearly in
  original_context / wavelength."""
  wavelength = 2 * jnp.pi / inv_freq
  slowed = inv_freq / factor
  blend = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
  between = (1 - blend) * slowed + blend * inv_freq
  return jnp.where(wavelength < original_context / high_freq_factor, inv_freq,
                   jnp.where(wavelength > original_context / low_freq_factor, slowed, between))


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array, interleaved: bool) -> jax.Array:
  """Rotates the first `2 * cos.shape[-1]` dims of every head of x [batch, length, heads, head_dim].

  interleaved=False pairs dim i with dim i + rotary_dim/2 (HF "rotate_half": Qwen2, Llama);
  interleaved=True pairs dims (2i, 2i+1) (GLM-4's ChatGLM rope and transformers' Glm).
  """
  rotary_dim = 2 * cos.shape[-1]
  rot, rest = x[..., :rotary_dim].astype(jnp.float32), x[..., rotary_dim:]
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]
  if interleaved:
    even, odd = rot[..., 0::2], rot[..., 1::2]
    rotated = jnp.stack([even * cos - odd * sin, odd * cos + even * sin], axis=-1).reshape(rot.shape)
  else:
    first, second = jnp.split(rot, 2, axis=-1)
    rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
  return jnp.concatenate([rotated.astype(x.dtype), rest], axis=-1)
