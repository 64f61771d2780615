"""Moshi's multi-stream language model (Kyutai's `moshi.models.lm.LMModel`) in Flax: a temporal transformer over
the summed embeddings of a text stream and n_q Mimi codebook streams per time step, a text head, and a small depth
transformer (the depformer) that predicts each of dep_q codebooks from the temporal output and the earlier streams
of the same step.

Everything runs in *delayed* step space, as upstream's `forward` does once it has applied `_delay_sequence`: step s
holds stream k's token of time s - 1 - delays[k] (the initial token where that is < 0), step 0 is all initial
tokens. The temporal output at step s predicts step s + 1: its text token through the text head, and codebook k
through the depformer, whose position k reads the step-(s + 1) token of stream k (text, then codebooks 0..dep_q-2)
and whose weights may differ per position (`weights_per_step`). A token of -1 (upstream's `zero_token_id`) embeds
as zeros. Delays are laid when rows are built (`s2sjax.data.formats.streams.delay_streams`) and undone nowhere in the model.

Parameters are a plain nested dict with logical axis names, temporal layers stacked on a `layers` axis and run
with `nn.scan`; the depformer's per-step weights carry a leading `steps` axis indexed by the step schedule.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from s2sjax.numerics import rotary
from s2sjax.model.attention import masked_attention, packed_attention_mask
from s2sjax.model.config import ConfigError
from s2sjax.data.formats.streams import delay_streams

Params = dict[str, Any]
FAMILY = "moshi"
NORM_EPS = {"rms_norm": 1e-5, "rms_norm_f32": 1e-8}  # moshi.modules.transformer.create_norm_fn
ACTIVATIONS = {"silu": jax.nn.silu}
POSITIONAL = ("none", "rope", "rope_concat", "sin", "sin_rope")

_INIT = nn.initializers.normal(stddev=0.02)


def _init(axes, init=_INIT):
  return nn.with_logical_partitioning(init, axes)


def _precision(dtype) -> jax.lax.Precision:
  return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else jax.lax.Precision.DEFAULT


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """One of Moshi's `StreamingTransformer`s (the temporal one or the depformer)."""

  dim: int
  num_heads: int
  num_layers: int
  kv_repeat: int
  hidden: int  # the gated MLP's hidden width (ActivationGating: 21 * dim // 8 when dim_feedforward == 4 * dim)
  activation: str
  norm: str
  positional_embedding: str
  max_period: float
  positional_scale: float
  context: int | None  # a query sees keys fewer than `context` steps back; None: all
  layer_scale: bool  # LayerScale on both residual branches
  weight_sets: int = 1  # per-step weight sets (depformer `weights_per_step`); 1: one set for every position

  @property
  def head_dim(self) -> int:
    return self.dim // self.num_heads

  @property
  def kv_heads(self) -> int:
    return self.num_heads // self.kv_repeat

  def __post_init__(self):
    if self.dim % self.num_heads or self.num_heads % self.kv_repeat:
      raise ConfigError(f"dim={self.dim}, num_heads={self.num_heads}, kv_repeat={self.kv_repeat} do not divide")
    if self.norm not in NORM_EPS:
      raise ConfigError(f"norm {self.norm!r} is not supported (supported: {', '.join(NORM_EPS)})")
    if self.activation not in ACTIVATIONS:
      raise ConfigError(f"gating {self.activation!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
    if self.positional_embedding not in POSITIONAL:
      raise ConfigError(f"positional_embedding {self.positional_embedding!r} is not one of {POSITIONAL}")


@dataclasses.dataclass(frozen=True)
class MoshiConfig:
  """An `LMModel`'s architecture; hashable (a static argument of `jax.jit`). Built from a release's config.json by
  `s2sjax.scoring.architectures.moshi.parse_config`, which refuses by name every switch this model does not implement."""

  n_q: int  # audio streams read (Moshi: 8 of its own speech, then 8 of the user's)
  dep_q: int  # audio streams predicted by the depformer (the first dep_q)
  card: int  # codebook size; id `card` is the audio initial token
  text_card: int  # text vocabulary; id `text_card` is the text initial token
  text_card_out: int
  delays: tuple[int, ...]  # per stream, text first
  temporal: TransformerConfig
  depformer: TransformerConfig | None  # None when dep_q == 0
  depformer_multi_linear: bool
  depformer_schedule: tuple[int, ...]  # depformer position -> weight set (and input linear, when multi-linear)
  depformer_low_rank: int | None  # low-rank depformer embeddings (table width), projected up to depformer dim
  depformer_norm: str | None  # a norm per codebook before its head
  bias_proj: bool  # biases on the text head and the codebook heads
  existing_text_padding_id: int
  family: str = FAMILY

  def __post_init__(self):
    if len(self.delays) != self.n_q + 1:
      raise ConfigError(f"delays has {len(self.delays)} entries; the text stream and n_q={self.n_q} codebooks need "
                        f"{self.n_q + 1}")
    if min(self.delays) < 0:
      raise ConfigError(f"delays {list(self.delays)} must be non-negative")
    if not 0 <= self.dep_q <= self.n_q:
      raise ConfigError(f"dep_q={self.dep_q} must lie in [0, n_q={self.n_q}]")
    if (self.dep_q > 0) != (self.depformer is not None):
      raise ConfigError("a depformer is needed exactly when dep_q > 0")
    if len(self.depformer_schedule) != self.dep_q:
      raise ConfigError(f"the depformer schedule has {len(self.depformer_schedule)} entries, dep_q={self.dep_q}")
    if self.depformer_norm is not None and self.depformer_norm not in NORM_EPS:
      raise ConfigError(f"depformer_norm {self.depformer_norm!r} is not supported (supported: {', '.join(NORM_EPS)})")

  @property
  def num_streams(self) -> int:
    return self.n_q + 1

  @property
  def initial_ids(self) -> tuple[int, ...]:
    """Each stream's initial token (LMModel._get_initial_token): text_card for text, card for every codebook."""
    return (self.text_card,) + (self.card,) * self.n_q

  @property
  def num_in_linears(self) -> int:
    return max(self.depformer_schedule) + 1 if self.depformer_multi_linear and self.dep_q else 1

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "MoshiConfig":
    fields = json.loads(text)
    if fields.get("family") != FAMILY:
      raise ConfigError(f"not a {FAMILY} config (family {fields.get('family')!r})")
    fields["temporal"] = TransformerConfig(**fields["temporal"])
    fields["depformer"] = TransformerConfig(**fields["depformer"]) if fields.get("depformer") else None
    fields["delays"] = tuple(fields["delays"])
    fields["depformer_schedule"] = tuple(fields["depformer_schedule"])
    return cls(**fields)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """Moshi's RMSNorm (`_rms_norm`): variance, scale and product in fp32, then cast to the input dtype (HF's
  `norms.rms_norm` casts before scaling, which rounds differently in bf16)."""
  x32 = x.astype(jnp.float32)
  var = eps + jnp.mean(x32 * x32, axis=-1, keepdims=True)
  return (x32 * (scale.astype(jnp.float32) * jax.lax.rsqrt(var))).astype(x.dtype)


def sin_embedding(positions: jax.Array, dim: int, max_period: float) -> jax.Array:
  """`create_sin_embedding`: [..., dim] of cos | sin over periods max_period ** (i / (dim/2 - 1))."""
  half = dim // 2
  phase = positions.astype(jnp.float32)[..., None] / (max_period ** (jnp.arange(half, dtype=jnp.float32) / (half - 1)))
  return jnp.concatenate([jnp.cos(phase), jnp.sin(phase)], axis=-1)


def _step_kernel(kernel: jax.Array, schedule: tuple[int, ...] | None) -> jax.Array:
  """A per-step kernel [sets, ...] gathered to one per position [S, ...] (None: a shared kernel, unchanged)."""
  return kernel if schedule is None else kernel[jnp.asarray(schedule)]


class Norm(nn.Module):
  kind: str

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", _init(("norm",), nn.initializers.ones), (x.shape[-1],), jnp.float32)
    return rms_norm(x, scale, NORM_EPS[self.kind])


class StreamLayer(nn.Module):
  """`StreamingTransformerLayer`: x + ls1(attn(norm1(x))); x + ls2(gating(norm2(x))). With a `schedule`, position
  s of every sequence uses weight set schedule[s] (the depformer's `weights_per_step`)."""

  config: TransformerConfig
  schedule: tuple[int, ...] | None
  dtype: Any
  param_dtype: Any

  def kernel(self, name, shape, axes):
    if self.schedule is not None:
      shape, axes = (self.config.weight_sets, *shape), ("steps", *axes)
    k = self.param(name, _init(axes), shape, self.param_dtype)
    return _step_kernel(k, self.schedule).astype(self.dtype)

  def project(self, eq_shared, eq_step, x, kernel):
    eq = eq_shared if self.schedule is None else eq_step
    return jnp.einsum(eq, x.astype(self.dtype), kernel, precision=_precision(self.dtype))

  @nn.compact
  def __call__(self, x, cos, sin, mask):
    c = self.config
    d, h, kv, hd = c.dim, c.num_heads, c.kv_heads, c.head_dim
    y = Norm(c.norm, name="attn_norm")(x)
    qkv = lambda name, heads, axis: self.project("bld,dhk->blhk", "bld,ldhk->blhk", y,
                                                 self.kernel(name, (d, heads, hd), ("embed", axis, "head_dim")))
    q, k, v = qkv("q", h, "heads"), qkv("k", kv, "kv_heads"), qkv("v", kv, "kv_heads")
    if cos is not None:
      interleaved = c.positional_embedding != "rope_concat"
      q, k = rotary.apply_rotary(q, cos, sin, interleaved), rotary.apply_rotary(k, cos, sin, interleaved)
    out = masked_attention(q, k, v, mask, precision=_precision(self.dtype))
    o = self.kernel("o", (h, hd, d), ("heads", "head_dim", "embed"))
    out = self.project("blhk,hkd->bld", "blhk,lhkd->bld", out, o)
    if c.layer_scale:
      out = out * self.param("attn_scale", _init(("norm",), nn.initializers.ones), (d,), jnp.float32).astype(self.dtype)
    x = x + out.astype(x.dtype)
    y = Norm(c.norm, name="mlp_norm")(x)
    gate = self.project("bld,df->blf", "bld,ldf->blf", y, self.kernel("gate", (d, c.hidden), ("embed", "mlp")))
    up = self.project("bld,df->blf", "bld,ldf->blf", y, self.kernel("up", (d, c.hidden), ("embed", "mlp")))
    hidden = ACTIVATIONS[c.activation](gate) * up
    out = self.project("blf,fd->bld", "blf,lfd->bld", hidden, self.kernel("down", (c.hidden, d), ("mlp", "embed")))
    if c.layer_scale:
      out = out * self.param("mlp_scale", _init(("norm",), nn.initializers.ones), (d,), jnp.float32).astype(self.dtype)
    return nn.with_logical_constraint(x + out.astype(x.dtype), ("batch", "length", "embed")), None


class StreamTransformer(nn.Module):
  """`StreamingTransformer`: positional embedding (sin added to the input, rope inside attention), then the layers."""

  config: TransformerConfig
  schedule: tuple[int, ...] | None
  dtype: Any
  param_dtype: Any

  @nn.compact
  def __call__(self, x, positions, mask):
    c = self.config
    if c.positional_embedding in ("sin", "sin_rope"):
      x = x + (c.positional_scale * sin_embedding(positions, c.dim, c.max_period)).astype(x.dtype)
    cos = sin = None
    if c.positional_embedding in ("rope", "sin_rope", "rope_concat"):
      cos, sin = rotary.rotary_angles(positions, c.head_dim, c.max_period)
    stack = nn.scan(StreamLayer, variable_axes={"params": 0}, split_rngs={"params": True},
                    in_axes=(nn.broadcast,) * 3, length=c.num_layers,
                    metadata_params={nn.PARTITION_NAME: "layers"})
    x, _ = stack(c, self.schedule, self.dtype, self.param_dtype, name="layers")(x, cos, sin, mask)
    return x


class Embedding(nn.Module):
  """`ScaledEmbedding`: a table lookup where id -1 (upstream's zero token) gives zeros; with `low_rank`, a narrower
  table projected up by a bias-free linear."""

  rows: int
  features: int
  low_rank: int | None
  dtype: Any
  param_dtype: Any
  vocab_axis: str = "audio_vocab"

  @nn.compact
  def __call__(self, ids):
    width = self.low_rank or self.features
    table = self.param("embedding", _init((self.vocab_axis, "embed")), (self.rows, width), self.param_dtype)
    y = jnp.take(table, jnp.maximum(ids, 0), axis=0).astype(self.dtype) * (ids != -1)[..., None].astype(self.dtype)
    if self.low_rank:
      up = self.param("low_rank", _init((None, "embed")), (width, self.features), self.param_dtype)
      y = jnp.einsum("...r,rd->...d", y, up.astype(self.dtype), precision=_precision(self.dtype))
    return y


class Dense(nn.Module):
  features: int
  use_bias: bool
  axes: tuple[str, str]
  dtype: Any
  param_dtype: Any

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", _init(self.axes), (x.shape[-1], self.features), self.param_dtype)
    y = jnp.einsum("...d,dv->...v", x.astype(self.dtype), kernel.astype(self.dtype), precision=_precision(self.dtype))
    if self.use_bias:
      y = y + self.param("bias", _init(self.axes[1:], nn.initializers.zeros), (self.features,),
                         self.param_dtype).astype(self.dtype)
    return y


class Depformer(nn.Module):
  """The depth transformer of one time step: position k reads in_k(z) + emb_k(token_k), where token_0 is the step's
  text token and token_k (k >= 1) its codebook k-1; position k's output gives codebook k's logits."""

  config: MoshiConfig
  dtype: Any
  param_dtype: Any

  @nn.compact
  def __call__(self, z, tokens):
    """z [N, D] temporal outputs; tokens [N, >= dep_q] the predicted step's tokens, text first -> fp32 logits
    [N, dep_q, card]."""
    c, t = self.config, self.config.depformer
    kernel = self.param("in_kernel", _init(("steps", "embed", None)), (c.num_in_linears, c.temporal.dim, t.dim),
                        self.param_dtype).astype(self.dtype)
    which = c.depformer_schedule if c.depformer_multi_linear else (0,) * c.dep_q
    x = jnp.einsum("nd,kde->nke", z.astype(self.dtype), kernel[jnp.asarray(which)], precision=_precision(self.dtype))
    emb = [Embedding(c.text_card + 1, t.dim, c.depformer_low_rank, self.dtype, self.param_dtype, "vocab",
                     name="text_emb")(tokens[:, 0])]
    emb += [Embedding(c.card + 1, t.dim, c.depformer_low_rank, self.dtype, self.param_dtype, name=f"audio_emb_{k}")(
      tokens[:, k + 1]) for k in range(c.dep_q - 1)]
    x = x + jnp.stack(emb, axis=1)
    positions = jnp.broadcast_to(jnp.arange(c.dep_q), x.shape[:2])
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((c.dep_q, c.dep_q), bool)), (x.shape[0], c.dep_q, c.dep_q))
    schedule = c.depformer_schedule if t.weight_sets > 1 else None
    x = StreamTransformer(t, schedule, self.dtype, self.param_dtype, name="transformer")(x, positions, mask)
    if c.depformer_norm is not None:
      scale = self.param("norm_scale", _init(("codebooks", "norm"), nn.initializers.ones), (c.dep_q, t.dim),
                         jnp.float32)
      x = rms_norm(x, scale, NORM_EPS[c.depformer_norm])
    heads = self.param("heads", _init(("codebooks", "embed", "audio_vocab")), (c.dep_q, t.dim, c.card),
                       self.param_dtype).astype(self.dtype)
    logits = jnp.einsum("nkd,kdv->nkv", x.astype(self.dtype), heads, precision=_precision(self.dtype))
    if c.bias_proj:
      logits = logits + self.param("heads_bias", _init(("codebooks", "audio_vocab"), nn.initializers.zeros),
                                   (c.dep_q, c.card), self.param_dtype).astype(self.dtype)
    return logits.astype(jnp.float32)


class MoshiLM(nn.Module):
  """Stream tokens in, temporal hidden states out; `text_logits` and `audio_logits` apply the heads where needed."""

  config: MoshiConfig
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    c = self.config
    self.text_emb = Embedding(c.text_card + 1, c.temporal.dim, None, self.dtype, self.param_dtype, "vocab")
    self.audio_emb = [Embedding(c.card + 1, c.temporal.dim, None, self.dtype, self.param_dtype, name=f"audio_emb_{k}")
                      for k in range(c.n_q)]
    self.transformer = StreamTransformer(c.temporal, None, self.dtype, self.param_dtype)
    self.out_norm = Norm(c.temporal.norm)
    self.text_head = Dense(c.text_card_out, c.bias_proj, ("embed", "vocab"), self.dtype, self.param_dtype)
    if c.dep_q:
      self.depformer = Depformer(c, self.dtype, self.param_dtype)

  def __call__(self, streams: jax.Array, positions: jax.Array, mask: jax.Array) -> jax.Array:
    """streams [B, L, 1 + n_q] delayed-step tokens (text first; -1 = none); positions [B, L] step indices; mask
    [B, L, L] (`attention_mask`). Returns the out-normed temporal hidden states [B, L, dim]."""
    c = self.config
    if streams.shape[-1] != c.num_streams:
      raise ValueError(f"streams carry {streams.shape[-1]} streams, the model reads {c.num_streams} (text + {c.n_q})")
    x = None
    for k, table in enumerate(self.audio_emb):  # upstream's order: the codebooks, then the text
      e = table(streams[..., 1 + k])
      x = e if x is None else x + e
    x = self.text_emb(streams[..., 0]) if x is None else x + self.text_emb(streams[..., 0])
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    return self.out_norm(self.transformer(x, positions, mask))

  def text_logits(self, hidden: jax.Array) -> jax.Array:
    return self.text_head(hidden).astype(jnp.float32)

  def audio_logits(self, hidden: jax.Array, tokens: jax.Array) -> jax.Array:
    """hidden [N, dim] temporal outputs at step s; tokens [N, 1 + n_q] the tokens of step s + 1 -> [N, dep_q, card]."""
    if not self.config.dep_q:
      raise ValueError("this Moshi model has no depformer (dep_q = 0): it predicts no codebook")
    return self.depformer(hidden, tokens)


def attention_mask(segment_ids, branch_ids, positions, context: int | None) -> jax.Array:
  """Packed rows' mask (`packed_attention_mask`), limited to keys fewer than `context` steps back."""
  mask = packed_attention_mask(segment_ids, branch_ids)
  if context is not None:
    mask &= (positions[:, :, None] - positions[:, None, :]) < context
  return mask


def _dummy(config: MoshiConfig):
  streams = jnp.zeros((1, 1, config.num_streams), jnp.int32)
  return streams, jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1, 1), bool)


def _init_all(model: MoshiLM, rng):
  def every(module, streams, positions, mask):
    hidden = module(streams, positions, mask)
    out = [module.text_logits(hidden)]
    if module.config.dep_q:
      out.append(module.audio_logits(hidden[:, 0], streams[:, 0]))
    return out

  with nn.logical_axis_rules(()):
    return model.init(rng, *_dummy(model.config), method=every)


def _unbox(boxed):
  is_box = lambda x: isinstance(x, nn.Partitioned)
  return jax.tree.map(lambda x: x.unbox(apply_constraint=False) if is_box(x) else x, boxed, is_leaf=is_box)


@functools.lru_cache(maxsize=16)  # loading, sharding and scoring each ask: one trace of the init per config
def _boxed_abstract(config: MoshiConfig, param_dtype):
  """Read-only: callers build their own trees from it (`_unbox`, `nn.get_partition_spec`)."""
  return jax.eval_shape(functools.partial(_init_all, MoshiLM(config, param_dtype=param_dtype)),
                        jax.random.PRNGKey(0))["params"]


def abstract_params(config: MoshiConfig, param_dtype=jnp.float32) -> Params:
  """The parameter tree as `jax.ShapeDtypeStruct`s: what a converter must produce, key for key."""
  return _unbox(_boxed_abstract(config, param_dtype))


def param_logical_axes(config: MoshiConfig) -> Params:
  return nn.get_partition_spec(_boxed_abstract(config, jnp.float32))


def init_params(config: MoshiConfig, rng: jax.Array, param_dtype=jnp.float32) -> Params:
  return _unbox(_init_all(MoshiLM(config, param_dtype=param_dtype), rng)["params"])


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def delayed_log_probs(config: MoshiConfig, params: Params, steps: jax.Array, dtype=jnp.float32):
  """Full log-probs of plain delayed-step sequences steps [B, T + 1, 1 + n_q] (step 0 the initial tokens): text
  [B, T, text_card_out] and codebooks [B, T, dep_q, card], where entry t predicts step t + 1. The check against
  `LMModel.forward` (the scoring step never builds full logits)."""
  model = MoshiLM(config, dtype=dtype)
  batch, length = steps.shape[0], steps.shape[1] - 1
  positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
  mask = attention_mask(jnp.ones((batch, length), jnp.int32), None, positions, config.temporal.context)
  hidden = model.apply({"params": params}, steps[:, :-1], positions, mask)
  text = jax.nn.log_softmax(model.apply({"params": params}, hidden, method=MoshiLM.text_logits), axis=-1)
  if not config.dep_q:
    return text, None
  flat = hidden.reshape(batch * length, -1)
  audio = model.apply({"params": params}, flat, steps[:, 1:].reshape(batch * length, -1), method=MoshiLM.audio_logits)
  return text, jax.nn.log_softmax(audio, axis=-1).reshape(batch, length, config.dep_q, config.card)


def stream_log_probs(config: MoshiConfig, params: Params, codes: np.ndarray, dtype=jnp.float32):
  """`LMModel.forward` restated: codes [B, 1 + n_q, T] time-aligned (undelayed) -> (text log-probs [B, T, V_text],
  text mask [B, T], codebook log-probs [B, dep_q, T, card], codebook mask [B, dep_q, T]), each aligned with the
  code it predicts; masked entries (the last `delay` steps of a delayed stream, codes of -1) are NaN."""
  codes = np.asarray(codes)
  steps = np.stack([delay_streams(c.T, config.delays, config.initial_ids) for c in codes])
  text, audio = delayed_log_probs(config, params, steps, dtype)
  text, text_mask = _undelay(np.asarray(text)[:, None], config.delays[:1], codes[:, :1])
  if audio is None:
    return text[:, 0], text_mask[:, 0], None, None
  audio, audio_mask = _undelay(np.moveaxis(np.asarray(audio), 2, 1), config.delays[1 : 1 + config.dep_q],
                               codes[:, 1 : 1 + config.dep_q])
  return text[:, 0], text_mask[:, 0], audio, audio_mask


def _undelay(values: np.ndarray, delays, codes: np.ndarray):
  """`_undelay_sequence` on [B, K, T, V] plus the zero-token mask, NaN where masked."""
  out = np.full(values.shape, np.nan, values.dtype)
  mask = np.zeros(values.shape[:3], bool)
  length = values.shape[2]
  for k, d in enumerate(delays):
    out[:, k, : length - d] = values[:, k, d:]
    mask[:, k, : length - d] = True
  mask &= codes != -1
  out[~mask] = np.nan
  return out, mask
