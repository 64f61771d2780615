"""The Flax decoder shared by every family: Llama-style by default, with the switches of `ModelConfig` for the
others (OPT's LayerNorm, post-norm residuals, ReLU MLP, learned positions and embedding projections).

Parameters are a plain nested dict (layers stacked on a leading `layers` axis and run with `nn.scan`, so a 30-layer
model compiles one layer), with a parallel tree of logical axis names (`param_logical_axes`) that the sharding rules
map onto a mesh. Another training stack can hand its own dict in, as long as keys and shapes match
`abstract_params`.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from s2sjax.numerics import norms
from s2sjax.numerics import rotary
from s2sjax.model.attention import local_window, local_window_mask, LocalWindow, masked_attention, packed_attention_mask
from s2sjax.model.config import ModelConfig

Params = dict[str, Any]

_INIT = nn.initializers.normal(stddev=0.02)


def _param_init(axes: tuple[str, ...], init=_INIT):
  return nn.with_logical_partitioning(init, axes)


def _precision(dtype) -> jax.lax.Precision:
  # fp32 must mean fp32 on TPU too, where the default matmul precision is a single bf16 pass.
  return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else jax.lax.Precision.DEFAULT


class RMSNorm(nn.Module):
  eps: float
  dtype: Any

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", _param_init(("norm",), nn.initializers.ones), (x.shape[-1],), jnp.float32)
    return norms.rms_norm(x, scale.astype(self.dtype), self.eps)


class LayerNorm(nn.Module):
  eps: float
  dtype: Any

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", _param_init(("norm",), nn.initializers.ones), (x.shape[-1],), jnp.float32)
    bias = self.param("bias", _param_init(("norm",), nn.initializers.zeros), (x.shape[-1],), jnp.float32)
    return norms.layer_norm(x, scale.astype(self.dtype), bias.astype(self.dtype), self.eps)


def _norm(config: ModelConfig, dtype, name: str | None = None) -> nn.Module:
  norm = LayerNorm if config.norm == "layer" else RMSNorm
  return norm(config.rms_norm_eps, dtype, name=name)


class HeadProjection(nn.Module):
  """`einsum(equation, x, kernel) + bias` with the heads kept as their own kernel dims (flax's DenseGeneral
  builds its kernel flat, and its logical-axis box then fails under a `jax.set_mesh` context)."""

  equation: str
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_dims: int  # trailing kernel dims the bias spans; 0: no bias
  dtype: Any
  param_dtype: Any

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", _param_init(self.kernel_axes), self.kernel_shape, self.param_dtype)
    y = jnp.einsum(self.equation, x.astype(self.dtype), kernel.astype(self.dtype), precision=_precision(self.dtype))
    if self.bias_dims:
      bias = self.param("bias", _param_init(self.kernel_axes[-self.bias_dims :], nn.initializers.zeros),
                        self.kernel_shape[-self.bias_dims :], self.param_dtype)
      y = y + bias.astype(self.dtype)
    return y


class Attention(nn.Module):
  config: ModelConfig
  dtype: Any
  param_dtype: Any
  implementation: str = "xla"
  window: LocalWindow | None = None

  @nn.compact
  def __call__(self, x, cos, sin, mask, segment_ids, branch_ids):
    c = self.config

    def project(name, heads, head_axis):
      shape, axes = (c.hidden_size, heads, c.head_dim), ("embed", head_axis, "head_dim")
      return HeadProjection("bld,dhk->blhk", shape, axes, 2 if c.qkv_bias else 0, self.dtype, self.param_dtype,
                            name=name)(x)

    q = project("q", c.num_heads, "heads")
    k = project("k", c.num_kv_heads, "kv_heads")
    v = project("v", c.num_kv_heads, "kv_heads")
    if c.position_embedding == "rope":
      q = rotary.apply_rotary(q, cos, sin, c.rope_interleaved)
      k = rotary.apply_rotary(k, cos, sin, c.rope_interleaved)
    q = nn.with_logical_constraint(q, ("batch", "length", "heads", "head_dim"))
    out = masked_attention(q, k, v, mask, precision=_precision(self.dtype), implementation=self.implementation,
                           segment_ids=segment_ids, branch_ids=branch_ids, window=self.window)
    shape, axes = (c.num_heads, c.head_dim, c.hidden_size), ("heads", "head_dim", "embed")
    return HeadProjection("blhk,hkd->bld", shape, axes, 1 if c.o_bias else 0, self.dtype, self.param_dtype,
                          name="o")(out)


class Mlp(nn.Module):
  config: ModelConfig
  dtype: Any
  param_dtype: Any

  @nn.compact
  def __call__(self, x):
    c = self.config

    def dense(name, features, axes, inputs):
      return nn.Dense(
        features,
        use_bias=c.mlp_bias,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        precision=_precision(self.dtype),
        kernel_init=_param_init(axes),
        bias_init=_param_init(axes[1:], nn.initializers.zeros),
        name=name,
      )(inputs)

    if c.mlp == "relu":
      hidden = nn.relu(dense("up", c.intermediate_size, ("embed", "mlp"), x))
    else:
      hidden = nn.silu(dense("gate", c.intermediate_size, ("embed", "mlp"), x))
      hidden = hidden * dense("up", c.intermediate_size, ("embed", "mlp"), x)
    hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
    return dense("down", c.hidden_size, ("mlp", "embed"), hidden)


class DecoderLayer(nn.Module):
  config: ModelConfig
  dtype: Any
  param_dtype: Any
  attention: str = "xla"
  window: LocalWindow | None = None

  @nn.compact
  def __call__(self, x, cos, sin, mask, segment_ids, branch_ids):
    c = self.config
    attn = Attention(c, self.dtype, self.param_dtype, self.attention, self.window, name="attn")
    mlp = Mlp(c, self.dtype, self.param_dtype, name="mlp")
    attn_norm, mlp_norm = _norm(c, self.dtype, "attn_norm"), _norm(c, self.dtype, "mlp_norm")
    if c.pre_norm:
      h = x + attn(attn_norm(x), cos, sin, mask, segment_ids, branch_ids)
      out = h + mlp(mlp_norm(h))
    else:  # post-LN (OPT-350m): each residual sum is normed
      h = attn_norm(x + attn(x, cos, sin, mask, segment_ids, branch_ids))
      out = mlp_norm(h + mlp(h))
    return nn.with_logical_constraint(out, ("batch", "length", "embed")), None


class Decoder(nn.Module):
  """Token (and audio-code) inputs to final-norm hidden states; `logits` applies the head where it is needed."""

  config: ModelConfig
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  attention: str = "xla"  # see masked_attention: xla | dot_product | cudnn | flash | flash_shared
  attention_window: LocalWindow | None = None  # item-local attention (local_window); None: dense

  def setup(self):
    c = self.config
    self.embed = nn.Embed(
      c.vocab_size, c.embed_dim, dtype=self.dtype, param_dtype=self.param_dtype,
      embedding_init=_param_init(("vocab", "embed")),
    )
    self.audio_embed = [
      nn.Embed(size, c.embed_dim, dtype=self.dtype, param_dtype=self.param_dtype,
               embedding_init=_param_init(("audio_vocab", "embed")), name=f"audio_embed_{k}")
      for k, size in enumerate(c.audio_codebook_sizes)
    ]
    self.layers = nn.scan(
      DecoderLayer,
      variable_axes={"params": 0},
      split_rngs={"params": True},
      in_axes=(nn.broadcast,) * 5,
      length=c.num_layers,
      metadata_params={nn.PARTITION_NAME: "layers"},
    )(c, self.dtype, self.param_dtype, self.attention, self.attention_window)
    if c.position_embedding == "learned":
      self.position_embed = nn.Embed(
        c.max_positions + c.position_offset, c.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype,
        embedding_init=_param_init(("positions", "embed")),
      )
    if c.projects_embeddings:
      self.project_in = self._projection(c.hidden_size, ("word_embed", "embed"))
      self.project_out = self._projection(c.embed_dim, ("embed", "word_embed"))
    if c.final_norm:
      self.final_norm = _norm(c, self.dtype)
    if not c.tie_embeddings:
      self.lm_head = nn.Dense(
        c.vocab_size, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
        precision=_precision(self.dtype), kernel_init=_param_init(("embed", "vocab")),
      )

  def _projection(self, features: int, axes: tuple[str, str]) -> nn.Dense:
    return nn.Dense(features, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
                    precision=_precision(self.dtype), kernel_init=_param_init(axes))

  def embed_inputs(self, tokens: jax.Array, audio_codes: jax.Array | None) -> jax.Array:
    """Text embeddings; in `codebook_tables` mode the K audio tables, summed, replace them at the placeholder."""
    x = self.embed(tokens)
    if not self.config.audio_codebook_sizes or audio_codes is None or audio_codes.shape[-1] == 0:
      return x  # no audio in these inputs (text rows for a model that also takes audio)
    if audio_codes.shape[-1] != len(self.audio_embed):
      raise ValueError(f"audio_codes has {audio_codes.shape[-1]} codebooks, the model {len(self.audio_embed)}")
    audio = sum(
      table(jnp.maximum(audio_codes[..., k], 0)) * (audio_codes[..., k] >= 0)[..., None].astype(x.dtype)
      for k, table in enumerate(self.audio_embed)
    )
    is_audio = (tokens == self.config.audio_placeholder_id)[..., None]
    return jnp.where(is_audio, audio, x)

  def __call__(
    self,
    tokens: jax.Array,
    positions: jax.Array,
    attention_mask: jax.Array | None,
    audio_codes: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    branch_ids: jax.Array | None = None,
    features: jax.Array | None = None,
    continuous: jax.Array | None = None,
  ) -> jax.Array:
    """tokens, positions [batch, length] int; attention_mask [batch, length, length] bool, or with an
    `attention_window` its window mask (`local_window_mask`); audio_codes [batch, length, K] int (-1 where none);
    segment_ids, branch_ids [batch, length] (the flash kernel's and item-local attention's mask); features
    [batch, length, embed_dim] float, read where continuous [batch, length] bool is set in place of those tokens'
    embeddings (an audio encoder's rows: Step-Audio 2's adaptor output).
    Returns the hidden states the head reads [batch, length, embed_dim]: after the final norm and `project_out`,
    where the model has them."""
    c = self.config
    x = self.embed_inputs(tokens, audio_codes)
    if features is not None:
      x = jnp.where(continuous[..., None], features.astype(x.dtype), x)
    if c.projects_embeddings:
      x = self.project_in(x)
    cos = sin = None
    if c.position_embedding == "rope":
      cos, sin = rotary.rotary_angles(positions, c.rotary_dim, c.rope_theta, c.rope_scaling)
    else:  # the packed rows' positions restart per item and continue a candidate from its prefix, as for rope
      x = x + self.position_embed(positions + c.position_offset)
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    x, _ = self.layers(x, cos, sin, attention_mask, segment_ids, branch_ids)
    if c.final_norm:
      x = self.final_norm(x)
    return self.project_out(x) if c.projects_embeddings else x

  def logits(self, hidden: jax.Array) -> jax.Array:
    """Text-vocabulary logits in fp32 for hidden states [..., embed_dim]."""
    if self.config.tie_embeddings:  # not Embed.attend: it takes no precision, and fp32 must mean fp32 on TPU
      table = self.embed.embedding.astype(self.dtype)
      return jnp.einsum("...d,vd->...v", hidden.astype(self.dtype), table, precision=_precision(self.dtype)
                        ).astype(jnp.float32)
    return self.lm_head(hidden).astype(jnp.float32)


def _dummy_inputs(config: ModelConfig):
  tokens = jnp.zeros((1, 1), jnp.int32)
  codes = jnp.zeros((1, 1, len(config.audio_codebook_sizes)), jnp.int32) if config.audio_codebook_sizes else None
  return tokens, tokens, jnp.ones((1, 1, 1), bool), codes


def _init_all(model: Decoder, rng, *inputs):
  """Initialises every parameter, the head included (`__call__` stops at the hidden states). No axis rules: a
  caller's own mesh and rules (a training loop's) would constrain the one-token dummy batch onto its data axis."""
  with nn.logical_axis_rules(()):
    return model.init(rng, *inputs, method=lambda module, *args: module.logits(module(*args)))


def _unbox(boxed: Any) -> Params:
  """The values without their logical-axis boxes, unconstrained: placing them is the caller's job (the Scorer's
  shardings), and a caller's mesh context would otherwise constrain abstract values it cannot place."""
  is_box = lambda x: isinstance(x, nn.Partitioned)
  return jax.tree.map(lambda x: x.unbox(apply_constraint=False) if is_box(x) else x, boxed, is_leaf=is_box)


@functools.lru_cache(maxsize=16)  # loading, sharding and scoring each ask: one trace of the init per config
def _boxed_abstract(config: ModelConfig, param_dtype) -> Any:
  """Read-only: callers build their own trees from it (`_unbox`, `nn.get_partition_spec`)."""
  model = Decoder(config, param_dtype=param_dtype)
  return jax.eval_shape(functools.partial(_init_all, model), jax.random.PRNGKey(0), *_dummy_inputs(config))["params"]


def abstract_params(config: ModelConfig, param_dtype=jnp.float32) -> Params:
  """The parameter tree as `jax.ShapeDtypeStruct`s: what a converter must produce, key for key."""
  return _unbox(_boxed_abstract(config, param_dtype))


def param_logical_axes(config: ModelConfig) -> Params:
  """A tree parallel to the params holding each leaf's logical axis names as a `PartitionSpec`."""
  return nn.get_partition_spec(_boxed_abstract(config, jnp.float32))


def init_params(config: ModelConfig, rng: jax.Array, param_dtype=jnp.float32) -> Params:
  """Random parameters (normal(0.02) weights, unit norm scales), for tests and benchmarks."""
  model = Decoder(config, param_dtype=param_dtype)
  return _unbox(_init_all(model, rng, *_dummy_inputs(config))["params"])


def param_count(params: Params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def sequence_log_probs(config: ModelConfig, params: Params, tokens: jax.Array, audio_codes=None, dtype=jnp.float32):
  """Full-vocabulary log-probs [batch, length, vocab] of plain causal sequences: the check against reference
  implementations (the scoring step never builds full logits)."""
  model = Decoder(config, dtype=dtype)
  batch, length = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
  mask = packed_attention_mask(jnp.ones((batch, length), jnp.int32))
  hidden = model.apply({"params": params}, tokens, positions, mask, audio_codes)
  return jax.nn.log_softmax(model.apply({"params": params}, hidden, method=Decoder.logits), axis=-1)
