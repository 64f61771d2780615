"""Mimi, Moshi's codec, in JAX: 24 kHz audio -> its first K split-residual-VQ codes at 12.5 frames a second, as
Kyutai's `moshi` (0.2.13) `MimiModel.encode` or transformers' `MimiModel.encode` computes them, from either
release's files: Kyutai's `tokenizer-*.safetensors` or transformers' `kyutai/mimi` folder.

The encoder is SEANet (causal convolutions, ELU, residual blocks, strided convolutions down to 25 Hz), a causal
transformer with a sliding context (RoPE, layer scale, exact-GELU MLP), a strided convolution to 12.5 Hz, then the
split quantizer: one semantic codebook and the acoustic residual ones, each group behind its own input projection.

Upstream files cited below, from site-packages: moshi/models/loaders.py, moshi/models/compression.py,
moshi/modules/{conv,seanet,transformer,rope,resample}.py, moshi/quantization/{vq,core_vq}.py, and transformers'
models/mimi/{modeling,configuration}_mimi.py.

The two references differ on one frame only: the last one of a wave whose length is not a whole number of frames.
moshi zero-pads the wave to whole frames and runs every layer over the padding (compression.py l.358); transformers
pads each strided convolution's own input, with zeros (constant) or its last value (replicate) (modeling_mimi.py
MimiConv1d.forward). `padding` chooses the rule: "kyutai" or "transformers"; by default the layout's own.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from s2sjax.runtime.errors import MissingFileError, UserError
from s2sjax.numerics.norms import layer_norm
from tasks.audio.jax_tokenizer import JaxAudioTokenizer
from tasks.audio.ops import attention, conv1d, nearest
from tasks.audio.weights import ReleaseWeights, WeightsError, read_json

KYUTAI_FILE = "tokenizer-e351c8d8-checkpoint125.safetensors"  # loaders.py l.34, MIMI_NAME
LAYOUTS = ("kyutai", "transformers")
PADDINGS = ("kyutai", "transformers")
CODEBOOK_EPSILON = 1e-5  # EuclideanCodebook(epsilon=1e-5) (core_vq.py), MimiEuclideanCodebook(epsilon=1e-5)
# SEANet's first stages run over windows of one frame, this many windows per step of the loop (`seanet`), a stage
# only while the history a window carries stays small.
WINDOW_STAGES = 2
WINDOWS_PER_STEP = 8
# create_norm_fn (transformer.py l.125-130): the two LayerNorm kinds a Mimi transformer may use.
KYUTAI_NORM_EPS = {"layer_norm": 1e-5, "layer_norm_f32": 1e-8}

# The Mimi that `moshi.models.loaders.get_mimi` builds when no mimi_config is given (loaders.py l.38-88: its
# `_seanet_kwargs`, `_quantizer_kwargs`, `_transformer_kwargs`, `_mimi_config`), in the same shape as the
# mimi_config JSON a Kyutai repo may ship (`mimi_config_name`, loaders.py l.226-258).
KYUTAI_MIMI_CONFIG = {
    "sample_rate": 24000, "channels": 1, "frame_rate": 12.5,
    "seanet": {"channels": 1, "dimension": 512, "causal": True, "n_filters": 64, "n_residual_layers": 1,
               "activation": "ELU", "compress": 2, "dilation_base": 2, "disable_norm_outer_blocks": 0,
               "kernel_size": 7, "residual_kernel_size": 3, "last_kernel_size": 3, "norm": "none",
               "pad_mode": "constant", "ratios": [8, 6, 5, 4], "true_skip": True},
    "quantizer": {"dimension": 256, "n_q": 32, "bins": 2048, "input_dimension": 512, "output_dimension": 512},
    "transformer": {"d_model": 512, "num_heads": 8, "num_layers": 8, "causal": True, "layer_scale": 0.01,
                    "context": 250, "conv_layout": True, "max_period": 10000, "gating": "none",
                    "norm": "layer_norm", "positional_embedding": "rope", "dim_feedforward": 2048,
                    "input_dimension": 512, "output_dimensions": [512]},
}


class MimiConfigError(UserError, ValueError):
  """A Mimi config (Kyutai's mimi_config or transformers' config.json) this port cannot serve: unreadable, a key
  missing, a switch not implemented. Names the file and the key."""


@dataclasses.dataclass(frozen=True)
class MimiArchitecture:
  """What the encoder and quantizer depend on, whichever release described it."""

  sample_rate: int
  ratios: tuple[int, ...]  # SEANet strides in the encoder's order (both configs list the decoder's)
  n_filters: int
  dimension: int
  kernel_size: int
  residual_kernel_size: int
  last_kernel_size: int
  n_residual_layers: int
  dilation_base: int
  compress: int
  pad_mode: str  # SEANet convolutions' left (and, for transformers, right) padding: constant | replicate
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  dim_feedforward: int
  context: int | None  # a query sees keys at most context - 1 steps back; None: all of the past
  rope_theta: float
  norm_eps: float
  layer_scale: bool  # False: Kyutai's layer_scale None (Identity); the scales are then ones
  downsample_stride: int
  codebook_dim: int
  bins: int
  n_q: int
  n_q_semantic: int

  @property
  def hop(self) -> int:
    return math.prod(self.ratios)

  @property
  def frame_size(self) -> int:
    """Samples per code frame: 1920 for Mimi (MimiModel.frame_size, compression.py l.245-246)."""
    return self.hop * self.downsample_stride

  @property
  def frame_rate(self) -> float:
    return self.sample_rate / self.frame_size


class _Fields:
  """One config table: `need` a key, or `refuse` a value, both naming the file and the key."""

  def __init__(self, table: dict, source: str, where: str = ""):
    self.table, self.source, self.where = table, source, where

  def need(self, key: str):
    if key not in self.table:
      raise MimiConfigError(f"{self.source}: {self.where}{key} is missing")
    return self.table[key]

  def get(self, key: str, default):
    return self.table.get(key, default)

  def refuse(self, key: str, why: str):
    raise MimiConfigError(f"{self.source}: {self.where}{key}={self.table.get(key)!r} is not implemented ({why})")

  def sub(self, key: str) -> "_Fields":
    table = self.need(key)
    if not isinstance(table, dict):
      raise MimiConfigError(f"{self.source}: {self.where}{key} is not a table")
    return _Fields(table, self.source, f"{self.where}{key}.")


def _downsample_stride(encoder_rate: float, frame_rate: float, fields: _Fields, key: str) -> int:
  stride = encoder_rate / frame_rate
  if stride != int(stride) or stride < 2:
    fields.refuse(key, f"the encoder's {encoder_rate} Hz frames must be downsampled by an integer stride >= 2")
  return int(stride)


def kyutai_architecture(mimi_config: dict, source: str) -> MimiArchitecture:
  """The architecture `get_mimi(file, mimi_config)` builds (loaders.py l.323-363), refusing by name what this
  port does not implement."""
  top = _Fields(mimi_config, source)
  seanet, quantizer, transformer = top.sub("seanet"), top.sub("quantizer"), top.sub("transformer")
  if top.need("channels") != 1 or seanet.need("channels") != 1:
    top.refuse("channels", "mono only")
  if seanet.need("causal") is not True:
    seanet.refuse("causal", "StreamingConv1d is causal only (conv.py l.194)")
  if seanet.need("norm") != "none":
    seanet.refuse("norm", "released weights are plain convolutions (loaders.py l.51-53)")
  if seanet.need("activation") != "ELU":
    seanet.refuse("activation", "only ELU")
  if seanet.need("true_skip") is not True:
    seanet.refuse("true_skip", "only identity shortcuts")
  if seanet.need("pad_mode") not in ("constant", "replicate"):
    seanet.refuse("pad_mode", "StreamingConv1d pads constant or replicate (conv.py l.192)")
  for key, wanted in (("causal", True), ("gating", "none"), ("positional_embedding", "rope"),
                      ("conv_layout", True)):
    # The classes' own defaults for keys a config leaves out (transformer.py l.644, l.841-843, l.950).
    if transformer.get(key, {"causal": False, "gating": "none", "positional_embedding": "sin",
                             "conv_layout": False}[key]) != wanted:
      transformer.refuse(key, f"Mimi's transformer has {key}={wanted!r}")
  norm = transformer.get("norm", "layer_norm")
  if norm not in KYUTAI_NORM_EPS:
    transformer.refuse("norm", f"one of {', '.join(KYUTAI_NORM_EPS)}")
  d_model, dimension = transformer.need("d_model"), seanet.need("dimension")
  if transformer.need("input_dimension") != d_model or list(transformer.need("output_dimensions")) != [d_model]:
    transformer.refuse("output_dimensions", "ProjectedTransformer without projections (d_model == dimension)")
  if d_model != dimension or quantizer.get("input_dimension", quantizer.need("dimension")) != dimension:
    transformer.refuse("d_model", f"the transformer and quantizer read the SEANet's {dimension} channels")
  heads = transformer.need("num_heads")
  kv_repeat = transformer.get("kv_repeat", 1)
  if d_model % heads or heads % kv_repeat or (d_model // heads) % 2:
    transformer.refuse("num_heads", "d_model / num_heads must be even, num_heads a multiple of kv_repeat")
  ratios = tuple(int(r) for r in seanet.need("ratios"))
  sample_rate = int(top.need("sample_rate"))
  return MimiArchitecture(
      sample_rate=sample_rate, ratios=ratios[::-1], n_filters=seanet.need("n_filters"), dimension=dimension,
      kernel_size=seanet.need("kernel_size"), residual_kernel_size=seanet.need("residual_kernel_size"),
      last_kernel_size=seanet.need("last_kernel_size"), n_residual_layers=seanet.need("n_residual_layers"),
      dilation_base=seanet.need("dilation_base"), compress=seanet.need("compress"),
      pad_mode=seanet.need("pad_mode"), num_layers=transformer.need("num_layers"), num_heads=heads,
      num_kv_heads=heads // kv_repeat, head_dim=d_model // heads, dim_feedforward=transformer.need("dim_feedforward"),
      context=transformer.need("context"), rope_theta=float(transformer.need("max_period")),
      norm_eps=KYUTAI_NORM_EPS[norm], layer_scale=transformer.get("layer_scale", None) is not None,
      # MimiModel gets encoder_frame_rate = sample_rate / hop (loaders.py l.348); ConvDownsample1d strides by
      # its ratio to frame_rate (compression.py l.197-207).
      downsample_stride=_downsample_stride(sample_rate / math.prod(ratios), top.need("frame_rate"), top,
                                           "frame_rate"),
      codebook_dim=quantizer.need("dimension"), bins=quantizer.need("bins"), n_q=quantizer.need("n_q"),
      n_q_semantic=quantizer.get("n_q_semantic", 1))


def transformers_architecture(config: dict, source: str) -> MimiArchitecture:
  """The architecture `transformers.MimiModel(MimiConfig(**config))` builds, refusing by name what this port does
  not implement. Keys a config.json leaves out take MimiConfig's defaults there, as `from_pretrained` does."""
  fields = _Fields(config, source)
  if fields.get("model_type", "mimi") != "mimi":
    fields.refuse("model_type", "a Mimi config")
  if fields.get("audio_channels", 1) != 1:
    fields.refuse("audio_channels", "mono only")
  if fields.get("use_causal_conv", True) is not True:
    fields.refuse("use_causal_conv", "Mimi's convolutions are causal")
  if fields.get("use_conv_shortcut", False) is not False:
    fields.refuse("use_conv_shortcut", "only identity shortcuts")
  if fields.get("pad_mode", "constant") not in ("constant", "replicate"):
    fields.refuse("pad_mode", "constant or replicate")
  if fields.get("hidden_act", "gelu") != "gelu":
    fields.refuse("hidden_act", "only the exact GELU")
  if fields.get("attention_bias", False) is not False:
    fields.refuse("attention_bias", "Mimi's projections have no bias")
  if not isinstance(fields.get("residual_kernel_size", 3), int):
    fields.refuse("residual_kernel_size", "one kernel size")
  if fields.get("codebook_dim", 256) != fields.get("vector_quantization_hidden_dimension", 256):
    fields.refuse("codebook_dim", "the codebooks live in the input projection's space "
                  "(vector_quantization_hidden_dimension)")
  # Transformers 5 writes rope_parameters; 4.x config.json files (the hub's kyutai/mimi) say rope_theta.
  rope = fields.get("rope_parameters", None) or {"rope_type": "default",
                                                   "rope_theta": fields.get("rope_theta", 10000.0)}
  if rope.get("rope_type", "default") != "default":
    fields.refuse("rope_parameters", "only the default RoPE")
  hidden = fields.get("hidden_size", 512)
  heads = fields.get("num_attention_heads", 8)
  kv_heads = fields.get("num_key_value_heads", heads)
  head_dim = fields.get("head_dim", None) or hidden // heads
  if heads % kv_heads or head_dim % 2:
    fields.refuse("num_key_value_heads", "heads a multiple of kv heads, head_dim even")
  ratios = tuple(int(r) for r in (fields.get("upsampling_ratios", None) or [8, 6, 5, 4]))
  sample_rate = int(fields.get("sampling_rate", 24000))
  hop = math.prod(ratios)
  encoder_rate = math.ceil(sample_rate / hop)  # MimiConfig.encodec_frame_rate
  # MimiConfig.frame_rate: an explicit frame_rate (older files), else sample_rate / frame_size, whose
  # downsampling stride is 2 (configuration_mimi.py frame_size).
  frame_rate = fields.get("frame_rate", None) or sample_rate / (hop * 2)
  return MimiArchitecture(
      sample_rate=sample_rate, ratios=ratios[::-1], n_filters=fields.get("num_filters", 64), dimension=hidden,
      kernel_size=fields.get("kernel_size", 7), residual_kernel_size=fields.get("residual_kernel_size", 3),
      last_kernel_size=fields.get("last_kernel_size", 3), n_residual_layers=fields.get("num_residual_layers", 1),
      dilation_base=fields.get("dilation_growth_rate", 2), compress=fields.get("compress", 2),
      pad_mode=fields.get("pad_mode", "constant"), num_layers=fields.get("num_hidden_layers", 8),
      num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
      dim_feedforward=fields.get("intermediate_size", 2048), context=fields.get("sliding_window", 250),
      rope_theta=float(rope.get("rope_theta", 10000.0)), norm_eps=float(fields.get("norm_eps", 1e-5)),
      layer_scale=True, downsample_stride=_downsample_stride(encoder_rate, frame_rate, fields, "frame_rate"),
      codebook_dim=fields.get("vector_quantization_hidden_dimension", 256), bins=fields.get("codebook_size", 2048),
      n_q=fields.get("num_quantizers", 32), n_q_semantic=fields.get("num_semantic_quantizers", 1))


def seanet_indices(arch: MimiArchitecture) -> tuple[int, list[tuple[list[int], int]], int]:
  """Positions of the encoder's convolutions in its module list, ELUs counted, as both releases number them
  (`encoder.model.N`, seanet.py l.169-236; `encoder.layers.N`, MimiEncoder): (stem, [(residual blocks, strided
  conv) per stage], final conv)."""
  index, stages = 1, []
  for _ in arch.ratios:
    blocks = list(range(index, index + arch.n_residual_layers))
    index += arch.n_residual_layers + 1  # the blocks, then an ELU
    stages.append((blocks, index))
    index += 1
  return 0, stages, index + 1  # an ELU before the final conv


class _Taker:
  """`ReleaseWeights.take` that also accepts upstream's older names of a tensor, and remembers what it took."""

  def __init__(self, weights: ReleaseWeights):
    self.weights, self.taken = weights, set()

  def __call__(self, keys: str | tuple[str, ...], shape: tuple[int, ...]) -> np.ndarray:
    keys = (keys,) if isinstance(keys, str) else keys
    key = next((k for k in keys if self.weights.has(k)), keys[0])
    self.taken.add(key)
    return self.weights.take(key, shape)


class _KyutaiNames:
  """Key names of `moshi.models.compression.MimiModel.state_dict()`, and the older names its load hooks accept
  (transformer.py l.423-446: in_proj_weight / in_proj.weight, out_proj.weight; core_vq.py l.162-175:
  embed_sum / embed_avg, cluster_size)."""

  encoder_prefixes = ("encoder.", "encoder_transformer.", "downsample.")

  def conv(self, index: int, block: int | None = None) -> str:
    return f"encoder.model.{index}." + (f"block.{block}." if block is not None else "") + "conv.conv."

  def downsample(self) -> str:
    return "downsample.conv.conv.conv.weight"  # ConvDownsample1d.conv (StreamingConv1d) .conv (NormConv1d) .conv

  def attention(self, take: _Taker, layer: int, arch: MimiArchitecture):
    """(wq, wk, wv, wo) as torch Linear weights [out, in], q and k rows reordered from Kyutai's interleaved RoPE
    pairs (rope.py l.58-62, [r0, i0, r1, i1, ...] per head) to halves (transformers' rotate_half), the form
    `forward` uses: the same rotation, so the same scores."""
    p = f"encoder_transformer.transformer.layers.{layer}.self_attn."
    d, hd = arch.dimension, arch.head_dim
    kv = arch.num_kv_heads * hd
    fused = take((p + "in_projs.0.weight", p + "in_proj_weight", p + "in_proj.weight"), (d + 2 * kv, d))
    wo = take((p + "out_projs.0.weight", p + "out_proj.weight"), (d, d))
    return (halves_from_interleaved(fused[:d], arch.num_heads), halves_from_interleaved(fused[d:d + kv],
            arch.num_kv_heads), fused[d + kv:], wo)

  def layer(self, layer: int) -> dict[str, str]:
    p = f"encoder_transformer.transformer.layers.{layer}."
    return {"norm1": p + "norm1.", "norm2": p + "norm2.", "fc1": p + "linear1.weight", "fc2": p + "linear2.weight",
            "scale1": p + "layer_scale_1.scale", "scale2": p + "layer_scale_2.scale"}

  def quantizer(self, semantic: bool) -> str:
    return "quantizer.rvq_first." if semantic else "quantizer.rvq_rest."

  def codebook(self, semantic: bool, index: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    p = f"{self.quantizer(semantic)}vq.layers.{index}._codebook."
    return (p + "embedding_sum", p + "embed_sum", p + "embed_avg"), (p + "cluster_usage", p + "cluster_size")


class _TransformersNames:
  """Key names of a `transformers.MimiModel.save_pretrained` folder: the hub's flat layout (conversion_mapping.py
  "MimiModel" maps them onto the module tree)."""

  encoder_prefixes = ("encoder.", "encoder_transformer.", "downsample.")

  def conv(self, index: int, block: int | None = None) -> str:
    return f"encoder.layers.{index}." + (f"block.{block}." if block is not None else "") + "conv."

  def downsample(self) -> str:
    return "downsample.conv.weight"

  def attention(self, take: _Taker, layer: int, arch: MimiArchitecture):
    p = f"encoder_transformer.layers.{layer}.self_attn."
    d, q, kv = arch.dimension, arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    return (take(p + "q_proj.weight", (q, d)), take(p + "k_proj.weight", (kv, d)),
            take(p + "v_proj.weight", (kv, d)), take(p + "o_proj.weight", (d, q)))

  def layer(self, layer: int) -> dict[str, str]:
    p = f"encoder_transformer.layers.{layer}."
    return {"norm1": p + "input_layernorm.", "norm2": p + "post_attention_layernorm.", "fc1": p + "mlp.fc1.weight",
            "fc2": p + "mlp.fc2.weight", "scale1": p + "self_attn_layer_scale.scale",
            "scale2": p + "mlp_layer_scale.scale"}

  def quantizer(self, semantic: bool) -> str:
    return f"quantizer.{'semantic' if semantic else 'acoustic'}_residual_vector_quantizer."

  def codebook(self, semantic: bool, index: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    p = f"{self.quantizer(semantic)}layers.{index}.codebook."
    return (p + "embed_sum",), (p + "cluster_usage",)


def halves_from_interleaved(rows: np.ndarray, heads: int) -> np.ndarray:
  """Reorders each head's output rows [r0, i0, r1, i1, ...] to [r0, r1, ..., i0, i1, ...] (the permutation
  transformers' convert_mimi_checkpoint_to_pytorch.py applies to q and k)."""
  out, d_in = rows.shape
  return rows.reshape(heads, out // heads // 2, 2, d_in).transpose(0, 2, 1, 3).reshape(out, d_in)


def codebook_embedding(embedding_sum: np.ndarray, cluster_usage: np.ndarray) -> np.ndarray:
  """The centroids: the EMA sum over the EMA usage clamped at epsilon (core_vq.py l.179-186,
  MimiEuclideanCodebook.embed), so a dead code of usage 0 is its sum / 1e-5, not a division by zero."""
  return embedding_sum / np.maximum(cluster_usage, np.float32(CODEBOOK_EPSILON))[:, None]


def read_params(weights: ReleaseWeights, names, arch: MimiArchitecture, codebooks: int) -> dict:
  """The encoder's and the first `codebooks` quantizers' tensors, shape-checked, as float32 arrays in the layouts
  `forward` uses: conv kernels [width, in, out], linear kernels [in, out], transformer layers stacked on a leading
  axis, codebooks as centroids [n, bins, dim]. An encoder tensor the architecture does not use is an error too (a
  config that disagrees with the file)."""
  take = _Taker(weights)

  def conv(prefix, c_in, c_out, width, bias=True):
    out = {"kernel": take(prefix + "weight", (c_out, c_in, width)).transpose(2, 1, 0)}
    if bias:
      out["bias"] = take(prefix + "bias", (c_out,))
    return out

  stem, stages, final = seanet_indices(arch)
  width = arch.n_filters
  params = {"stem": conv(names.conv(stem), 1, width, arch.kernel_size), "stages": []}
  for (blocks, down), ratio in zip(stages, arch.ratios):
    hidden = width // arch.compress
    params["stages"].append({
        "blocks": [{"conv1": conv(names.conv(b, 1), width, hidden, arch.residual_kernel_size),
                    "conv2": conv(names.conv(b, 3), hidden, width, 1)} for b in blocks],
        "down": conv(names.conv(down), width, 2 * width, 2 * ratio)})
    width *= 2
  params["final"] = conv(names.conv(final), width, arch.dimension, arch.last_kernel_size)

  d, ffn = arch.dimension, arch.dim_feedforward
  layers = []
  for layer in range(arch.num_layers):
    keys = names.layer(layer)
    wq, wk, wv, wo = names.attention(take, layer, arch)
    ones = np.ones((d,), np.float32)
    layers.append({
        "norm1_scale": take(keys["norm1"] + "weight", (d,)), "norm1_bias": take(keys["norm1"] + "bias", (d,)),
        "q": wq.T, "k": wk.T, "v": wv.T, "o": wo.T,
        "attn_scale": take(keys["scale1"], (d,)) if arch.layer_scale else ones,
        "norm2_scale": take(keys["norm2"] + "weight", (d,)), "norm2_bias": take(keys["norm2"] + "bias", (d,)),
        "fc1": take(keys["fc1"], (ffn, d)).T, "fc2": take(keys["fc2"], (d, ffn)).T,
        "mlp_scale": take(keys["scale2"], (d,)) if arch.layer_scale else ones})
  params["transformer"] = {k: np.stack([layer[k] for layer in layers]) for k in layers[0]}
  params["downsample"] = take(names.downsample(), (d, d, 2 * arch.downsample_stride)).transpose(2, 1, 0)

  for semantic, count in ((True, min(codebooks, arch.n_q_semantic)), (False, codebooks - arch.n_q_semantic)):
    if count <= 0:
      continue
    group = "semantic" if semantic else "acoustic"
    tables = []
    for index in range(count):
      sums, usages = names.codebook(semantic, index)
      tables.append(codebook_embedding(take(sums, (arch.bins, arch.codebook_dim)), take(usages, (arch.bins,))))
    params[group] = {"in_proj": take(names.quantizer(semantic) + "input_proj.weight",
                                     (arch.codebook_dim, d, 1))[:, :, 0].T, "codebooks": np.stack(tables)}

  unused = [k for k in weights.keys() if k.startswith(names.encoder_prefixes) and k not in take.taken]
  if unused:
    raise WeightsError(f"{weights.path}: encoder tensors the config does not describe: {', '.join(unused[:5])}"
                       + (f" and {len(unused) - 5} more" if len(unused) > 5 else ""))
  return params


# ---- forward: pure JAX ----

def _pad_left(x, amount: int, mode: str):
  import jax.numpy as jnp

  if amount == 0:
    return x
  if mode == "replicate":
    return jnp.concatenate([jnp.repeat(x[:, :1], amount, axis=1), x], axis=1)
  return jnp.pad(x, ((0, 0), (amount, 0), (0, 0)))


def causal_conv(x, conv: dict, stride: int = 1, dilation: int = 1, pad_mode: str = "constant"):
  """[B, T, C_in] -> [B, T / stride, C_out]: a causal convolution, left-padded by its effective kernel minus its
  stride (conv.py l.240, l.255: the zero or first-value state a fresh StreamingConv1d starts from). T must be a
  multiple of the stride, as moshi asserts (conv.py l.248)."""
  effective = (conv["kernel"].shape[0] - 1) * dilation + 1
  return conv1d(_pad_left(x, effective - stride, pad_mode), conv, stride, "VALID", dilation)


def pad_past(x, lengths, mode: str):
  """Each row's steps at and past its length replaced as transformers pads a strided convolution's input (zeros,
  or the last valid step for replicate), so what they feed is what transformers computes for that row alone."""
  import jax.numpy as jnp

  valid = jnp.arange(x.shape[1])[None, :, None] < lengths[:, None, None]
  if mode == "replicate":
    last = jnp.take_along_axis(x, jnp.clip(lengths - 1, 0, x.shape[1] - 1)[:, None, None], axis=1)
    return jnp.where(valid, x, last)
  return jnp.where(valid, x, 0)


def fill_before_start(x, starts, mode: str):
  """Rows that begin `starts` steps into their audio (negative: before it): the steps before the audio's first
  hold what a causal convolution pads there (zeros, or the first step for replicate)."""
  import jax.numpy as jnp

  before = (starts[:, None] + jnp.arange(x.shape[1])[None, :] < 0)[..., None]
  if mode == "replicate":
    first = jnp.take_along_axis(x, jnp.clip(-starts, 0, x.shape[1] - 1)[:, None, None], axis=1)
    return jnp.where(before, first, x)
  return jnp.where(before, 0, x)


def seanet_stages(params, x, lengths, arch: MimiArchitecture, stages: range, per_layer_padding: bool, starts=None):
  """The stem (when `stages` starts at 0) and SEANet's `stages` on [B, T, C] at their input rate; `starts` (optional,
  [B], in steps of that rate) places rows that are windows of longer audio (`seanet`). Returns x and the lengths
  at the output rate."""
  import jax

  fill = (lambda h: h) if starts is None else (lambda h: fill_before_start(h, starts, arch.pad_mode))
  conv = lambda h, weights, **kw: causal_conv(fill(h), weights, pad_mode=arch.pad_mode, **kw)
  if stages.start == 0:
    x = conv(x, params["stem"])
  for index in stages:
    stage, ratio = params["stages"][index], arch.ratios[index]
    for j, block in enumerate(stage["blocks"]):
      h = conv(jax.nn.elu(x), block["conv1"], dilation=arch.dilation_base ** j)
      x = x + conv(jax.nn.elu(h), block["conv2"])
    h = jax.nn.elu(x)
    if per_layer_padding:
      h = pad_past(h, lengths if starts is None else lengths - starts, arch.pad_mode)
    x = conv(h, stage["down"], stride=ratio)
    lengths = -(-lengths // ratio)
    starts = None if starts is None else starts // ratio
  return x, lengths


def window_stages(arch: MimiArchitecture) -> tuple[int, int]:
  """(how many of SEANet's first stages run over windows of one frame, the samples of history each window carries):
  as many stages as keep that history (their receptive field, in whole steps of their output) within an eighth of
  a frame, at most WINDOW_STAGES."""
  count, history, rate = 0, arch.kernel_size - 1, 1
  for ratio in arch.ratios[:WINDOW_STAGES]:
    history += sum((arch.residual_kernel_size - 1) * arch.dilation_base**j for j in range(arch.n_residual_layers)) \
        * rate + ratio * rate  # the residual convs, then the strided conv (kernel 2 * ratio) reads `ratio` back
    rate *= ratio
    if -(-history // rate) * rate > arch.frame_size // 8:
      break
    count, halo = count + 1, -(-history // rate) * rate
  return (count, halo) if count else (0, 0)


def seanet(params, x, lengths, arch: MimiArchitecture, per_layer_padding: bool):
  """Audio [B, T, 1] -> [B, T / hop, dimension] and the rows' valid lengths there (ceil at each stride).

  The first stages (`window_stages`) run at the audio's rate over 64-256 channels: as whole rows their tensors
  leave the caches between one elementwise pass and the next, and memory, not arithmetic, sets their time. They run
  instead over windows of one frame plus the history their receptive field reads (40 samples for Mimi), a few
  windows at a time in a loop, each window's outputs past its history kept: every kept step reads the same inputs
  as over the whole row, and the steps before the audio's start are filled as the causal padding fills them."""
  import jax
  import jax.numpy as jnp

  count, halo = window_stages(arch)
  batch, steps = x.shape[:2]
  if count:
    frame, per_step = arch.frame_size, WINDOWS_PER_STEP
    frames = steps // frame
    chunks = x.reshape(batch, frames, frame)
    history = jnp.pad(chunks[:, :-1, frame - halo:], ((0, 0), (1, 0), (0, 0)))
    windows = jnp.concatenate([history, chunks], axis=2).reshape(batch * frames, halo + frame, 1)
    starts = jnp.tile(jnp.arange(frames) * frame - halo, batch)
    window_lengths = jnp.repeat(lengths, frames)
    extra = -len(windows) % per_step  # zero windows that start past every row's audio
    windows = jnp.pad(windows, ((0, extra), (0, 0), (0, 0)))
    starts, window_lengths = jnp.pad(starts, (0, extra), constant_values=steps), jnp.pad(window_lengths, (0, extra))
    group = lambda a: a.reshape((-1, per_step) + a.shape[1:])
    run = lambda w: seanet_stages(params, w[0], w[2], arch, range(count), per_layer_padding, w[1])[0]
    out = jax.lax.map(run, (group(windows), group(starts), group(window_lengths)))
    rate = math.prod(arch.ratios[:count])
    out = out.reshape((-1,) + out.shape[2:])[: batch * frames, halo // rate:]
    x = out.reshape(batch, steps // rate, out.shape[-1])
    for ratio in arch.ratios[:count]:
      lengths = -(-lengths // ratio)
  x, lengths = seanet_stages(params, x, lengths, arch, range(count, len(arch.ratios)), per_layer_padding)
  return causal_conv(jax.nn.elu(x), params["final"], pad_mode=arch.pad_mode), lengths


def rope_tables(steps: int, head_dim: int, theta: float):
  """cos, sin [steps, head_dim / 2]: frequency i is theta^(-2i / head_dim) (rope.py l.46)."""
  import jax.numpy as jnp

  inverse = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
  angles = jnp.arange(steps, dtype=jnp.float32)[:, None] * inverse[None, :]
  return jnp.cos(angles), jnp.sin(angles)


def _rotate(x, cos, sin):
  """RoPE on [B, T, H, D] whose halves are the pairs' two parts (transformers' rotate_half)."""
  import jax.numpy as jnp

  first, second = jnp.split(x, 2, axis=-1)
  cos, sin = cos[None, :, None].astype(x.dtype), sin[None, :, None].astype(x.dtype)
  return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def transformer(params, x, arch: MimiArchitecture):
  """The encoder transformer on [B, T, D]: pre-norm layers, attention over the last `context` steps
  (transformer.py l.579-581: 0 <= q - k < context; transformers' sliding_window), layer-scaled residuals, an
  exact-GELU MLP (transformer.py l.648, F.gelu). Causal, so right padding changes no earlier step."""
  import jax
  import jax.numpy as jnp

  highest = jax.lax.Precision.HIGHEST
  steps = x.shape[1]
  cos, sin = rope_tables(steps, arch.head_dim, arch.rope_theta)
  delta = jnp.arange(steps)[:, None] - jnp.arange(steps)[None, :]
  visible = (delta >= 0) & (delta < arch.context if arch.context is not None else True)
  group = arch.num_heads // arch.num_kv_heads

  def layer(x, p):
    p = jax.tree_util.tree_map(lambda a: a.astype(x.dtype), p)
    batch = x.shape[0]
    h = layer_norm(x, p["norm1_scale"], p["norm1_bias"], arch.norm_eps)
    q = jnp.matmul(h, p["q"], precision=highest).reshape(batch, steps, arch.num_heads, arch.head_dim)
    k = jnp.matmul(h, p["k"], precision=highest).reshape(batch, steps, arch.num_kv_heads, arch.head_dim)
    v = jnp.matmul(h, p["v"], precision=highest).reshape(batch, steps, arch.num_kv_heads, arch.head_dim)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    attended = attention(q, k, v, visible[None], highest).reshape(batch, steps, -1)
    x = x + p["attn_scale"] * jnp.matmul(attended, p["o"], precision=highest)
    h = layer_norm(x, p["norm2_scale"], p["norm2_bias"], arch.norm_eps)
    h = jax.nn.gelu(jnp.matmul(h, p["fc1"], precision=highest), approximate=False)
    return x + p["mlp_scale"] * jnp.matmul(h, p["fc2"], precision=highest), None

  return jax.lax.scan(layer, x, params)[0]


def quantize(params, latents):
  """Split RVQ codes [B, F, K]: the semantic codebook(s) on their own projection of the latents, the acoustic
  ones residually on theirs (vq.py SplitResidualVectorQuantizer.encode; core_vq.py ResidualVectorQuantization)."""
  import jax
  import jax.numpy as jnp

  def level(residual, table):
    index = nearest(residual, table)
    return residual - table[index], index

  codes = []
  for group in ("semantic", "acoustic"):
    if group in params:
      projected = jnp.matmul(latents.astype(jnp.float32), params[group]["in_proj"].astype(jnp.float32),
                             precision=jax.lax.Precision.HIGHEST)
      codes.append(jax.lax.scan(level, projected, params[group]["codebooks"].astype(jnp.float32))[1])
  return jnp.moveaxis(jnp.concatenate(codes), 0, -1)


def forward(params, audio, lengths, arch: MimiArchitecture, per_layer_padding: bool) -> dict:
  """audio [B, T, 1] (T a multiple of the frame size, zeros past each row's length) -> the pre-transformer
  embeddings, the latents at the frame rate, and int32 codes [B, T / frame_size, K]."""
  embeddings, lengths = seanet(params, audio, lengths, arch, per_layer_padding)
  hidden = transformer(params["transformer"], embeddings, arch)
  if per_layer_padding:
    hidden = pad_past(hidden, lengths, "replicate")
  # ConvDownsample1d: a learnt conv, kernel 2 * stride, no bias, replicate padding (resample.py l.43-51).
  latents = causal_conv(hidden, {"kernel": params["downsample"]}, stride=arch.downsample_stride,
                        pad_mode="replicate")
  return {"embeddings": embeddings, "hidden": hidden, "latents": latents, "codes": quantize(params, latents)}


def detect_layout(path: str) -> str:
  """kyutai for a .safetensors file (or a folder of Kyutai's files), transformers for a folder whose config.json
  is a Mimi config."""
  if os.path.isdir(path):
    config = os.path.join(path, "config.json")
    if os.path.exists(config) and read_json(config, MimiConfigError).get("model_type") == "mimi":
      return "transformers"
    return "kyutai"
  if not os.path.exists(path):
    raise MissingFileError(f"Mimi weights {path} do not exist")
  return "kyutai"


def kyutai_files(path: str, mimi_config: str | None) -> tuple[str, dict, str]:
  """(weights file, mimi_config, where it came from) of a Kyutai release: a .safetensors file, or a repo folder
  whose config.json may name them (`mimi_name`, `mimi_config_name`, loaders.py l.226-258)."""
  if os.path.isdir(path):
    repo_config = os.path.join(path, "config.json")
    entries = read_json(repo_config, MimiConfigError) if os.path.exists(repo_config) else {}
    if mimi_config is None and entries.get("mimi_config_name"):
      mimi_config = os.path.join(path, entries["mimi_config_name"])
    path = os.path.join(path, entries.get("mimi_name", KYUTAI_FILE))
  if mimi_config is None:
    return path, KYUTAI_MIMI_CONFIG, "moshi.models.loaders._mimi_config"
  return path, read_json(mimi_config, MimiConfigError), mimi_config


class MimiTokenizer(JaxAudioTokenizer):
  """Mimi's first `codebooks` codes (8 by default, as get_mimi) of 24 kHz audio, at 12.5 frames a second."""

  batch_frames = 1 << 19  # samples per batch (~22 s of 24 kHz audio): raw audio is long, its layers are narrow

  def __init__(self, path: str, codebooks: int = 8, layout: str | None = None, mimi_config: str | None = None,
               padding: str | None = None):
    layout = layout or detect_layout(path)
    if layout not in LAYOUTS:
      raise MimiConfigError(f"Mimi layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
    if layout == "kyutai":
      weights_path, config, source = kyutai_files(path, mimi_config)
      arch, names = kyutai_architecture(config, source), _KyutaiNames()
    else:
      config_path = os.path.join(path, "config.json")
      config = read_json(config_path, MimiConfigError)
      weights_path, arch, names = path, transformers_architecture(config, config_path), \
          _TransformersNames()
    padding = padding or layout
    if padding not in PADDINGS:
      raise MimiConfigError(f"Mimi padding {padding!r}: choose one of {', '.join(PADDINGS)}")
    if not arch.n_q_semantic <= codebooks <= arch.n_q:
      raise MimiConfigError(f"Mimi codebooks {codebooks}: {path} has {arch.n_q} quantizers, "
                            f"of which the first {arch.n_q_semantic} are semantic")
    weights = ReleaseWeights(weights_path)
    self.arch, self.layout, self.padding, self.path = arch, layout, padding, path
    self.params = read_params(weights, names, arch, codebooks)
    self.weights_sha = weights.fingerprint()
    self.sample_rate = arch.sample_rate
    self.num_codebooks = codebooks
    self.codebook_sizes = (arch.bins,) * codebooks
    self.frame_rate = arch.frame_rate
    self.time_multiple = arch.frame_size  # whole frames: every stride divides the padded length
    self.attention_heads, self.attention_stride = arch.num_heads, arch.hop
    # per sample: SEANet's first stages run over windows of a frame (`seanet`), so the widest whole-row tensors
    # are the later stages' (2 n_filters channels after the first stride), a few alive at once
    self.frame_bytes = 4 * 4 * 2 * arch.n_filters // arch.ratios[0]

  @classmethod
  def from_settings(cls, settings: dict, where) -> MimiTokenizer:
    """`model_dir` (a Kyutai .safetensors file or folder, or a transformers folder) resolved by `where` (the
    tokenizer folder itself when absent); `codebooks` (8); `layout`, `mimi_config` (Kyutai's JSON; default
    get_mimi's own), `padding` (kyutai | transformers; default the layout's); `dtype`."""
    mimi_config = settings.get("mimi_config")
    return cls(where(settings.get("model_dir", ".")), int(settings.get("codebooks", 8)), settings.get("layout"),
               where(mimi_config) if mimi_config else None, settings.get("padding"))

  def prepare(self, segment: np.ndarray) -> tuple[np.ndarray, int]:
    """The wave as [samples, 1]; ceil(samples / frame_size) codes, a partial last frame counted, as moshi pads to
    whole frames (conv.py pad_for_conv1d) and transformers' lengths round up at every stride."""
    return np.asarray(segment, np.float32)[:, None], -(-len(segment) // self.arch.frame_size)

  def apply(self, params, features, lengths):
    return forward(params, features, lengths, self.arch, self.padding == "transformers")["codes"]

  def identity(self) -> dict:
    return {"type": "mimi", "codebooks": self.num_codebooks, "layout": self.layout, "padding": self.padding,
            "dtype": self.dtype, "architecture": dataclasses.asdict(self.arch), "weights_sha": self.weights_sha}
