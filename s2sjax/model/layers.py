"""Pure functions for the decoder's math: RMSNorm and LayerNorm, rotary embeddings, masked grouped-query attention.

Precision rules (docs/architecture.md, "Numbers"): the norms' statistics, the rotary angles, the softmax and every
logsumexp are computed in fp32 whatever the compute dtype.
"""

from __future__ import annotations

import contextlib
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from s2sjax import sharding

# A finite "minus infinity": a row whose every key is masked (padding) gets a uniform softmax instead of NaNs.
MASKED_SCORE = -1e30


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


def rotary_angles(positions: jax.Array, rotary_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
  """cos and sin, [batch, length, rotary_dim // 2] in fp32, for integer positions [batch, length]."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq
  return jnp.cos(angles), jnp.sin(angles)


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


ATTENTION_IMPLEMENTATIONS = ("xla", "dot_product", "cudnn", "flash", "flash_shared")
# Through `jax.nn.dot_product_attention`: its XLA lowering, or cuDNN's fused kernel (GPU, bf16/fp16 only).
FUSED_IMPLEMENTATIONS = {"dot_product": None, "cudnn": "cudnn"}
# The Pallas kernels read segment and branch ids, not a mask or an item-local window.
FLASH_IMPLEMENTATIONS = ("flash", "flash_shared")


def auto_implementation(shared: bool, windowed: bool, dtype) -> str:
  """What `--attention=auto` runs for rows with prefix-shared branches (`shared`) and item-local windows
  (`windowed`): on TPU the Pallas flash kernel, in one pass without sharing (`flash`), in two cascaded passes merged
  by log-sum-exp with it (`flash_shared`); on a GPU in bf16/fp16 cuDNN's fused kernel (`cudnn`: 54.8% MFU at 7B on
  an H200, against 51.2% for XLA's einsums); elsewhere, over item-local windows, our einsums (`xla`: on this
  project's 2-core CPU, 4 steps of speech-like rows took 21.8 s against 26.3 s through
  `jax.nn.dot_product_attention`, best of four runs, alternating), and over whole rows `dot_product` as XLA lowers
  it (on CPU 10% faster than our einsums at L=1024, 2.5x at 2048)."""
  if jax.default_backend() == "tpu":
    return "flash_shared" if shared else "flash"
  if jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
    return "cudnn"
  return "xla" if windowed else "dot_product"


def attention(
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
    flash_shared the same kernel twice, cascaded (`_flash_cascade`): any packed rows, prefix-shared or not.
  The flash implementations read segment_ids (and branch_ids), never the mask or a window. With a `window` (the
  fused ones and xla) the mask is `local_window_mask`'s [batch, blocks, block, span]: each query block attends
  over the keys of its window only (`local_attention`).
  """
  if window is not None and implementation not in FLASH_IMPLEMENTATIONS:
    return local_attention(q, k, v, mask, window, precision, implementation)
  batch, length, heads, head_dim = q.shape
  kv_heads = k.shape[2]
  if implementation in FUSED_IMPLEMENTATIONS:
    return _fused_attention(q, k, v, mask, precision, implementation)
  if implementation == "flash":
    return _flash_attention(q, k, v, segment_ids)
  if implementation == "flash_shared":
    if branch_ids is None:
      branch_ids = jnp.zeros_like(segment_ids)
    return _flash_attention(q, k, v, segment_ids, branch_ids)
  if implementation != "xla":
    raise ValueError(f"attention implementation {implementation!r} is not one of {ATTENTION_IMPLEMENTATIONS}")
  q = q.reshape(batch, length, kv_heads, heads // kv_heads, head_dim)
  scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k, precision=precision, preferred_element_type=jnp.float32)
  scores = jnp.where(mask[:, None, None], scores * head_dim**-0.5, MASKED_SCORE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgqs,bskd->bqkgd", probs, v, precision=precision)
  return out.reshape(batch, length, heads, head_dim)


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
# ones make larger matmuls. 32 measured fastest on a 2-core CPU over 30 SmolLM2-135M layers (2 rows of 1024,
# best of five): StoryCloze rows 538 ms against 698 at 64 (16: 536), speech-like rows 1.39 s against 1.43 (16: 1.65).
LOCAL_BLOCK = 32


def local_window(max_item: int, length: int) -> LocalWindow | None:
  """The window for rows of `length` whose items span at most `max_item` tokens (0: unknown), or None when none
  applies (a row length that is not a multiple of the block) or it would not be narrower than the row."""
  if max_item <= 0 or length % LOCAL_BLOCK:
    return None
  window = LocalWindow(LOCAL_BLOCK, -(-(max_item - 1) // LOCAL_BLOCK) * LOCAL_BLOCK)
  return window if window.span < length else None


def _key_windows(x: jax.Array, window: LocalWindow) -> jax.Array:
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
  query_segment, key_segment = by_block(segment_ids)[..., :, None], _key_windows(segment_ids, window)[..., None, :]
  causal = jnp.arange(window.span)[None, :] <= jnp.arange(window.block)[:, None] + window.reach
  mask = (query_segment == key_segment) & (query_segment > 0) & causal
  if branch_ids is None:
    return mask
  query_branch, key_branch = by_block(branch_ids)[..., :, None], _key_windows(branch_ids, window)[..., None, :]
  return mask & ((key_branch == 0) | (query_branch == key_branch))


def local_attention(q, k, v, mask, window: LocalWindow, precision=None, implementation="xla"):
  """Attention of packed rows by query blocks over each block's key window (`mask` from `local_window_mask`):
  cost L x span, not L x L. A padding query (segment 0) sees nothing and gets a uniform softmax over its window,
  not over the row: only padding positions differ from the dense path, and no real token reads them."""
  batch, length, heads, head_dim = q.shape
  kv_heads, block, span = k.shape[2], window.block, window.span
  blocks, groups = length // block, heads // kv_heads
  if implementation in FUSED_IMPLEMENTATIONS:
    flat = lambda x: x.reshape(batch * blocks, *x.shape[2:])
    q_blocks = q.reshape(batch * blocks, block, heads, head_dim)
    out = _fused_attention(q_blocks, flat(_key_windows(k, window)), flat(_key_windows(v, window)), flat(mask),
                           precision, implementation)
    return out.reshape(batch, length, heads, head_dim)
  if implementation != "xla":
    raise ValueError(f"attention implementation {implementation!r} has no item-local path (xla, dot_product, cudnn)")
  # A kv head's query group stacked along the block, batch axes leading: each window is one [groups * block,
  # head_dim] x [head_dim, span] matmul that XLA runs without transposing inside the dot (on a 2-core CPU, with
  # the mask built once per step too: 538 ms against 673 over 30 SmolLM2 layers, blocks of 32).
  q = q.reshape(batch, blocks, block, kv_heads, groups, head_dim).transpose(0, 1, 3, 4, 2, 5)
  q = q.reshape(batch, blocks, kv_heads, groups * block, head_dim)
  k, v = (_key_windows(x, window).transpose(0, 1, 3, 2, 4) for x in (k, v))  # [batch, blocks, kv_heads, span, d]
  scores = jnp.einsum("bnkqd,bnksd->bnkqs", q, k, precision=precision, preferred_element_type=jnp.float32)
  mask = jnp.tile(mask[:, :, None], (1, 1, 1, groups, 1))  # [batch, blocks, 1, groups * block, span], as q
  scores = jnp.where(mask, scores * head_dim**-0.5, MASKED_SCORE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bnkqs,bnksd->bnkqd", probs, v, precision=precision)
  out = out.reshape(batch, blocks, kv_heads, groups, block, head_dim).transpose(0, 1, 4, 2, 3, 5)
  return out.reshape(batch, length, heads, head_dim)


def _fused_attention(q, k, v, mask, precision, implementation):
  """`jax.nn.dot_product_attention` over [batch, length, heads, head_dim] with a [batch, q, k] mask."""
  # the fused call takes no precision argument: the context carries fp32's HIGHEST into its matmuls
  highest = precision == jax.lax.Precision.HIGHEST
  with jax.default_matmul_precision("highest") if highest else contextlib.nullcontext():
    out = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=q.shape[-1] ** -0.5,
                                       implementation=FUSED_IMPLEMENTATIONS[implementation])
  return out.astype(q.dtype)


def _flash_attention(q, k, v, segment_ids, branch_ids=None):
  """The Pallas kernel per device: XLA cannot partition a Mosaic kernel, so on a mesh (the Scorer's `set_mesh`)
  each device runs it on its own rows and heads under `shard_map`, split as the logical rules split q. With
  branch_ids: the prefix-sharing cascade (`_flash_cascade`), else one segment-masked pass (`_flash_kernel`)."""
  if segment_ids is None:
    raise ValueError("flash attention needs segment ids")
  length = q.shape[1]
  if length % 128:
    raise ValueError(f"flash attention needs a row length that is a multiple of 128, not {length}")
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


# Segment ids that no query (_NO_QUERY) or no key (_NO_KEY) of a cascade pass holds: what they mark sees nothing.
_NO_QUERY, _NO_KEY = -1, -2


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
    raise ValueError(f"flash_shared numbers (segment, branch) pairs in int32: rows of {length} are too long")
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


def packed_attention_mask(segment_ids: jax.Array, branch_ids: jax.Array | None = None) -> jax.Array:
  """[batch, L, L] bool for packed rows: query i sees key j when they share a non-zero segment, j <= i, and j is
  in the shared prefix (branch 0) or in i's own branch. Without branch ids: plain causal packed sequences."""
  length = segment_ids.shape[-1]
  causal = jnp.tril(jnp.ones((length, length), dtype=bool))
  mask = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, :, None] > 0) & causal
  if branch_ids is None:
    return mask
  return mask & ((branch_ids[:, None, :] == 0) | (branch_ids[:, :, None] == branch_ids[:, None, :]))
