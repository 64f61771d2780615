"""HuBERT units in JAX (TWIST, SIMS): 16 kHz audio -> one layer's hidden states of a transformers `HubertModel`
folder -> the nearest k-means centroid per frame, runs of equal units collapsed when asked.

The forward follows transformers' models/hubert/modeling_hubert.py (5.24, cited by class below): feature encoder,
feature projection, weight-normed positional convolution, post-norm (base) or pre-norm (large) encoder layers.
Layer k's features are `HubertModel(...).hidden_states[k]` of the wave alone. Index 0 is the first layer's input:
after the positional convolution, and after the encoder LayerNorm in the post-norm variant. Index k is layer k's
output; in the pre-norm variant never after its final LayerNorm, since 5.x records the layers' outputs
(`capture_outputs(tie_last_hidden_states=False)`), where 4.x gave the last index after that LayerNorm.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from s2sjax.runtime.errors import MissingFileError, UserError
from s2sjax.numerics.norms import layer_norm
from tasks.audio.base import dedup, hash_array
from tasks.audio.jax_tokenizer import JaxAudioTokenizer
from tasks.audio.ops import attention, conv1d, dense, nearest
from tasks.audio.weights import INDEX, SINGLE, ReleaseWeights, read_json

SAMPLE_RATE = 16000
# HubertForCTC and friends hold the HubertModel as `self.hubert` (HubertPreTrainedModel.base_model_prefix).
PREFIX = "hubert."
NORM_EPS = 1e-5  # nn.GroupNorm / nn.LayerNorm defaults: the feature encoder's norms never take config's eps
# The two spellings of the positional conv's weight norm: nn.utils.weight_norm (older checkpoints) and
# nn.utils.parametrizations.weight_norm (what transformers 5 saves); (magnitude g, direction v) each.
WEIGHT_NORM_KEYS = (("weight_g", "weight_v"),
                    ("parametrizations.weight.original0", "parametrizations.weight.original1"))


class HubertError(UserError, ValueError):
  """A HuBERT folder or k-means file this port cannot serve: unreadable, a switch not implemented, a shape that
  does not fit. Names the file."""


@dataclasses.dataclass(frozen=True)
class HubertArchitecture:
  """The config.json entries the forward depends on."""

  conv_dim: tuple[int, ...]
  conv_kernel: tuple[int, ...]
  conv_stride: tuple[int, ...]
  conv_bias: bool
  feat_extract_norm: str  # "group": GroupNorm over time after the first conv only; "layer": LayerNorm after each
  feat_proj_layer_norm: bool
  hidden_size: int
  num_hidden_layers: int
  num_attention_heads: int
  intermediate_size: int
  num_conv_pos_embeddings: int
  num_conv_pos_embedding_groups: int
  do_stable_layer_norm: bool  # True: pre-norm layers (large); False: post-norm (base)
  layer_norm_eps: float

  @property
  def samples_per_frame(self) -> int:
    return math.prod(self.conv_stride)


# transformers' HubertConfig defaults (configuration_hubert.py, 5.24): what it reads for a key config.json lacks.
DEFAULTS = {"conv_dim": (512,) * 7, "conv_kernel": (10, 3, 3, 3, 3, 2, 2), "conv_stride": (5, 2, 2, 2, 2, 2, 2),
            "conv_bias": False, "feat_extract_norm": "group", "feat_proj_layer_norm": True, "hidden_size": 768,
            "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
            "num_conv_pos_embeddings": 128, "num_conv_pos_embedding_groups": 16, "do_stable_layer_norm": False,
            "layer_norm_eps": 1e-5}
# Switches whose other values change the forward and are not implemented: (key, the implemented value, default).
IMPLEMENTED = (("feat_extract_activation", "gelu", "gelu"), ("hidden_act", "gelu", "gelu"),
               ("conv_pos_batch_norm", False, False), ("adapter_attn_dim", None, None))


def read_config(config_path: str) -> HubertArchitecture:
  """A HubertModel config.json, refusing by name the switches this port lacks."""
  config = read_json(config_path, HubertError)
  if config.get("model_type", "hubert") != "hubert":
    raise HubertError(f"{config_path}: model_type={config['model_type']!r}, this port reads HuBERT (\"hubert\") only")
  for key, implemented, default in IMPLEMENTED:
    if config.get(key, default) != implemented:
      raise HubertError(f"{config_path}: {key}={config[key]!r} is not implemented (only {implemented!r})")
  values = {key: config.get(key, default) for key, default in DEFAULTS.items()}
  for key in ("conv_dim", "conv_kernel", "conv_stride"):
    values[key] = tuple(int(n) for n in values[key])
  parsed = HubertArchitecture(**values)
  if not len(parsed.conv_dim) == len(parsed.conv_kernel) == len(parsed.conv_stride):
    raise HubertError(f"{config_path}: conv_dim, conv_kernel and conv_stride differ in length")
  if parsed.feat_extract_norm not in ("group", "layer"):
    raise HubertError(f"{config_path}: feat_extract_norm={parsed.feat_extract_norm!r} is not one of 'group', 'layer'")
  if parsed.hidden_size % parsed.num_attention_heads or parsed.hidden_size % parsed.num_conv_pos_embedding_groups:
    raise HubertError(f"{config_path}: hidden_size {parsed.hidden_size} is not divisible by num_attention_heads "
                      "and num_conv_pos_embedding_groups")
  return parsed


def conv_lengths(samples, config: HubertArchitecture) -> list:
  """Frames after each feature-encoder conv (no padding: floor((n - kernel) / stride) + 1, as
  `_get_feat_extract_output_lengths`); works on ints and on integer arrays. A count <= 0 means no frame."""
  lengths = []
  for kernel, stride in zip(config.conv_kernel, config.conv_stride):
    samples = (samples - kernel) // stride + 1
    lengths.append(samples)
  return lengths


def code_frames(samples: int, config: HubertArchitecture) -> int:
  return max(0, int(conv_lengths(samples, config)[-1]))


def read_params(weights: ReleaseWeights, config: HubertArchitecture, layer: int) -> dict:
  """The tensors hidden_states[layer] depends on, shape-checked, as float32 arrays in the layouts the forward
  uses: linear kernels [in, out], conv kernels [width, in, out], the first `layer` encoder layers stacked."""
  hidden, ffn = config.hidden_size, config.intermediate_size

  def linear(key, n_in, n_out):
    return {"kernel": weights.take(f"{key}.weight", (n_out, n_in)).T, "bias": weights.take(f"{key}.bias", (n_out,))}

  def norm(key, n):
    return {"scale": weights.take(f"{key}.weight", (n,)), "bias": weights.take(f"{key}.bias", (n,))}

  convs = []
  for i, (n_out, width) in enumerate(zip(config.conv_dim, config.conv_kernel)):
    key = f"feature_extractor.conv_layers.{i}"
    n_in = config.conv_dim[i - 1] if i else 1
    conv = {"kernel": weights.take(f"{key}.conv.weight", (n_out, n_in, width)).transpose(2, 1, 0)}
    if config.conv_bias:
      conv["bias"] = weights.take(f"{key}.conv.bias", (n_out,))
    if config.feat_extract_norm == "layer" or i == 0:  # HubertFeatureEncoder: group norm on the first conv only
      conv["norm"] = norm(f"{key}.layer_norm", n_out)
    convs.append(conv)
  params = {"convs": convs, "projection": linear("feature_projection.projection", config.conv_dim[-1], hidden),
            "pos_conv": positional_conv(weights, config)}
  if config.feat_proj_layer_norm:
    params["projection_norm"] = norm("feature_projection.layer_norm", config.conv_dim[-1])
  if not config.do_stable_layer_norm:  # HubertEncoder normalizes before its first layer (hidden_states[0] too)
    params["encoder_norm"] = norm("encoder.layer_norm", hidden)

  def encoder_layer(i):
    key = f"encoder.layers.{i}"
    return {"attn_norm": norm(f"{key}.layer_norm", hidden),
            **{name: linear(f"{key}.attention.{name}_proj", hidden, hidden) for name in ("q", "k", "v", "out")},
            "ffn_in": linear(f"{key}.feed_forward.intermediate_dense", hidden, ffn),
            "ffn_out": linear(f"{key}.feed_forward.output_dense", ffn, hidden),
            "ffn_norm": norm(f"{key}.final_layer_norm", hidden)}

  if layer:
    layers = [encoder_layer(i) for i in range(layer)]
    params["layers"] = {name: {part: np.stack([l[name][part] for l in layers]) for part in layers[0][name]}
                        for name in layers[0]}
  return params


def positional_conv(weights: ReleaseWeights, config: HubertArchitecture) -> dict:
  """The positional conv's weight from its weight norm over dim 2 (HubertPositionalConvEmbedding): per kernel tap
  t, w[:, :, t] = g[t] * v[:, :, t] / ||v[:, :, t]||, in either key spelling; kernel [width, in/groups, out]."""
  hidden, width = config.hidden_size, config.num_conv_pos_embeddings
  key = "encoder.pos_conv_embed.conv"
  spelled = [pair for pair in WEIGHT_NORM_KEYS if weights.has(f"{key}.{pair[0]}")]
  if not spelled:
    raise HubertError(f"{weights.path}: the positional conv's weight norm is missing (neither "
                      + " nor ".join(repr(weights.prefix + f"{key}.{g}") for g, _ in WEIGHT_NORM_KEYS) + ")")
  g_key, v_key = spelled[0]
  g = weights.take(f"{key}.{g_key}", (1, 1, width))
  v = weights.take(f"{key}.{v_key}", (hidden, hidden // config.num_conv_pos_embedding_groups, width))
  kernel = v * (g / np.sqrt((v * v).sum(axis=(0, 1), keepdims=True)))
  return {"kernel": kernel.transpose(2, 1, 0).astype(np.float32), "bias": weights.take(f"{key}.bias", (hidden,))}


# ---- the forward: pure functions of (params, waves, lengths) -----------------------------------------------------

def _norm(x, p, eps):
  return layer_norm(x, p["scale"], p["bias"], eps)


def _masked_group_norm(x, p, valid):
  """nn.GroupNorm with a group per channel: each channel normalized over the row's valid frames only (alone, a
  row's statistics cover exactly those), biased variance, fp32 statistics."""
  import jax.numpy as jnp

  x32 = x.astype(jnp.float32)
  count = jnp.maximum(valid.sum(axis=1, keepdims=True), 1)
  mean = jnp.where(valid, x32, 0).sum(axis=1, keepdims=True) / count
  centered = x32 - mean
  variance = jnp.where(valid, centered * centered, 0).sum(axis=1, keepdims=True) / count
  normed = (centered / jnp.sqrt(variance + NORM_EPS)).astype(x.dtype)
  return normed * p["scale"].astype(x.dtype) + p["bias"].astype(x.dtype)


def _framed_conv(x, kernel, stride: int):
  """conv1d of x [B, T, C_in] with no padding, as a matmul over frames of `stride` steps when the kernel spans a
  whole number of them (HuBERT's first: 10 samples, stride 5) and T is a multiple of the stride (the runner's
  lengths are): the same products, summed as XLA:CPU's convolution sums them (equal bits where measured), at twice
  its speed there for one input channel."""
  import jax.numpy as jnp

  width, channels, _ = kernel.shape
  if width % stride or x.shape[1] % stride:
    return conv1d(x, {"kernel": kernel}, stride)
  frames = x.reshape(x.shape[0], -1, stride * channels)
  span = width // stride
  windows = jnp.concatenate([frames[:, k: frames.shape[1] - span + 1 + k] for k in range(span)], axis=-1)
  return dense(windows, {"kernel": kernel.reshape(width * channels, -1)})


def _encoder_layer(hidden, p, valid, config: HubertArchitecture):
  """HubertEncoderLayer (post-norm) or HubertEncoderLayerStableLayerNorm (pre-norm); attention over the row's
  valid frames, as the row alone attends over all of its frames."""
  import jax

  batch, frames, width = hidden.shape
  heads, eps = config.num_attention_heads, config.layer_norm_eps
  split = lambda t: t.reshape(batch, frames, heads, width // heads)
  feed_forward = lambda x: dense(jax.nn.gelu(dense(x, p["ffn_in"]), approximate=False), p["ffn_out"])

  def attend(x):
    q, k, v = (split(dense(x, p[name])) for name in ("q", "k", "v"))
    return dense(attention(q, k, v, valid[:, None, :]).reshape(hidden.shape), p["out"])

  if config.do_stable_layer_norm:
    hidden = hidden + attend(_norm(hidden, p["attn_norm"], eps))
    return hidden + feed_forward(_norm(hidden, p["ffn_norm"], eps))
  hidden = _norm(hidden + attend(hidden), p["attn_norm"], eps)
  return _norm(hidden + feed_forward(hidden), p["ffn_norm"], eps)


def hidden_states(params: dict, waves, lengths, config: HubertArchitecture):
  """waves [B, T, 1] (zero past each row's `lengths[b]` samples) -> hidden_states[layer] [B, F, hidden], F the
  frames of T samples, `layer` the number of encoder layers in `params`. Rows are batch-invariant: frame f < a row's
  own frame count is what HubertModel computes for that row alone; frames past it are padding."""
  import jax
  import jax.numpy as jnp

  dtype = params["projection"]["kernel"].dtype
  lengths = jnp.asarray(lengths, jnp.int32)
  frame_counts = conv_lengths(lengths, config)
  x = jnp.where((jnp.arange(waves.shape[1]) < lengths[:, None])[..., None], waves, 0).astype(dtype)
  for i, (p, stride) in enumerate(zip(params["convs"], config.conv_stride)):
    x = _framed_conv(x, p["kernel"], stride) if i == 0 else conv1d(x, {"kernel": p["kernel"]}, stride)
    if "bias" in p:
      x = x + p["bias"].astype(dtype)
    if config.feat_extract_norm == "layer":
      x = _norm(x, p["norm"], NORM_EPS)
    elif i == 0:
      x = _masked_group_norm(x, p["norm"], (jnp.arange(x.shape[1]) < frame_counts[0][:, None])[..., None])
    x = jax.nn.gelu(x, approximate=False)
  if "projection_norm" in params:
    x = _norm(x, params["projection_norm"], config.layer_norm_eps)
  x = dense(x, params["projection"])

  valid = jnp.arange(x.shape[1]) < frame_counts[-1][:, None]
  # Alone, the positional conv's zero padding starts right after the row's last frame: zero the padding frames.
  x = jnp.where(valid[..., None], x, 0)
  width = config.num_conv_pos_embeddings
  # padding width//2 each side, then SamePad drops the last output when width is even: (width//2, (width-1)//2).
  positions = conv1d(x, params["pos_conv"], 1, ((width // 2, (width - 1) // 2),),
                     groups=config.num_conv_pos_embedding_groups)
  x = x + jax.nn.gelu(positions, approximate=False)
  if "encoder_norm" in params:
    x = _norm(x, params["encoder_norm"], config.layer_norm_eps)
  if "layers" in params:
    x, _ = jax.lax.scan(lambda h, p: (_encoder_layer(h, p, valid, config), None), x, params["layers"])
  return x


def read_centroids(path: str, hidden: int) -> np.ndarray:
  try:
    centroids = np.load(path)
  except (OSError, ValueError) as e:
    raise HubertError(f"k-means centroids {path} cannot be read as .npy ({e})") from e
  if centroids.ndim != 2 or centroids.shape[1] != hidden or len(centroids) == 0:
    raise HubertError(f"{path}: centroids must be [units, {hidden}] (HuBERT's hidden size), got {centroids.shape}")
  return centroids.astype(np.float32)


def open_weights(model_dir: str) -> ReleaseWeights:
  """The folder's safetensors, under the `hubert.` prefix when the checkpoint carries it."""
  if not any(os.path.exists(os.path.join(model_dir, name)) for name in (SINGLE, INDEX)):
    if os.path.exists(os.path.join(model_dir, "pytorch_model.bin")):
      raise HubertError(f"{model_dir} holds pytorch_model.bin only, which cannot be read without torch: re-save it "
                        "as safetensors (HubertModel.from_pretrained(dir).save_pretrained(dir, "
                        "safe_serialization=True))")
  weights = ReleaseWeights(model_dir)
  probe = "feature_projection.projection.weight"
  if not weights.has(probe) and weights.has(PREFIX + probe):
    weights = ReleaseWeights(model_dir, prefix=PREFIX)
  return weights


class HubertKmeansTokenizer(JaxAudioTokenizer):
  """Features of one HuBERT layer, each frame assigned to the nearest of the given centroids [units, hidden]."""

  sample_rate = SAMPLE_RATE
  num_codebooks = 1
  # The features are samples: about a minute of audio per batch keeps activations near the other tokenizers'.
  batch_frames = 1 << 20

  def __init__(self, model_dir: str, centroids_path: str, layer: int, deduplicate: bool = True, pad: int = 0):
    if not os.path.isdir(model_dir):
      raise MissingFileError(f"HuBERT model directory {model_dir} does not exist")
    self.config = c = read_config(os.path.join(model_dir, "config.json"))
    if not 0 <= layer <= c.num_hidden_layers:
      raise HubertError(f"{model_dir}: layer {layer} is outside HuBERT's 0..{c.num_hidden_layers}")
    centroids = read_centroids(centroids_path, c.hidden_size)
    weights = open_weights(model_dir)
    self.params = {**read_params(weights, c, layer), "centroids": centroids}
    if pad < 0:
      raise HubertError(f"{model_dir}: pad {pad} is not a number of samples (0 or more)")
    # Zero samples laid on both sides of every recording before the model runs: SlamKit's extractor pads 40
    # (slp-rl/slamkit 388b402 slamkit/feature_extractor/hubert_feature_extractor.py:42, `F.pad(wav, (40, 40))`).
    self.layer, self.deduplicate, self.pad = layer, deduplicate, pad
    self.codebook_sizes = (len(centroids),)
    self.frame_rate = SAMPLE_RATE / c.samples_per_frame
    self.time_multiple = c.samples_per_frame
    self.attention_heads = c.num_attention_heads if layer else 0
    self.attention_stride = c.samples_per_frame
    # per sample: the first convolution's channels at its stride, in the group norm's fp32 copies
    self.frame_bytes = 4 * 4 * c.conv_dim[0] // c.conv_stride[0]
    self._identity = {"type": "hubert_kmeans", "layer": layer, "dedup": deduplicate, "units": len(centroids),
                      "centroids_sha": hash_array(centroids), "weights_sha": weights.fingerprint(),
                      **({"pad": pad} if pad else {})}

  @classmethod
  def from_settings(cls, settings: dict, where) -> HubertKmeansTokenizer:
    """`model_dir` (the tokenizer folder itself when absent), `centroids`, `layer`, `dedup` (default True), `pad`
    (zero samples each side, default 0; SlamKit's 40), `dtype` float32 or bfloat16."""
    return cls(where(settings.get("model_dir", ".")), where(settings["centroids"]), int(settings["layer"]),
               bool(settings.get("dedup", True)), int(settings.get("pad", 0))).configure(
                 dtype=settings.get("dtype", "float32"))

  def prepare(self, segment: np.ndarray) -> tuple[np.ndarray, int]:
    """Raw samples [n, 1], `pad` zeros each side; audio shorter than the first conv's kernel yields no frame and is
    dropped."""
    samples = np.pad(np.asarray(segment, np.float32), self.pad)
    return samples[:, None], code_frames(len(samples), self.config)

  def features(self, params, waves, lengths):
    """hidden_states[layer] [B, F, hidden] of waves [B, T, 1] zero-padded past `lengths`."""
    return hidden_states(params, waves, lengths, self.config)

  def apply(self, params, features, lengths):
    return nearest(self.features(params, features, lengths), params["centroids"])[..., None]

  def finish(self, codes: np.ndarray) -> np.ndarray:
    return dedup(codes) if self.deduplicate else codes

  def identity(self) -> dict:
    return {**self._identity, "dtype": self.dtype}
