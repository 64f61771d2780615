"""Step-Audio 2's speech input in JAX: 16 kHz audio -> the adaptor's rows the LLM reads in place of its
`<audio_patch>` placeholders, as the release computes them (stepfun-ai Step-Audio-2-mini, `modeling_step_audio_2.py`
git blob 50dfd88a: AudioEncoder 230-264, Adaptor 266-302; the Step-Audio2 wrapper's `stepaudio2.py` 73-76 and
`utils.py` 33-91 for the mel and the lengths).

Per 25 s chunk of the wave (stepaudio2.py:73): the 128-bin log-mel of the chunk right-padded with 479 zeros
(utils.py:44; Whisper's rule otherwise, `tasks.audio.whisper.whisper_log_mel`; no 30 s padding), F frames. The
encoder: conv1 (k3 p1) + GELU, conv2 (k3 s2 p1) + GELU, the learned positions, pre-LN blocks whose attention sees
the keys of frames 2j + (F + 1) % 2 < F - 2 only (wav_len = F - 2, utils.py:84; the mask slice :252) with q and k
each scaled by head_dim^-0.25 (:195, here once as head_dim^-0.5 on the product), AvgPool(2), a final LayerNorm; the
adaptor: conv (kernel_size, adapter_stride, padding 1) + GELU, Linear(n_state, 2048) + ReLU, Linear(2048, llm_dim).
The first (x_len - 1) // 2 + 1 rows, x_len = (F - 1) // 4, are the chunk's rows (:352), as many as the wrapper
lays placeholders (compute_token_num, utils.py:56).

Each chunk's rows are those of the chunk alone, as upstream runs one request: chunks of different lengths share a
padded batch with every stage's rows past the chunk's own length zeroed, where alone they are the convolutions' zero
padding (upstream's own padded batches let a longer neighbour change a chunk's last rows, and take the mask's
parity from the batch's length).

The weights are the release's `encoder.*` and `adapter.*` tensors, read from its folder without torch.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from s2sjax.runtime.progress import Progress
from s2sjax.runtime.registry import load_object
from s2sjax.data.formats.step_audio2 import ADAPTOR_WIDTH, EncoderConfigError, EncoderShape, encoder_shape
from tasks.audio import whisper
from tasks.audio.base import AudioTokenizer, AudioTokenizerError
from tasks.audio.jax_tokenizer import BATCH_FRAMES, bucket_length
from tasks.audio.ops import conv1d, dense, matmul_precision
from tasks.audio.precomputed import CANDIDATES
from tasks.audio.weights import ReleaseWeights, read_json

SAMPLE_RATE = 16000
CHUNK_SAMPLES = 25 * SAMPLE_RATE  # stepaudio2.py:73
MEL_PADDING = 479  # utils.py:44 (log_mel_spectrogram(..., padding=479), stepaudio2.py:74)
N_FFT, HOP = 400, 160
SETTINGS = ("type", "dtype", "codebook_sizes", "speech_out")
# Spoken candidates' codes: CosyVoice2's s3tokenizer (speech_tokenizer_v2_25hz), 6,561 codes, made elsewhere
DEFAULT_SPEECH_OUT = {"type": "precomputed", "codes_dir": "s3tokenizer_codes"}
SPEECH_CODES = 6561
CHUNK_CODES = (2,)  # code 1 at the first row of each 25 s chunk after the first, 0 elsewhere


def read_shape(folder: str) -> EncoderShape:
  """The encoder's sizes from the release's config.json (`audio_encoder_config`), read as the converter reads them."""
  path = os.path.join(folder, "config.json")
  audio = read_json(path, AudioTokenizerError).get("audio_encoder_config")
  if not isinstance(audio, dict):
    raise AudioTokenizerError(f"{path}: needs the audio_encoder_config object")
  try:
    return encoder_shape(audio)
  except EncoderConfigError as e:
    raise AudioTokenizerError(f"{path}: {e}") from None


def read_params(weights: ReleaseWeights, shape: EncoderShape) -> dict:
  """float32 arrays laid for the forward: conv kernels [width, in, out], linear kernels [in, out]."""
  d = shape.n_state
  conv = lambda key, c_in, width: {"kernel": weights.take(f"{key}.weight", (d, c_in, width)).transpose(2, 1, 0),
                                   "bias": weights.take(f"{key}.bias", (d,))}
  linear = lambda key, n_in, n_out: {"kernel": weights.take(f"{key}.weight", (n_out, n_in)).T,
                                     "bias": weights.take(f"{key}.bias", (n_out,))}
  return {
    "conv1": conv("encoder.conv1", shape.n_mels, 3), "conv2": conv("encoder.conv2", d, 3),
    "positions": weights.take("encoder.positional_embedding.weight", (shape.n_ctx, d)),
    "blocks": [whisper.read_layer(weights, f"encoder.blocks.{i}", d, 4 * d, whisper.OPENAI_LAYER_NAMES)
               for i in range(shape.n_layer)],
    "after_norm": {"scale": weights.take("encoder.after_norm.weight", (d,)),
                   "bias": weights.take("encoder.after_norm.bias", (d,))},
    "adaptor": {"conv": conv("adapter.conv", d, shape.kernel_size),
                "linear1": linear("adapter.linear1", d, ADAPTOR_WIDTH),
                "linear2": linear("adapter.linear2", ADAPTOR_WIDTH, shape.llm_dim)},
  }


# ---- host side: chunks, mels, lengths --------------------------------------------------------------------------------


def chunks(wave: np.ndarray) -> list[np.ndarray]:
  """The wave's 25 s chunks (stepaudio2.py:73), each its own mel and its own <audio_start> block."""
  return [wave[start : start + CHUNK_SAMPLES] for start in range(0, len(wave), CHUNK_SAMPLES)]


def log_mel(chunk: np.ndarray, n_mels: int = 128) -> np.ndarray:
  """float32 [frames, n_mels], frames = (samples + 479) // 160: utils.py:33-54."""
  padded = np.pad(np.asarray(chunk, np.float32), (0, MEL_PADDING))
  return whisper.whisper_log_mel(padded, n_mels=n_mels, n_fft=N_FFT, hop=HOP, sample_rate=SAMPLE_RATE).T


def encoder_length(frames: int) -> int:
  """x_len: the encoder's valid rows of a mel of `frames` frames (wav_len = frames - 2, :262)."""
  return (frames - 2 + 1) // 2 // 2


def patch_count(frames: int) -> int:
  """Rows the adaptor gives and the wrapper lays placeholders for (compute_token_num, utils.py:56; :352)."""
  return (encoder_length(frames) - 1) // 2 + 1


# ---- the encoder and adaptor: a pure function of (params, mels, frames) ----------------------------------------------


def _zero_past(x, lengths):
  """x [B, T, C] with rows t >= lengths[b] zeroed."""
  import jax.numpy as jnp

  return jnp.where(jnp.arange(x.shape[1])[None, :, None] < lengths[:, None, None], x, 0)


def encode(params: dict, shape: EncoderShape, mel, frames, with_stages: bool = False):
  """Adaptor rows [B, R, llm_dim] of mels [B, T, n_mels] zero-padded past `frames` [B] (row b's first
  `patch_count(frames[b])` rows are its own); with `with_stages` also the encoder's output [B, T/4, n_state]."""
  import jax
  import jax.numpy as jnp

  from s2sjax.numerics.norms import layer_norm

  precision = matmul_precision(mel.dtype)
  gelu = functools.partial(jax.nn.gelu, approximate=False)
  x = _zero_past(gelu(conv1d(mel, params["conv1"], 1, ((1, 1),), precision=precision)), frames)
  x = gelu(conv1d(x, params["conv2"], 2, ((1, 1),), precision=precision))
  x = x + params["positions"][: x.shape[1]].astype(x.dtype)
  keys = 2 * jnp.arange(x.shape[1])[None, :] + (frames[:, None] + 1) % 2 < frames[:, None] - 2  # :252
  for block in params["blocks"]:
    x = whisper.encoder_layer(x, block, keys[:, None, :], shape.n_head, precision)
  pooled = x.shape[1] // 2
  x = x[:, : 2 * pooled].reshape(x.shape[0], pooled, 2, x.shape[2]).mean(axis=2)
  norm = params["after_norm"]
  encoded = _zero_past(layer_norm(x, norm["scale"].astype(x.dtype), norm["bias"].astype(x.dtype),
                                  whisper.LAYER_NORM_EPS), ((frames - 1) // 2 + 1) // 2)
  a = params["adaptor"]
  h = gelu(conv1d(encoded, a["conv"], shape.adapter_stride, ((1, 1),), precision=precision))
  rows = dense(jax.nn.relu(dense(h, a["linear1"], precision)), a["linear2"], precision)
  return (rows, encoded) if with_stages else rows


@functools.lru_cache(maxsize=None)
def _jitted_encode():
  import jax

  return jax.jit(encode, static_argnums=(1, 4))


class StepAudio2Encoder:
  """The adaptor rows of a Step-Audio 2 release's audio encoder: `rows(waves)` -> per wave the float32
  [patches, llm_dim] of its chunks in order and each row's chunk index. `folder` is the release folder
  (config.json, the safetensors holding encoder.* and adapter.*)."""

  def __init__(self, folder: str, dtype: str = "float32"):
    if not os.path.isdir(folder):
      raise AudioTokenizerError(f"Step-Audio 2 release folder {folder} does not exist")
    self.folder, self.dtype = folder, dtype
    self.shape = read_shape(folder)
    weights = ReleaseWeights(folder)
    self.params = read_params(weights, self.shape)
    self.weights_sha = weights.fingerprint()

  def identity(self) -> dict:
    return {"type": "step_audio2", **dataclasses.asdict(self.shape), "dtype": self.dtype,
            "weights_sha": self.weights_sha}

  @functools.cached_property
  def _device_params(self):
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda leaf: jnp.asarray(leaf, self.dtype), self.params)

  def encoded(self, mels: list[np.ndarray], with_stages: bool = False):
    """One padded batch of mels [F_b, n_mels] through `encode`: (rows, encoder output or None) as numpy."""
    import jax.numpy as jnp

    length = bucket_length(max(len(m) for m in mels), 4)
    batch = np.zeros((len(mels), length, self.shape.n_mels), np.float32)
    for row, mel in enumerate(mels):
      batch[row, : len(mel)] = mel
    frames = jnp.asarray([len(m) for m in mels], jnp.int32)
    out = _jitted_encode()(self._device_params, self.shape, jnp.asarray(batch, self.dtype), frames, with_stages)
    return tuple(np.asarray(o, np.float32) for o in out) if with_stages else (np.asarray(out, np.float32), None)

  def rows(self, waves: list[np.ndarray], progress: Progress | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(rows [N, llm_dim], chunk index [N]) per wave: its chunks' mels grouped by padded length, a batch holding
    about BATCH_FRAMES mel frames."""
    jobs = [(index, k, log_mel(chunk, self.shape.n_mels)) for index, wave in enumerate(waves)
            for k, chunk in enumerate(chunks(np.asarray(wave, np.float32)))]
    got: dict[tuple[int, int], np.ndarray] = {}
    jobs.sort(key=lambda job: len(job[2]))
    start = 0
    while start < len(jobs):
      length = bucket_length(len(jobs[start][2]), 4)
      stop = start + 1
      while (stop < len(jobs) and bucket_length(len(jobs[stop][2]), 4) == length
             and (stop - start + 1) * length <= BATCH_FRAMES):
        stop += 1
      batch = jobs[start:stop]
      rows, _ = self.encoded([mel for *_, mel in batch])
      for row, (index, k, mel) in enumerate(batch):
        got[index, k] = rows[row, : patch_count(len(mel))]
      start = stop
    out = []
    for index, wave in enumerate(waves):
      parts = [got[index, k] for k in range(len(chunks(wave)))]
      out.append((np.concatenate(parts) if parts else np.zeros((0, self.shape.llm_dim), np.float32),
                  np.concatenate([np.full(len(p), k, np.int32) for k, p in enumerate(parts)]) if parts
                  else np.zeros(0, np.int32)))
      if progress:
        progress.update(1, len(wave) / SAMPLE_RATE)
    return out


class StepAudio2Tokenizer(AudioTokenizer):
  """Step-Audio 2's audio as the build reads a tokenizer. A recording heard (a prefix): one code per adaptor row, 1
  where a 25 s chunk after the first begins and 0 elsewhere (the layout opens an <audio_start> block per chunk), and
  beside it the row itself (`frame_features`, width llm_dim). A spoken candidate (named `candidates/...`, as the
  build names them): its CosyVoice2 s3tokenizer codes, read by the `speech_out` tokenizer (the release ships that
  tokenizer as ONNX only: `precomputed` codes made elsewhere), beside zero rows the layout does not read.

  Settings: `dtype` of the encoder (float32 by default); `speech_out`, the spoken candidates' code tokenizer
  (DEFAULT_SPEECH_OUT: precomputed codes under `s3tokenizer_codes/` of --audio_tokenizer_dir), loaded where its
  folder exists (a build with spoken candidates and no such folder is refused when it asks for one)."""

  sample_rate = SAMPLE_RATE
  num_codebooks = 1
  codebook_sizes = CHUNK_CODES
  reads_audio = True

  def __init__(self, encoder: StepAudio2Encoder, speech_out: AudioTokenizer | None = None,
               speech_out_missing: str = ""):
    self.encoder, self.speech_out, self._speech_out_missing = encoder, speech_out, speech_out_missing
    self.feature_width = encoder.shape.llm_dim
    self._last: tuple[list, list] | None = None

  @classmethod
  def from_settings(cls, settings: dict, where) -> "StepAudio2Tokenizer":
    from tasks.audio import TOKENIZERS  # the registry this type is one record of

    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
      raise AudioTokenizerError(f"step_audio2 tokenizer settings: unknown keys {unknown} (known: dtype, speech_out)")
    out = dict(settings.get("speech_out") or DEFAULT_SPEECH_OUT)
    out.setdefault("codebook_sizes", [SPEECH_CODES])
    folder = where(out.get("codes_dir")) if out.get("type") == "precomputed" else None
    speech_out, missing = None, ""
    if folder is not None and not os.path.isdir(folder):
      missing = f"its speech_out codes folder {folder} does not exist"
    elif out.get("type") not in TOKENIZERS.names() or out["type"] == "step_audio2":
      raise AudioTokenizerError(f"step_audio2 tokenizer: speech_out.type {out.get('type')!r} must be another "
                                "registered audio tokenizer (precomputed: codes made elsewhere)")
    else:
      speech_out = load_object(TOKENIZERS.get(out["type"]).loader).from_settings(out, where)
    return cls(StepAudio2Encoder(where(None), settings.get("dtype", "float32")), speech_out, missing)

  def _spoken(self, name: str | None) -> bool:
    return name is not None and name.split("/")[0] == CANDIDATES

  def _candidate_codes(self, wave: np.ndarray, name: str) -> np.ndarray:
    if self.speech_out is None:
      raise AudioTokenizerError(f"{name}: a spoken candidate's s3tokenizer codes are read by the step_audio2 "
                                f"tokenizer's speech_out, and {self._speech_out_missing}")
    return self.speech_out.encode(wave if self.speech_out.reads_audio else None, name)

  def _of(self, waves: list[np.ndarray], names: list[str] | None = None, progress=None) -> list[tuple]:
    """(features, codes) per wave; the build asks for the codes and then the features of the same waves, which are
    computed once."""
    if self._last is not None and len(self._last[0]) == len(waves) and all(
        a is b for a, b in zip(self._last[0], waves)):
      if progress:
        progress.update(len(waves), sum(len(w) for w in waves) / SAMPLE_RATE)
      return self._last[1]
    spoken = [self._spoken(names[i] if names else None) for i in range(len(waves))]
    heard = iter(self.encoder.rows([w for w, s in zip(waves, spoken) if not s], progress))
    out = []
    for index, wave in enumerate(waves):
      if spoken[index]:
        codes = self._candidate_codes(wave, names[index])
        out.append((np.zeros((len(codes), self.feature_width), np.float32), codes))
        if progress:
          progress.update(1, len(wave) / SAMPLE_RATE)
      else:
        rows, chunk = next(heard)
        out.append((rows, self._openings(chunk)))
    self._last = (list(waves), out)
    return out

  @staticmethod
  def _openings(chunk: np.ndarray) -> np.ndarray:
    opens = np.zeros((len(chunk), 1), np.int32)
    opens[1:, 0] = chunk[1:] != chunk[:-1]
    return opens

  def encode(self, wave: np.ndarray, uttid: str) -> np.ndarray:
    return self._of([wave], [uttid])[0][1]

  def encode_batch(self, waves: list[np.ndarray], names: list[str] | None = None, progress=None) -> list[np.ndarray]:
    meter = (Progress(len(waves), progress, unit="utterances", rate_unit="audio s") if isinstance(progress, str)
             else progress)
    return [codes for _, codes in self._of(waves, names, meter)]

  def frame_features(self, waves: list[np.ndarray], progress=None) -> list[np.ndarray]:
    return [rows for rows, _ in self._of(waves, None, progress)]

  def identity(self) -> dict:
    return {**self.encoder.identity(), "speech_out": self.speech_out.identity() if self.speech_out else None}
