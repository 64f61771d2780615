"""MiMo-Audio's tokenizer in JAX: 24 kHz audio -> residual-VQ codes at 25 frames a second, as XiaomiMiMo/MiMo-Audio
@691ce54 computes them for the LLM (`MimoAudio.preprocess_input`, src/mimo_audio/mimo_audio.py:241-281, and
`AudioEncoder.encode`, src/mimo_audio_tokenizer/modeling_audio_tokenizer.py:431-620): a magnitude log-mel, two
convolutions, a RoPE transformer with a skip connection, a down-sampling convolution and a 20-layer residual
quantizer, of which MiMo-Audio-7B reads the first 8.

Upstream computes the mel of the whole wave and cuts it into segments of 6000 frames (mimo_audio.py:256-261), so
`segments` here cuts the mel, not the wave. Upstream packs those segments into one encoder call, and in a packed
batch a shorter segment of odd length gets other codes (its quirk: conv2 reads the batch's padding); each segment
here is encoded as upstream encodes it alone (a wave under 60 s is one segment, upstream's only case).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from s2sjax.runtime.errors import MissingFileError, UserError
from tasks.audio import whisper
from tasks.audio.jax_tokenizer import JaxAudioTokenizer
from tasks.audio.ops import conv1d, nearest
from tasks.audio.weights import ReleaseWeights, read_json

PREFIX = "encoder."  # MiMoAudioTokenizer holds the encoder as `self.encoder` (modeling_audio_tokenizer.py:779-803)
SEGMENT_FRAMES = 6000  # mel frames per encoder sequence (mimo_audio.py:258)
MEL_FLOOR = 1e-7  # wav2mel's clip before the log (mimo_audio.py:185-187)
LLM_CODEBOOKS = 8  # the codes MiMo-Audio-7B reads (mimo_audio.py:267, audio_channels)


class MimoTokenizerConfigError(UserError, ValueError):
  """A MiMo-Audio-Tokenizer config.json this port cannot serve: unreadable, a key missing, a switch not
  implemented."""


@dataclasses.dataclass(frozen=True)
class MimoTokenizerConfig:
  """The config.json entries the encoder and its mel depend on (configuration_audio_tokenizer.py:5-104)."""

  d_model: int
  encoder_layers: int
  encoder_attention_heads: int
  encoder_ffn_dim: int
  encoder_skip_layer_id: int | None
  n_mels: int
  sampling_rate: int
  nfft: int
  hop_length: int
  window_size: int
  fmin: float
  fmax: float | None
  stride_size: int
  avg_pooler: int
  rope_theta: float
  codebook_sizes: tuple[int, ...]

  @property
  def head_dim(self) -> int:
    return self.d_model // self.encoder_attention_heads

  def code_frames(self, mel_frames: int) -> int:
    """Codes of a segment of `mel_frames` frames: conv2's length (get_output_length, :576-578), then rounded up
    over the down-sampling groups (:553-556)."""
    conv = (mel_frames - 1) // self.stride_size + 1
    return -(-conv // self.avg_pooler)


# Switches of the release's config this port implements, with the one value it implements.
FIXED = {"ln_type": "LayerNorm", "encoder_causal": False, "encoder_attn_window_size": [-1, -1],
         "position_embedding_type": "rope", "rope_type": "default", "activation_function": "gelu",
         # both convolutions pad 1 whatever the kernel (:441-450): lengths agree with get_output_length at 3 only
         "kernel_size": 3}


def read_config(config_path: str) -> MimoTokenizerConfig:
  """The tokenizer's settings from the release's config.json, refusing by name the switches this port lacks."""
  config = read_json(config_path, MimoTokenizerConfigError)

  def need(key):
    if key not in config:
      raise MimoTokenizerConfigError(f"{config_path}: {key} is missing")
    return config[key]

  for key, value in FIXED.items():
    if config.get(key, value) != value:
      raise MimoTokenizerConfigError(f"{config_path}: {key}={config[key]!r} is not implemented (only {value!r})")
  if need("avg_pooler") < 2:
    raise MimoTokenizerConfigError(f"{config_path}: avg_pooler={config['avg_pooler']!r} is not implemented (the "
                                   "release down-samples by 2)")
  sizes = need("codebook_size")
  sizes = tuple(int(n) for n in (sizes if isinstance(sizes, list) else [sizes] * need("num_quantizers")))
  if len(sizes) != need("num_quantizers") or not sizes:
    raise MimoTokenizerConfigError(f"{config_path}: codebook_size names {len(sizes)} codebooks, num_quantizers "
                                   f"{config['num_quantizers']}")
  ints = ("d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim", "n_mels", "sampling_rate",
          "nfft", "hop_length", "window_size", "stride_size", "avg_pooler")
  skip = config.get("encoder_skip_layer_id")
  parsed = MimoTokenizerConfig(
      **{key: int(need(key)) for key in ints}, encoder_skip_layer_id=None if skip is None else int(skip),
      fmin=float(config.get("fmin", 0) or 0), fmax=None if config.get("fmax") is None else float(config["fmax"]),
      rope_theta=float(need("rope_theta")), codebook_sizes=sizes)
  if parsed.d_model % parsed.encoder_attention_heads or parsed.head_dim % 2:
    raise MimoTokenizerConfigError(f"{config_path}: d_model={parsed.d_model} must split into "
                                   f"{parsed.encoder_attention_heads} heads of even width")
  if parsed.window_size != parsed.nfft:
    raise MimoTokenizerConfigError(f"{config_path}: window_size={parsed.window_size} is not implemented (only the "
                                   f"FFT size, {parsed.nfft})")
  if skip is not None and not 1 <= parsed.encoder_skip_layer_id <= parsed.encoder_layers:
    raise MimoTokenizerConfigError(f"{config_path}: encoder_skip_layer_id={skip} names no layer of "
                                   f"{parsed.encoder_layers}")
  return parsed


# ---- the mel: numpy on the host -------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def mel_filters(config: MimoTokenizerConfig) -> np.ndarray:
  """[nfft // 2 + 1, n_mels] triangular HTK filters without normalisation, as torchaudio's melscale_fbanks builds
  them (MelSpectrogram's defaults, mimo_audio.py:156-166): bins evenly spaced in mel between fmin and fmax (the
  Nyquist rate when None), slopes between their neighbours' frequencies."""
  hz_to_mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)
  frequencies = np.linspace(0, config.sampling_rate // 2, config.nfft // 2 + 1)
  top = config.sampling_rate / 2 if config.fmax is None else config.fmax
  mels = np.linspace(hz_to_mel(config.fmin), hz_to_mel(top), config.n_mels + 2)
  points = 700.0 * (10 ** (mels / 2595.0) - 1.0)
  slopes = points[None, :] - frequencies[:, None]
  widths = np.diff(points)
  rising, falling = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
  return np.maximum(0, np.minimum(rising, falling))


def log_mel(wave: np.ndarray, config: MimoTokenizerConfig) -> np.ndarray:
  """float32 [1 + samples // hop, n_mels]: log(max(|STFT| @ filters, 1e-7)), the STFT centred with reflect padding
  over a periodic Hann window (torchaudio's Spectrogram, power 1). Computed in float64: upstream's float32 torch
  mel is within float32 error of it."""
  n_fft, hop = config.nfft, config.hop_length
  if len(wave) <= n_fft // 2:
    raise ValueError(f"{len(wave)} samples are too few for MiMo-Audio's centred STFT (more than {n_fft // 2})")
  padded = np.pad(np.asarray(wave, np.float64), n_fft // 2, mode="reflect")
  frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop]
  window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
  magnitude = np.abs(np.fft.rfft(frames * window, axis=-1))
  return np.log(np.maximum(magnitude @ mel_filters(config), MEL_FLOOR)).astype(np.float32)


# ---- the encoder: pure JAX -------------------------------------------------------------------------------------

def read_params(weights: ReleaseWeights, config: MimoTokenizerConfig, codebooks: int) -> dict:
  """The encoder's tensors, shape-checked, as float32 arrays in `forward`'s layouts (kernels [in, out] and
  [width, in, out]) and the first `codebooks` codebooks of the quantizer."""
  d, mels, pool = config.d_model, config.n_mels, config.avg_pooler

  def conv(key, n_in, n_out, width, bias=True):
    out = {"kernel": weights.take(f"{key}.weight", (n_out, n_in, width)).transpose(2, 1, 0)}
    if bias:
      out["bias"] = weights.take(f"{key}.bias", (n_out,))
    return out

  norm = lambda key: {"scale": weights.take(f"{key}.weight", (d,)), "bias": weights.take(f"{key}.bias", (d,))}
  layers = [whisper.read_layer(weights, f"layers.{i}", d, config.encoder_ffn_dim) for i in range(config.encoder_layers)]
  if weights.has(f"layers.{config.encoder_layers}.fc1.weight"):
    raise MimoTokenizerConfigError(f"{weights.path} holds more encoder layers than encoder_layers="
                                   f"{config.encoder_layers}")
  return {
      "conv1": conv("conv1", mels, d, 3), "conv2": conv("conv2", d, d, 3), "layers": layers,
      "final_norm": norm("layer_norm"), "down": conv("down_sample_layer.0", d, d, pool, bias=False),
      "down_norm": norm("down_sample_norm"),
      "codebooks": tuple(weights.take(f"quantizer.vq.layers.{i}._codebook.embed", (n, d))
                         for i, n in enumerate(config.codebook_sizes[:codebooks])),
  }


def forward(params: dict, features, lengths, config: MimoTokenizerConfig) -> dict:
  """features [B, T, mels] (zero past each row's `lengths[b]` frames) -> every stage of each row as upstream
  computes that row alone: "conv1_pre_gelu" [B, T, d], "conv2_pre_gelu" and "layer{i}" and "final_norm"
  [B, T', d] (T' = ceil(T / stride)), "conv_length" [B], "prequant" [B, T'', d] (the quantizer's input),
  "code_length" [B], "codes" [B, T'', codebooks]. Rows are independent: conv1's output is zeroed past a row's
  length (upstream's conv2 reads its own zero padding there), attention keys past its conv length are hidden, and
  the down-sampling convolution reads zeros past it (get_features, :502-574)."""
  import jax
  import jax.numpy as jnp

  from s2sjax.numerics.norms import layer_norm
  from s2sjax.numerics.rotary import rotary_angles

  dtype = params["conv1"]["kernel"].dtype
  precision = jax.lax.Precision.HIGHEST
  lengths = jnp.asarray(lengths, jnp.int32)
  norm = lambda x, p: layer_norm(x, p["scale"], p["bias"], whisper.LAYER_NORM_EPS)
  out = {}
  mel_valid = (jnp.arange(features.shape[1]) < lengths[:, None])[..., None]
  x = jnp.where(mel_valid, features, 0).astype(dtype)
  out["conv1_pre_gelu"] = conv1d(x, params["conv1"], 1, padding=((1, 1),), precision=precision)
  x = jnp.where(mel_valid, jax.nn.gelu(out["conv1_pre_gelu"], approximate=False), 0)
  out["conv2_pre_gelu"] = conv1d(x, params["conv2"], config.stride_size, padding=((1, 1),), precision=precision)
  hidden = jax.nn.gelu(out["conv2_pre_gelu"], approximate=False)
  out["conv_length"] = conv_length = (lengths - 1) // config.stride_size + 1
  batch, frames = hidden.shape[:2]
  valid = jnp.arange(frames) < conv_length[:, None]
  # RoPE positions restart at 0 in every sequence (get_position_ids, :44-49); cos/sin in float32 (:213-229)
  rotary = rotary_angles(jnp.broadcast_to(jnp.arange(frames), (batch, frames)), config.head_dim, config.rope_theta)
  skip = 0.0
  for index, layer in enumerate(params["layers"]):
    hidden = whisper.encoder_layer(hidden, layer, valid[:, None, :], config.encoder_attention_heads, precision,
                                   rotary)
    out[f"layer{index}"] = hidden
    if config.encoder_skip_layer_id is not None and index == config.encoder_skip_layer_id - 1:
      skip = hidden  # :533-535
  out["final_norm"] = hidden = norm(hidden + skip, params["final_norm"])
  pool = config.avg_pooler
  hidden = jnp.pad(jnp.where(valid[..., None], hidden, 0), ((0, 0), (0, -frames % pool), (0, 0)))
  down = jax.nn.gelu(conv1d(hidden, params["down"], pool, padding="VALID", precision=precision), approximate=False)
  out["prequant"] = norm(down, params["down_norm"])
  out["code_length"] = -(-conv_length // pool)
  out["codes"] = residual_quantize(out["prequant"], params["codebooks"])
  return out


def residual_quantize(x, codebooks):
  """int32 [..., len(codebooks)]: in float32, each layer's nearest entry to what the earlier layers left, then the
  residual loses that entry (quantization.py:176-184, 369-382)."""
  import jax.numpy as jnp

  residual, codes = x.astype(jnp.float32), []
  for embed in codebooks:
    embed = embed.astype(jnp.float32)
    index = nearest(residual, embed)
    residual = residual - embed[index]
    codes.append(index)
  return jnp.stack(codes, -1)


class MimoAudioTokenizer(JaxAudioTokenizer):
  """Reads a MiMo-Audio-Tokenizer release folder (config.json, model.safetensors or its sharded index); gives the
  first `codebooks` codes (the LLM's 8 by default, up to the release's 20) of 24 kHz audio, 25 a second."""

  def __init__(self, model_dir: str, codebooks: int = LLM_CODEBOOKS):
    if not os.path.isdir(model_dir):
      raise MissingFileError(f"MiMo-Audio-Tokenizer folder {model_dir} does not exist")
    self.model_dir = model_dir
    self.config = c = read_config(os.path.join(model_dir, "config.json"))
    if not 1 <= codebooks <= len(c.codebook_sizes):
      raise MimoTokenizerConfigError(f"MiMo-Audio codebooks {codebooks}: {model_dir} has {len(c.codebook_sizes)}")
    weights = ReleaseWeights(model_dir, prefix=PREFIX)
    self.params = read_params(weights, c, codebooks)
    self.weights_sha = weights.fingerprint()
    self.sample_rate = c.sampling_rate
    self.num_codebooks = codebooks
    self.codebook_sizes = c.codebook_sizes[:codebooks]
    self.frame_rate = c.sampling_rate / c.hop_length / c.stride_size / c.avg_pooler
    self.segment_samples = SEGMENT_FRAMES * c.hop_length  # the windows policy's longest: one encoder sequence
    self.time_multiple = c.stride_size * c.avg_pooler  # whole down-sampling groups
    self.attention_heads, self.attention_stride = c.encoder_attention_heads, c.stride_size
    self.frame_bytes = whisper.frame_bytes(c.d_model, c.encoder_ffn_dim, c.stride_size)

  @classmethod
  def from_settings(cls, settings: dict, where) -> MimoAudioTokenizer:
    """`model_dir` resolved by `where` (the tokenizer folder itself when absent); `codebooks` (8, or the spec's
    codebook count); `dtype` float32 or bfloat16."""
    given = settings.get("codebook_sizes")
    codebooks = int(settings.get("codebooks", len(given) if given else LLM_CODEBOOKS))
    return cls(where(settings.get("model_dir", ".")), codebooks).configure(dtype=settings.get("dtype", "float32"))

  def segments(self, wave: np.ndarray) -> list[np.ndarray]:
    """The log-mel [frames, mels] of the whole wave, cut every SEGMENT_FRAMES frames (mimo_audio.py:254-261); a
    wave too short for the STFT is one empty segment, which `prepare` refuses."""
    try:
      mel = log_mel(wave, self.config)
    except ValueError:
      return [np.zeros((0, self.config.n_mels), np.float32)]
    return [mel[start:start + SEGMENT_FRAMES] for start in range(0, len(mel), SEGMENT_FRAMES)]

  def feature_frames(self, samples: int) -> int:
    """Mel frames of the longest segment `samples` samples give (`log_mel`'s 1 + samples // hop, at most
    SEGMENT_FRAMES): `segments` cuts the mel, not the wave, so the base rule's `prepare` of silence would count
    samples."""
    return min(SEGMENT_FRAMES, 1 + samples // self.config.hop_length)

  def prepare(self, segment: np.ndarray) -> tuple[np.ndarray, int]:
    """A mel segment from `segments` and its code count."""
    if len(segment) == 0:
      raise ValueError(f"too short for MiMo-Audio's mel (more than {self.config.nfft // 2} samples needed)")
    return segment, self.config.code_frames(len(segment))

  def apply(self, params, features, lengths):
    return forward(params, features, lengths, self.config)["codes"]

  def identity(self) -> dict:
    return {"type": "mimo_audio", "codebooks": self.num_codebooks, "dtype": self.dtype,
            "config": dataclasses.asdict(self.config), "weights_sha": self.weights_sha}
