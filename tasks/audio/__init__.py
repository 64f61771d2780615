"""Audio tokenizers: waveform -> integer codes [frames, codebooks], run once when a dataset is built.

Each type is a record in one registry (`TOKENIZERS`), as tasks are: its name (what a spec's
`audio_tokenizer: {type: ...}` says), the class that reads its files, what those files are, and its frame rate.
A plugin (`S2SJAX_PLUGINS`) registers its own type the same way. The neural ones run in JAX (`jax_tokenizer`), so
building data needs no torch.
"""

from __future__ import annotations

import dataclasses
import os

from s2sjax.runtime.registry import Registry, load_object
from tasks.audio.base import AudioTokenizer, AudioTokenizerError
from tasks.audio.jax_tokenizer import JaxAudioTokenizer, jax_part


@dataclasses.dataclass(frozen=True)
class AudioTokenizerType:
  name: str
  loader: str  # "module:Class"; the class's `from_settings(settings, where)` builds the tokenizer
  files: str  # what --audio_tokenizer_dir (or the spec's paths) must hold
  frame_rate: float | None  # codes per second; None where the codes were made elsewhere
  summary: str


TOKENIZERS: Registry[AudioTokenizerType] = Registry("audio tokenizer")
register = TOKENIZERS.register

register(AudioTokenizerType(
  "precomputed", "tasks.audio.precomputed:PrecomputedTokenizer", "<uttid>.npy [frames, codebooks] per spoken "
  "prefix, candidates/<name>.npy per spoken candidate", None, "codes made elsewhere, read by utterance id"))
register(AudioTokenizerType(
  "mel_kmeans", "tasks.audio.mel_kmeans:MelKmeansTokenizer", "a k-means codebook .npy [clusters, 40] "
  "(`bundled`: the sample's)", 50.0, "log-mel frames to the nearest centroid: the weight-free demo tokenizer"))
register(AudioTokenizerType(
  "glm4_voice", "tasks.audio.glm4_voice:Glm4VoiceTokenizer", "a glm-4-voice-tokenizer folder (config.json, "
  "preprocessor_config.json, model.safetensors)", 12.5, "GLM-4-Voice's WhisperVQ: 16,384 single-codebook units"))
register(AudioTokenizerType(
  "baichuan_audio", "tasks.audio.baichuan:BaichuanAudioTokenizer", "the Baichuan-Audio release folder "
  "(config.json and the audio_tokenizer.* tensors of its safetensors)", 12.5,
  "Baichuan-Audio's Whisper encoder, VQ bridge and 8-stage RVQ"))
register(AudioTokenizerType(
  "mimi", "tasks.audio.mimi:MimiTokenizer", "Kyutai's tokenizer-*.safetensors, or transformers' kyutai/mimi "
  "folder", 12.5, "Mimi, Moshi's codec: its first N residual codebooks"))
register(AudioTokenizerType(
  "hubert_kmeans", "tasks.audio.hubert:HubertKmeansTokenizer", "a transformers HubertModel folder "
  "(safetensors) and a k-means centroids .npy [units, hidden]", 50.0,
  "HuBERT layer features to the nearest k-means centroid (TWIST, SIMS units)"))
register(AudioTokenizerType(
  "kimi_audio", "tasks.audio.kimi_audio:KimiAudioTokenizer", "a Kimi-Audio release folder: whisper-large-v3/ and "
  "the glm-4-voice-tokenizer folder beside it", 12.5,
  "Kimi-Audio's input: GLM-4-Voice codes and, beside each, the release's Whisper-large-v3 feature"))
register(AudioTokenizerType(
  "step_audio2", "tasks.audio.step_audio2:StepAudio2Tokenizer", "a Step-Audio 2 release folder (config.json and "
  "the encoder.* / adapter.* tensors of its safetensors; s3tokenizer_codes/ for spoken candidates)", 12.5,
  "Step-Audio 2's input: its audio encoder's and adaptor's rows over 128-bin log-mels, one per <audio_patch>; "
  "spoken candidates as precomputed CosyVoice2 s3tokenizer codes"))

register(AudioTokenizerType(
  "mimo_audio", "tasks.audio.mimo_audio:MimoAudioTokenizer", "a MiMo-Audio-Tokenizer folder (config.json, "
  "model.safetensors)", 25.0, "MiMo-Audio's RoPE encoder and 20-layer RVQ: its first N codebooks (the LLM's 8)"))


def resolver(kind: str, tokenizer_dir: str | None):
  """`where(path)`: a spec path made concrete. Relative paths are read under --audio_tokenizer_dir; None or '.'
  is that folder itself, which must then be given."""

  def where(path: str | None = None) -> str:
    if path in (None, ".", ""):
      if tokenizer_dir is None:
        raise AudioTokenizerError(
          f"the {kind} audio tokenizer needs --audio_tokenizer_dir ({TOKENIZERS.get(kind).files})")
      return tokenizer_dir
    return path if os.path.isabs(path) or tokenizer_dir is None else os.path.join(tokenizer_dir, path)

  return where


def from_spec(settings: dict, codebook_sizes: tuple[int, ...] | None, tokenizer_dir: str | None = None,
              dtype: str | None = None, mesh: str = "data:-1", shapes: str = "auto") -> AudioTokenizer:
  """The spec's `audio_tokenizer` settings made concrete and checked against the spec's codebooks (None: the
  tokenizer's own are taken). `dtype` (default: the settings', else float32), `mesh` and the shape policy
  `shapes` (jax_tokenizer.SHAPE_POLICIES) apply to the JAX ones, and to the JAX code tokenizer a composite one
  (kimi_audio) holds as `codes`."""
  kind = settings.get("type")
  record = TOKENIZERS.get(kind)
  given = {} if codebook_sizes is None else {"codebook_sizes": list(codebook_sizes)}
  tokenizer = load_object(record.loader).from_settings(dict(settings, **given), resolver(kind, tokenizer_dir))
  if isinstance(tokenizer, JaxAudioTokenizer):
    tokenizer.configure(dtype or settings.get("dtype", "float32"), mesh, shapes)
  inner = getattr(tokenizer, "codes", None)
  if isinstance(inner, JaxAudioTokenizer):  # its dtype is its own settings'
    inner.configure(inner.dtype, mesh, shapes)
  if codebook_sizes is not None and tuple(tokenizer.codebook_sizes) != tuple(codebook_sizes):
    raise AudioTokenizerError(f"the {kind} tokenizer makes codebooks {tuple(tokenizer.codebook_sizes)}, "
                              f"the spec says {tuple(codebook_sizes)}")
  return tokenizer


# One tokenizer of each kind (fingerprint, dtype, shape policy, mesh) per process: `shared`.
_SHARED: dict[tuple, AudioTokenizer] = {}


def shared(tokenizer: AudioTokenizer) -> AudioTokenizer:
  """The process's one instance of a JAX tokenizer like `tokenizer` (the same fingerprint, so the same weights and
  settings, dtype, shape policy and mesh), remembering the codes it made (`remember_codes`): the builds of one
  `tasks.prepare` run, every task and modality, tokenize each recording once (S->T and S->S share their spoken
  prefixes) and compile each shape once. Any other tokenizer is returned as it is."""
  computes = jax_part(tokenizer)
  if computes is None:
    return tokenizer
  key = (tokenizer.fingerprint(), computes.dtype, computes.shapes, computes.mesh_spec)
  if key not in _SHARED:
    computes.remember_codes()
    _SHARED[key] = tokenizer
  return _SHARED[key]


def shared_report() -> dict:
  """The `run_report`s of the shared tokenizers added up, and their shape policies (`tasks.prepare`'s last line)."""
  total = {"tokenizers": len(_SHARED),
           "policy": ",".join(sorted({jax_part(tokenizer).policy for tokenizer in _SHARED.values()}))}
  for tokenizer in _SHARED.values():
    for key, value in jax_part(tokenizer).run_report().items():
      total[key] = round(total.get(key, 0) + value, 2)
  return total
