"""The array operations the JAX audio tokenizers share, on time-major features [batch, time, channels]: dense
layers and 1-D convolutions at fp32-exact precision, and the nearest-codebook search codes come from."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def matmul_precision(dtype) -> jax.lax.Precision:
  """fp32 must mean fp32 on accelerators too (TPU's default is one bf16 pass, GPUs' TF32): codes sit on argmins."""
  return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else jax.lax.Precision.DEFAULT


def dense(x, params: dict, precision=jax.lax.Precision.HIGHEST):
  """x @ kernel [in, out] (+ bias), in x's dtype."""
  y = jnp.einsum("...i,io->...o", x, params["kernel"].astype(x.dtype), precision=precision)
  return y + params["bias"].astype(x.dtype) if "bias" in params else y


def conv1d(x, params: dict, stride: int = 1, padding=((0, 0),), dilation: int = 1, groups: int = 1,
           precision=jax.lax.Precision.HIGHEST):
  """[B, T, C_in] -> [B, T', C_out] with kernel [width, C_in / groups, C_out] (+ bias); `padding` is XLA's
  ((left, right),) or "VALID"."""
  y = jax.lax.conv_general_dilated(x, params["kernel"].astype(x.dtype), window_strides=(stride,), padding=padding,
                                   rhs_dilation=(dilation,), dimension_numbers=("NWC", "WIO", "NWC"),
                                   feature_group_count=groups, precision=precision)
  return y + params["bias"].astype(x.dtype) if "bias" in params else y


def squared_distances(x, codebook):
  """[..., codes] |x|^2 + |c|^2 - 2 x.c in fp32 whatever the compute dtype, as torch's quantizers compute them."""
  x, codebook = x.astype(jnp.float32), codebook.astype(jnp.float32)
  cross = jnp.einsum("...d,cd->...c", x, codebook, precision=jax.lax.Precision.HIGHEST)
  return ((x * x).sum(-1, keepdims=True) + (codebook * codebook).sum(-1)) - 2.0 * cross


def nearest(x, codebook):
  """int32 index of each vector's nearest codebook entry (squared L2; the first of equal distances, as argmin)."""
  return jnp.argmin(squared_distances(x, codebook), axis=-1).astype(jnp.int32)
