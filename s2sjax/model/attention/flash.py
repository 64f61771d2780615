"""The `flash` and `flash_shared` kernels: Pallas's TPU flash attention (interpreted off TPU), which reads segment
ids, never a mask or a window. `flash` is one causal segment-masked pass, so it cannot express prefix-shared
branches; `flash_shared` cascades two passes merged by log-sum-exp and reads any packed rows."""

from __future__ import annotations

import contextlib

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from s2sjax.runtime import sharding
from s2sjax.runtime.errors import UserError


class FlashError(UserError, ValueError):
  """Rows the flash kernels cannot read: a length their blocks do not tile, or too long to number in int32."""


FLASH_IMPLEMENTATIONS = ("flash", "flash_shared")

# Segment ids that no query (_NO_QUERY) or no key (_NO_KEY) of a cascade pass holds: what they mark sees nothing.
_NO_QUERY, _NO_KEY = -1, -2


def flash_attention(q, k, v, segment_ids, branch_ids=None):
  """The Pallas kernel per device: XLA cannot partition a Mosaic kernel, so on a mesh (the Scorer's `set_mesh`)
  each device runs it on its own rows and heads under `shard_map`, split as the logical rules split q. With
  branch_ids: the prefix-sharing cascade (`_flash_cascade`), else one segment-masked pass (`_flash_kernel`)."""
  if segment_ids is None:
    raise ValueError("flash attention needs segment ids")
  length = q.shape[1]
  if length % 128:
    raise FlashError(f"flash attention needs a row length that is a multiple of 128, not {length}")
  groups = q.shape[2] // k.shape[2]
  k, v = (jnp.repeat(x, groups, axis=2) for x in (k, v))
  ids = (segment_ids,) if branch_ids is None else (segment_ids, branch_ids)
  per_device = _flash_kernel if branch_ids is None else _flash_cascade
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return per_device(q, k, v, *ids)
  spec = sharding.fit_spec(nn.logical_to_mesh_axes(("batch", "length", "heads", "head_dim")), q.shape, mesh)
  rows = PartitionSpec(spec[0], None)
  return jax.shard_map(per_device, mesh=mesh, in_specs=(spec, spec, spec) + (rows,) * len(ids), out_specs=spec,
                       check_vma=False)(q, k, v, *ids)


def _flash_call(q, k, v, q_segments, kv_segments, residuals=False):
  """One causal pass of the Pallas TPU flash kernel (interpreted off TPU) on q, k, v [batch, length, heads,
  head_dim] with k, v already repeated to q's heads: query i sees key j <= i where q_segments[i] == kv_segments[j].
  Returns the output in q's dtype, and with `residuals` also the kernel's per-query softmax max m and normalizer l
  [batch, length, heads] (fp32): the pass's log-sum-exp is m + log(l)."""
  from jax.experimental.pallas import tpu as pltpu
  from jax.experimental.pallas.ops.tpu import flash_attention as fa

  length, head_dim = q.shape[1], q.shape[3]
  to_bhld = lambda x: jnp.swapaxes(x, 1, 2)
  block = next(b for b in (512, 256, 128) if length % b == 0)
  segments = fa.SegmentIds(q_segments, kv_segments)
  interpret = pltpu.force_tpu_interpret_mode() if jax.default_backend() != "tpu" else contextlib.nullcontext()
  with interpret:
    if not residuals:
      sizes = fa.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1, block_q_major_dkv=block,
                            block_k_major_dkv=block, block_k_dkv=block, block_q_dkv=block,
                            block_k_major_dq=block, block_k_dq=block, block_q_dq=block)
      out = fa.flash_attention(to_bhld(q), to_bhld(k), to_bhld(v), segment_ids=segments, causal=True,
                               sm_scale=head_dim**-0.5, block_sizes=sizes)
      return to_bhld(out).astype(q.dtype)
    # The public entry point drops the residuals; its forward (no gradient is taken here) keeps them.
    out, l, m = fa._flash_attention_impl(to_bhld(q), to_bhld(k), to_bhld(v), ab=None, segment_ids=segments,
                                         save_residuals=True, causal=True, sm_scale=head_dim**-0.5, block_b=1,
                                         block_q=block, block_k_major=block, block_k=block, debug=False)
  return to_bhld(out).astype(q.dtype), to_bhld(m), to_bhld(l)


def _flash_kernel(q, k, v, segment_ids):
  return _flash_call(q, k, v, segment_ids, segment_ids)


def _flash_cascade(q, k, v, segment_ids, branch_ids):
  """Prefix-shared packed rows through the flash kernel, exactly: query i sees key j <= i of its segment when j is
  in the prefix (branch 0) or in i's own branch, a mask segment ids alone cannot express. Two causal passes:
    prefix  every query over its segment's prefix keys (branch keys get a segment id no query holds);
    branch  a candidate's queries over their own branch's keys (one id per (segment, branch));
            prefix queries hold an id no key holds.
  They are merged by their log-sum-exps: out = (e^lse_p o_p + e^lse_b o_b) / (e^lse_p + e^lse_b), in fp32. A
  query that a pass masks entirely (a prefix query in the branch pass) has, from the kernel, m at its finite mask
  value and a uniform average for output: its lse is taken as -inf, its weight 0. Padding (segment 0) is masked in
  both and gets zeros, not NaNs (the reference gives it a uniform softmax; no real token reads it)."""
  length = segment_ids.shape[-1]
  if (length + 1) ** 2 > jnp.iinfo(jnp.int32).max:
    raise FlashError(f"flash_shared numbers (segment, branch) pairs in int32: rows of {length} are too long")
  real, branch = segment_ids > 0, branch_ids > 0
  pair = segment_ids * (length + 1) + branch_ids
  passes = [
    (jnp.where(real, segment_ids, _NO_QUERY), jnp.where(real & ~branch, segment_ids, _NO_KEY)),
    (jnp.where(real & branch, pair, _NO_QUERY), jnp.where(real & branch, pair, _NO_KEY)),
  ]
  from jax.experimental.pallas.ops.tpu import flash_attention as fa

  outs, lses = [], []
  for q_segments, kv_segments in passes:
    out, m, l = _flash_call(q, k, v, q_segments.astype(jnp.int32), kv_segments.astype(jnp.int32), residuals=True)
    seen = m > 0.5 * fa.DEFAULT_MASK_VALUE  # at least one key unmasked: m is a real score, l >= 1
    outs.append(out.astype(jnp.float32))
    lses.append(jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf))
  top = jnp.maximum(*lses)
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  weights = [jnp.exp(lse - top) for lse in lses]  # [batch, length, heads]; 0 for a masked pass
  total = weights[0] + weights[1]
  merged = weights[0][..., None] * outs[0] + weights[1][..., None] * outs[1]
  return (merged / jnp.where(total > 0, total, 1.0)[..., None]).astype(q.dtype)
