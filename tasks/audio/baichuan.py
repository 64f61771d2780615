"""Baichuan-Audio's audio tokenizer in JAX: 16 kHz audio -> 8 residual-VQ codes per 80 ms (12.5 frames a second),
as `OmniAudioTokenizer` computes them (Baichuan-Omni-1.5 @51f55ff, the code Baichuan-Audio ships,
`baichuan-omni/model/`): Whisper log-mel, a Whisper-style encoder, the VQ bridge and its residual quantizer.

Upstream files cited below: processor_omni.py (features), audio_modeling_omni.py (encoder, bridge),
vector_quantize.py (codebook search), modeling_omni.py (`OmniAudioTokenizer`).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from s2sjax.runtime.errors import MissingFileError, UserError
from s2sjax.numerics.norms import layer_norm
from tasks.audio import whisper
from tasks.audio.jax_tokenizer import JaxAudioTokenizer
from tasks.audio.ops import conv1d, dense, first_argmin, squared_distances
from tasks.audio.weights import ReleaseWeights, read_json
from tasks.audio.whisper import whisper_log_mel

# OmniForCausalLM holds the tokenizer as `self.audio_tokenizer` (modeling_omni.py l.784).
PREFIX = "audio_tokenizer."


class BaichuanConfigError(UserError, ValueError):
  """A Baichuan-Audio config.json this port cannot serve: unreadable, a key missing, a switch not implemented."""


@dataclasses.dataclass(frozen=True)
class BaichuanAudioConfig:
  """The `audio_config` entries the tokenizer depends on (a WhisperConfig upstream)."""

  d_model: int
  encoder_layers: int
  encoder_attention_heads: int
  encoder_ffn_dim: int
  num_mel_bins: int
  n_fft: int
  hop_length: int
  sampling_rate: int
  max_audio_seconds: int
  stride_size: int
  avg_pooler: int
  codebook_sizes: tuple[int, ...]

  @property
  def window_samples(self) -> int:
    """Samples of one chunk: longer audio is cut into chunks this long (processor_omni.py l.276-291)."""
    return self.max_audio_seconds * self.sampling_rate

  @property
  def max_positions(self) -> int:
    """Rows of the sinusoid table (audio_modeling_omni.py l.168): encoder frames of one full chunk."""
    return self.window_samples // self.hop_length // self.stride_size


def read_config(config_path: str) -> BaichuanAudioConfig:
  """The tokenizer's settings from a release config.json, refusing by name the switches this port lacks."""
  config = read_json(config_path, BaichuanConfigError)
  audio = config.get("audio_config")
  if not isinstance(audio, dict):
    raise BaichuanConfigError(f"{config_path} has no audio_config")

  def need(key, table=audio, where="audio_config"):
    if key not in table:
      raise BaichuanConfigError(f"{config_path}: {where}.{key} is missing")
    return table[key]

  def refuse(what, value, why):
    raise BaichuanConfigError(f"{config_path}: {what}={value!r} is not implemented ({why})")

  if audio.get("enable", True) is False:
    refuse("audio_config.enable", False, "the release has no audio tokenizer")
  vq = audio.get("vq_config")
  if not isinstance(vq, dict) or vq.get("enable", True) is False:
    refuse("audio_config.vq_config", vq, "the bridge tokenizer needs an enabled vq_config")
  # WhisperConfig's default activation is "gelu", the exact (erf) GELU of ACT2FN.
  if audio.get("activation_function", "gelu") != "gelu":
    refuse("audio_config.activation_function", audio["activation_function"], "only exact gelu")
  if need("kernel_size") != 3:
    # Both convolutions pad 1 whatever the kernel (audio_modeling_omni.py l.171-173), while the length rule pads
    # kernel_size // 2 (processor_omni.py l.298-299): they agree at 3 only.
    refuse("audio_config.kernel_size", audio["kernel_size"], "upstream's padding agrees with its lengths at 3 only")
  if need("avg_pooler") < 2:
    refuse("audio_config.avg_pooler", audio["avg_pooler"], "upstream defines no bridge length below 2")
  if need("split_overlap") != 0:
    refuse("audio_config.split_overlap", audio["split_overlap"], "chunks are cut without overlap")
  sizes = tuple(int(n) for n in need("codebook_sizes", vq, "audio_config.vq_config"))
  parsed = BaichuanAudioConfig(
      **{f.name: int(need(f.name)) for f in dataclasses.fields(BaichuanAudioConfig) if f.name != "codebook_sizes"},
      codebook_sizes=sizes)
  if parsed.d_model % parsed.encoder_attention_heads or parsed.d_model % 2:
    refuse("audio_config.d_model", parsed.d_model, "must be even and divisible by encoder_attention_heads")
  return parsed


def sinusoids(length: int, channels: int) -> np.ndarray:
  """[length, channels] float32 Whisper position table (audio_modeling_omni.py l.25-31): timescales
  log(10000) / (channels/2 - 1) apart, sines then cosines. The angles are float32 products, as in torch, since
  their rounding (1e-4 at position 1500) is most of the table's error: this is within 2e-5 of torch's table."""
  increment = np.log(10000) / (channels // 2 - 1)
  inverse = np.exp(-increment * np.arange(channels // 2)).astype(np.float32)
  scaled = np.arange(length, dtype=np.float32)[:, None] * inverse[None, :]
  return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1)


def read_params(weights: ReleaseWeights, config: BaichuanAudioConfig) -> dict:
  """The tokenizer's tensors, shape-checked, as a pytree of float32 arrays in the layouts `forward` uses:
  linear kernels [in, out], conv kernels [width, in, out], encoder layers a list."""
  d, ffn, mels = config.d_model, config.encoder_ffn_dim, config.num_mel_bins
  wide = d * config.avg_pooler

  def linear(key, n_in, n_out, bias=True):
    out = {"kernel": weights.take(f"{key}.weight", (n_out, n_in)).T}
    if bias:
      out["bias"] = weights.take(f"{key}.bias", (n_out,))
    return out

  def norm(key, n):
    return {"scale": weights.take(f"{key}.weight", (n,)), "bias": weights.take(f"{key}.bias", (n,))}

  def conv(key, n_in, n_out, width, bias=True):
    out = {"kernel": weights.take(f"{key}.weight", (n_out, n_in, width)).transpose(2, 1, 0)}
    if bias:
      out["bias"] = weights.take(f"{key}.bias", (n_out,))
    return out

  # one pytree per layer, not stacked: a scan over stacked layers copies each layer's weights out of the stack
  # every step (18% of a 5 s utterance's step on XLA:CPU)
  layers = [whisper.read_layer(weights, f"audio_model.layers.{i}", d, ffn) for i in range(config.encoder_layers)]
  if weights.has(f"audio_model.layers.{config.encoder_layers}.fc1.weight"):
    raise BaichuanConfigError(f"{weights.path} holds more encoder layers than audio_config.encoder_layers="
                              f"{config.encoder_layers}")
  # The table is a buffer that load_state_dict overwrites, so the stored one is what upstream adds; a folder
  # without it gets the table upstream builds.
  table_key, table_shape = "audio_model.positional_embedding", (config.max_positions, d)
  positions = weights.take(table_key, table_shape) if weights.has(table_key) else sinusoids(*table_shape)

  def pooling_conv(key):
    # Conv1d(d -> wide, kernel = stride = avg_pooler) as one matmul over a group of frames laid frame-major
    # (row k * d + c), the order of the residual's reshape (l.446).
    return conv(key, d, wide, config.avg_pooler, bias=False)["kernel"].reshape(wide, wide)

  return {
      "conv1": conv("audio_model.conv1", mels, d, 3),
      "conv2": conv("audio_model.conv2", d, d, 3),
      "positions": positions,
      "layers": layers,
      "final_norm": norm("audio_model.layer_norm", d),
      "gate": pooling_conv("audio_bridge_model.gate_proj"),
      "up": pooling_conv("audio_bridge_model.up_proj"),
      "down": linear("audio_bridge_model.down_proj", wide, wide, bias=False)["kernel"],
      "bridge_norm": norm("audio_bridge_model.layer_norm", wide),
      "codebooks": tuple(weights.take(f"audio_bridge_model.vq_list.{i}.codebook.embed", (n, wide))
                         for i, n in enumerate(config.codebook_sizes)),
  }


# ---- the forward: pure functions of (params, features, lengths) -------------------------------------------------

def _layer_norm(x, p):
  return layer_norm(x, p["scale"], p["bias"], whisper.LAYER_NORM_EPS)


def _residual_quantize(x, codebooks):
  """int32 [..., stages]: each stage picks the nearest entry to what the earlier stages left, in float32
  (vector_quantize.py l.12-16 and l.44-56): distance sqrt(clamp(|x|^2 + |e|^2 - 2 x.e, 0)), the first of equal
  distances (argmax of the negated distance), then the residual loses that entry."""
  import jax.numpy as jnp

  residual = x.astype(jnp.float32)
  codes = []
  for embed in codebooks:
    embed = embed.astype(jnp.float32)
    index = first_argmin(jnp.sqrt(jnp.maximum(squared_distances(residual, embed), 0)))
    residual = residual - embed[index]
    codes.append(index)
  return jnp.stack(codes, -1).astype(jnp.int32)


def forward(params: dict, features, lengths, config: BaichuanAudioConfig) -> dict:
  """features [B, T, mels] (zero past each row's `lengths[b]` mel frames) -> {"encoder_out" [B, T', d],
  "encoder_length" [B], "bridge_ln" [B, ceil(T'/pool), pool*d], "codes" [B, ceil(T'/pool), stages]}.

  Batch-invariant: a row's outputs depend on its own `lengths[b]` frames only. Upstream is not when rows of a batch
  differ in length (its quirk 3: the mel is zero-padded to the longest row, so at a shorter row's odd length the
  last frame of conv2 reads gelu(conv1(padding)) where that row alone reads conv2's zero padding, and attention
  spreads the change to every frame). This port computes each row as upstream computes it alone: conv1's output is
  zeroed past the row's length before conv2, attention keys past its encoder length are masked, and the encoder
  output is zeroed past it as upstream zeroes it before the bridge (l.216-217)."""
  import jax
  import jax.numpy as jnp

  dtype = params["conv1"]["kernel"].dtype
  lengths = jnp.asarray(lengths, jnp.int32)
  mel_valid = (jnp.arange(features.shape[1]) < lengths[:, None])[..., None]
  x = jnp.where(mel_valid, features, 0).astype(dtype)
  # Both convolutions pad 1 each side, non-causal (l.171-173).
  x = jax.nn.gelu(conv1d(x, params["conv1"], 1, padding=((1, 1),)), approximate=False)
  x = jnp.where(mel_valid, x, 0)  # a row's conv2 sees zeros past its own length, as it does alone
  x = jax.nn.gelu(conv1d(x, params["conv2"], config.stride_size, padding=((1, 1),)), approximate=False)
  # Lengths after conv1 (k3 p1) and conv2 (k3 s2 p1): processor_omni.py l.293-302.
  encoder_length = (lengths - 1) // config.stride_size + 1
  frames = x.shape[1]
  # A chunk has at most max_positions valid frames; a padded batch may run past the table (zeros there).
  positions = jnp.pad(params["positions"], ((0, max(0, frames - config.max_positions)), (0, 0)))[:frames]
  hidden = x + positions.astype(dtype)
  valid = jnp.arange(frames) < encoder_length[:, None]
  # Attention non-causal over each row's valid frames only (upstream packs the rows for varlen flash, l.93-99).
  for layer in params["layers"]:
    hidden = whisper.encoder_layer(hidden, layer, valid[:, None, :], config.encoder_attention_heads,
                                   jax.lax.Precision.HIGHEST)
  encoder_out = jnp.where(valid[..., None], _layer_norm(hidden, params["final_norm"]), 0)

  # Bridge (l.437-452): zero frames up to a multiple of avg_pooler, gated pooling convs, residual = the group's
  # frames side by side, LayerNorm(down(silu(gate) * up) + residual).
  pool = config.avg_pooler
  grouped = jnp.pad(encoder_out, ((0, 0), (0, -frames % pool), (0, 0)))
  grouped = grouped.reshape(grouped.shape[0], -1, pool * grouped.shape[-1])
  gate, up = (dense(grouped, {"kernel": params[name]}) for name in ("gate", "up"))
  mixed = dense(jax.nn.silu(gate) * up, {"kernel": params["down"]})
  bridge_ln = _layer_norm(mixed + grouped, params["bridge_norm"])
  return {"encoder_out": encoder_out, "encoder_length": encoder_length, "bridge_ln": bridge_ln,
          "codes": _residual_quantize(bridge_ln, params["codebooks"])}


def log_mel(wave: np.ndarray, config: BaichuanAudioConfig) -> np.ndarray:
  """float32 [mels, L] of one chunk (processor_omni.py l.304-332): the wave zero-padded to the full chunk before
  the STFT (so the floor at max - 8 is taken over the whole window), then L = min(chunk frames, samples // hop + 1)
  frames kept (one more than Whisper's extractor keeps)."""
  window = config.window_samples
  wave = np.asarray(wave, np.float32)[:window]
  mel = whisper_log_mel(wave, n_mels=config.num_mel_bins, n_fft=config.n_fft, hop=config.hop_length,
                        sample_rate=config.sampling_rate, pad_to=window)
  return mel[:, : min(window // config.hop_length, len(wave) // config.hop_length + 1)]


def code_frames(mel_frames: int, config: BaichuanAudioConfig) -> int:
  """Codes of a chunk of `mel_frames` frames: the encoder length floored to whole bridge groups (the trailing
  partial group is not tokenized; processor_omni.py l.293-302)."""
  return ((mel_frames - 1) // config.stride_size + 1) // config.avg_pooler


class BaichuanAudioTokenizer(JaxAudioTokenizer):
  """Reads a Baichuan-Audio release folder (config.json + model.safetensors or its sharded index), or a folder of
  the `audio_tokenizer.*` tensors alone with a config.json."""

  def __init__(self, model_dir: str):
    if not os.path.isdir(model_dir):
      raise MissingFileError(f"Baichuan-Audio model directory {model_dir} does not exist")
    self.model_dir = model_dir
    self.config = c = read_config(os.path.join(model_dir, "config.json"))
    weights = ReleaseWeights(model_dir, prefix=PREFIX)
    self.params = read_params(weights, c)
    self.weights_sha = weights.fingerprint()
    self.sample_rate = c.sampling_rate
    self.codebook_sizes = c.codebook_sizes
    self.num_codebooks = len(c.codebook_sizes)
    self.frame_rate = c.sampling_rate / c.hop_length / c.stride_size / c.avg_pooler
    self.segment_samples = c.window_samples  # split_overlap 0: consecutive chunks (processor_omni.py l.276-291)
    self.time_multiple = c.stride_size * c.avg_pooler  # whole bridge groups
    self.attention_heads, self.attention_stride = c.encoder_attention_heads, c.stride_size
    self.frame_bytes = whisper.frame_bytes(c.d_model, c.encoder_ffn_dim, c.stride_size)

  @classmethod
  def from_settings(cls, settings: dict, where) -> BaichuanAudioTokenizer:
    """`model_dir` resolved by `where` (the tokenizer folder itself when absent); `dtype` float32 or bfloat16."""
    return cls(where(settings.get("model_dir", "."))).configure(dtype=settings.get("dtype", "float32"))

  def prepare(self, segment: np.ndarray) -> tuple[np.ndarray, int]:
    """Time-major mel [L, mels] and the chunk's code count; chunks under n_fft samples are dropped, as upstream
    drops them (l.287) or fails on them (l.307)."""
    if len(segment) < self.config.n_fft:
      return np.zeros((0, self.config.num_mel_bins), np.float32), 0
    mel = log_mel(segment, self.config)
    return np.ascontiguousarray(mel.T), code_frames(mel.shape[1], self.config)

  def apply(self, params, features, lengths):
    return forward(params, features, lengths, self.config)["codes"]

  def identity(self) -> dict:
    return {"type": "baichuan_audio", "codebook_sizes": list(self.codebook_sizes), "dtype": self.dtype,
            "config": dataclasses.asdict(self.config), "weights_sha": self.weights_sha}
