"""Kimi-Audio's continuous Whisper-large-v3 features in JAX: 16 kHz audio -> one [4 x d_model] vector per
GLM-4-Voice code frame (12.5 Hz), as Kimi-Audio's own code computes them (MoonshotAI/Kimi-Audio 349251e,
`kimia_infer/models/tokenizer/whisper_Lv3/whisper.py` WhisperEncoder.forward 178-222, reshaped by
`kimia_infer/api/prompt_manager.py:71-75`). The model mixes them into the embeddings of the code rows
(`s2sjax.model.kimi_audio.embed_inputs`).

Per 30 s piece of the wave (whisper.py:184-188): zero-padded to 30 s (480,000 samples, pad_or_trim 73-96), the
128-bin log-mel of the whole padded piece (log_mel_spectrogram 117-164: `tasks.audio.whisper.whisper_log_mel`,
floored at 8 below the padded piece's maximum), cast to bfloat16 (whisper.py:208/214), then the encoder over all
1,500 frames with no mask, padding included (modeling_whisper.py WhisperEncoder 946-1148: conv1 k3 p1 + GELU,
conv2 k3 s2 p1 + GELU, plus all 1,500 learned positions, pre-LN layers whose key projection has no bias, final
LayerNorm); its first 4T rows, T = (samples - 1) // 1280 + 1 (whisper.py:195-197, the GLM-4-Voice code count),
become [T, 4 d_model], row t holding frames 4t..4t+3. Longer audio: the pieces' features concatenated.

The weights are the encoder of the release's `whisper-large-v3/` folder (a full WhisperModel: only `encoder.*` is
read), without torch. Windows of every utterance are stacked and run through one jitted forward in batches.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os

import ml_dtypes
import numpy as np

from s2sjax.runtime.errors import UserError
from s2sjax.runtime.progress import Progress
from tasks.audio import whisper
from tasks.audio.ops import conv1d, matmul_precision
from tasks.audio.weights import ReleaseWeights, read_json

SAMPLE_RATE = 16000
WINDOW_SAMPLES = 30 * SAMPLE_RATE  # whisper.py:184-188 / pad_or_trim's N_SAMPLES
SAMPLES_PER_CODE = 160 * 8  # whisper.py:195-197: hop 160 x (conv stride 2 x 4 frames per code)
FRAMES_PER_CODE = 4  # prompt_manager.py:71-75: 4 encoder frames -> one feature row
N_MELS = 128  # modeling_whisper.py:961 hard-codes the encoder's 128 mel bins; log_mel_spectrogram's default
N_FFT, HOP = 400, 160  # whisper.py's N_FFT, HOP_LENGTH
ENCODER_PREFIX = "encoder."  # WhisperModel.save_pretrained's keys; the decoder is never run (whisper.py:172)


class KimiWhisperError(UserError, ValueError):
  """A whisper-large-v3 folder this port cannot read or does not implement: names the file and the key."""


@dataclasses.dataclass(frozen=True)
class EncoderShape:
  """What of the folder's config.json determines the features."""

  d_model: int
  heads: int
  ffn: int
  layers: int
  positions: int  # max_source_positions: every row is added, so it must be the 1,500 frames of 30 s

  @property
  def frames(self) -> int:
    return WINDOW_SAMPLES // HOP // 2

  @property
  def feature_dim(self) -> int:
    return FRAMES_PER_CODE * self.d_model


def read_shape(folder: str) -> EncoderShape:
  """The encoder's sizes from `folder/config.json` (a WhisperConfig), refusing by name what upstream would not run."""
  path = os.path.join(folder, "config.json")
  config = read_json(path, KimiWhisperError)

  def need(key: str):
    if config.get(key) is None:
      raise KimiWhisperError(f"{path} has no {key!r}")
    return config[key]

  if config.get("num_mel_bins", N_MELS) != N_MELS:
    raise KimiWhisperError(f"{path}: num_mel_bins={config['num_mel_bins']}, but Kimi-Audio's encoder reads "
                           f"{N_MELS} mel bins (modeling_whisper.py:961)")
  if config.get("activation_function", "gelu") != "gelu":
    raise KimiWhisperError(f"{path}: activation_function={config['activation_function']!r} is not implemented (gelu)")
  shape = EncoderShape(d_model=need("d_model"), heads=need("encoder_attention_heads"), ffn=need("encoder_ffn_dim"),
                       layers=need("encoder_layers"), positions=need("max_source_positions"))
  if shape.positions != shape.frames:
    raise KimiWhisperError(f"{path}: max_source_positions={shape.positions}; the encoder adds every position row to "
                           f"the {shape.frames} frames of a 30 s window, so they must be equal")
  if shape.d_model % shape.heads:
    raise KimiWhisperError(f"{path}: d_model={shape.d_model} is not a multiple of encoder_attention_heads="
                           f"{shape.heads}")
  return shape


def read_params(weights: ReleaseWeights, shape: EncoderShape) -> dict:
  """float32 arrays laid for the forward: conv kernels [width, in, out], linear kernels [in, out]."""
  d = shape.d_model
  conv = lambda name, c_in: {"kernel": weights.take(f"{name}.weight", (d, c_in, 3)).transpose(2, 1, 0),
                             "bias": weights.take(f"{name}.bias", (d,))}
  return {"conv1": conv("conv1", N_MELS), "conv2": conv("conv2", d),
          "positions": weights.take("embed_positions.weight", (shape.positions, d)),
          "layers": [whisper.read_layer(weights, f"layers.{i}", d, shape.ffn) for i in range(shape.layers)],
          "final_norm": {"scale": weights.take("layer_norm.weight", (d,)), "bias": weights.take("layer_norm.bias", (d,))}}


# ---- host side: pieces and mels --------------------------------------------------------------------------------------


def code_frames(samples: int) -> int:
  """T of one piece of `samples` samples (whisper.py:195-197); 0 for none."""
  return (samples - 1) // SAMPLES_PER_CODE + 1 if samples else 0


def pieces(wave: np.ndarray) -> list[np.ndarray]:
  """The wave's 30 s pieces (whisper.py:184-188): none for an empty wave."""
  return [wave[start : start + WINDOW_SAMPLES] for start in range(0, len(wave), WINDOW_SAMPLES)]


def round_to_bf16(mel: np.ndarray) -> np.ndarray:
  """The mel as the encoder reads it: each entry rounded to bfloat16 (whisper.py:208/214), held in float32."""
  return np.asarray(mel, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def window_mel(piece: np.ndarray) -> np.ndarray:
  """float32 [3000, 128] log-mel of a piece zero-padded to 30 s, rounded to bfloat16 as upstream feeds it."""
  padded = np.zeros(WINDOW_SAMPLES, np.float32)
  padded[: len(piece)] = piece
  return round_to_bf16(whisper.whisper_log_mel(padded, n_mels=N_MELS, n_fft=N_FFT, hop=HOP, sample_rate=SAMPLE_RATE).T)


# ---- the encoder: a pure function of (params, mels) ------------------------------------------------------------------


def encode(params: dict, shape: EncoderShape, mel, with_intermediates: bool = False):
  """Encoder states [B, 1500, d] of mels [B, 3000, 128] (every frame attends to every frame); with
  `with_intermediates` also the layer-0 input and each layer's output."""
  import jax
  import jax.numpy as jnp

  from s2sjax.numerics.norms import layer_norm

  precision = matmul_precision(mel.dtype)
  x = jax.nn.gelu(conv1d(mel, params["conv1"], 1, ((1, 1),), precision=precision), approximate=False)
  x = jax.nn.gelu(conv1d(x, params["conv2"], 2, ((1, 1),), precision=precision), approximate=False)
  x = x + params["positions"].astype(x.dtype)
  visible = jnp.ones((x.shape[0], 1, x.shape[1]), bool)
  layer0_input, outputs = x, []
  for layer in params["layers"]:
    x = whisper.encoder_layer(x, layer, visible, shape.heads, precision)
    outputs.append(x)
  norm = params["final_norm"]
  last = layer_norm(x, norm["scale"].astype(x.dtype), norm["bias"].astype(x.dtype), whisper.LAYER_NORM_EPS)
  if with_intermediates:
    return last, {"layer0_input": layer0_input, "layer_outputs": outputs}
  return last


@functools.lru_cache(maxsize=None)
def _jitted_encode():
  import jax

  return jax.jit(encode, static_argnums=(1, 3))


def default_batch_size() -> int:
  """Windows a step: one on a CPU (a batch of 8 took 6% more CPU time per window there, its attention tensors
  leaving the caches: docs/benchmarks, "Kimi-Audio's Whisper-large-v3 features"), 8 on an accelerator, whose
  matmuls one window (M = 1,500) leaves idle."""
  import jax

  return 1 if jax.default_backend() == "cpu" else 8


class KimiWhisperFeatures:
  """The feature track of a Kimi-Audio release: `features(waves)` -> per wave float32 [T, 4 d_model], T its
  GLM-4-Voice code count. `folder` is the release's `whisper-large-v3/` (config.json, model.safetensors)."""

  sample_rate = SAMPLE_RATE

  def __init__(self, folder: str, dtype: str = "float32", batch_size: int | None = None):
    if not os.path.isdir(folder):
      raise KimiWhisperError(f"Whisper encoder folder {folder} does not exist (a Kimi-Audio release keeps it as "
                             "whisper-large-v3/ beside the weights)")
    self.folder, self.dtype, self.batch_size = folder, dtype, batch_size or default_batch_size()
    self.shape = read_shape(folder)
    weights = ReleaseWeights(folder, ENCODER_PREFIX)
    self.params = read_params(weights, self.shape)
    self.weights_sha = weights.fingerprint()

  def identity(self) -> dict:
    """What the features depend on: a build is reused only when this matches."""
    return {"type": "kimi_whisper", **dataclasses.asdict(self.shape), "dtype": self.dtype,
            "weights_sha": self.weights_sha}

  @functools.cached_property
  def _device_params(self):
    """The weights on the device in the compute dtype, put there once."""
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda leaf: jnp.asarray(leaf, self.dtype), self.params)

  def _encoded(self, mels: np.ndarray, with_intermediates: bool = False):
    import jax.numpy as jnp

    return _jitted_encode()(self._device_params, self.shape, jnp.asarray(mels, self.dtype), with_intermediates)

  def features(self, waves: list[np.ndarray], progress: Progress | None = None) -> list[np.ndarray]:
    """float32 [T, 4 d_model] per wave: the 30 s pieces of all waves encoded `batch_size` at a time, their mels
    made batch by batch (the last batch holds only the pieces left: one more compiled shape, where silent windows
    to fill it would each cost a whole window's encoder).
    `progress` counts each wave once its last piece is encoded."""
    jobs = [(index, piece) for index, wave in enumerate(waves) for piece in pieces(np.asarray(wave, np.float32))]
    per_wave: list[list[np.ndarray]] = [[] for _ in waves]
    remaining = collections.Counter(index for index, _ in jobs)
    if progress:  # an empty wave has no piece to wait for
      for index, wave in enumerate(waves):
        if not remaining[index]:
          progress.update(1, 0.0)
    for start in range(0, len(jobs), self.batch_size):
      chunk = jobs[start : start + self.batch_size]
      batch = np.zeros((len(chunk), 2 * self.shape.frames, N_MELS), np.float32)
      for row, (_, piece) in enumerate(chunk):
        batch[row] = window_mel(piece)
      encoded = np.asarray(self._encoded(batch), np.float32)
      for row, (index, piece) in enumerate(chunk):
        frames = code_frames(len(piece))
        per_wave[index].append(encoded[row, : FRAMES_PER_CODE * frames].reshape(frames, self.shape.feature_dim))
        remaining[index] -= 1
        if progress and not remaining[index]:
          progress.update(1, len(waves[index]) / SAMPLE_RATE)
    return [np.concatenate(rows) if rows else np.zeros((0, self.shape.feature_dim), np.float32) for rows in per_wave]

  def intermediates(self, mel: np.ndarray) -> dict[str, np.ndarray]:
    """One window's encoder stages from its bf16-rounded mel [3000, 128]: "layer0_input", "layer{i}_output" and
    "last_hidden", each [1500, d]."""
    last, states = self._encoded(mel[None], with_intermediates=True)
    out = {"layer0_input": np.asarray(states["layer0_input"])[0], "last_hidden": np.asarray(last)[0]}
    for i, layer in enumerate(states["layer_outputs"]):
      out[f"layer{i}_output"] = np.asarray(layer)[0]
    return out
