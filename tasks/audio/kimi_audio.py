"""Kimi-Audio's audio input, as its prompt manager reads a recording (MoonshotAI/Kimi-Audio 349251e,
`kimia_infer/api/prompt_manager.py`): GLM-4-Voice's 12.5 Hz codes (`_tokenize_audio`, 53-57, with THUDM's
glm-4-voice-tokenizer, :17) and, beside each code, the release's Whisper-large-v3 feature (`extract_whisper_feat`,
59-76, with the encoder kept in the release's `whisper-large-v3/`, :23-28). One audio tokenizer type with a feature
track (`feature_width`, `frame_features`): the build's batched pass gets both per recording, and the Kimi encoder
(tasks/kimi_encoder.py) lays the codes on the audio stream and the features at the same rows.

Settings (a spec's `audio_tokenizer`, paths under --audio_tokenizer_dir, which is the release folder):
  codes        the code tokenizer's own settings, {type: glm4_voice, model_dir: glm-4-voice-tokenizer} by default
               (any registered type: `precomputed` reads codes made elsewhere, by uttid)
  whisper_dir  the Whisper encoder folder, `whisper-large-v3` by default
  dtype        the Whisper encoder's compute dtype (float32 by default; the release runs it in bfloat16, :27)
"""

from __future__ import annotations

import numpy as np

from s2sjax.runtime.registry import load_object
from tasks.audio.base import AudioTokenizer, AudioTokenizerError
from tasks.audio.kimi_whisper import SAMPLE_RATE, KimiWhisperFeatures

DEFAULT_CODES = {"type": "glm4_voice", "model_dir": "glm-4-voice-tokenizer"}
DEFAULT_WHISPER = "whisper-large-v3"
SETTINGS = ("type", "codes", "whisper_dir", "dtype", "codebook_sizes")


class KimiAudioTokenizer(AudioTokenizer):
  """GLM-4-Voice codes [T, 1] (`encode_batch`) and Whisper features [T, 4 d_model] (`frame_features`) of 16 kHz
  waves, T the same for both (whisper.py:195-197 counts the codes' frames)."""

  sample_rate = SAMPLE_RATE
  reads_audio = True

  def __init__(self, codes: AudioTokenizer, whisper: KimiWhisperFeatures):
    if codes.reads_audio and codes.sample_rate != SAMPLE_RATE:
      raise AudioTokenizerError(f"Kimi-Audio's codes are made from {SAMPLE_RATE} Hz audio; the {type(codes).__name__} "
                                f"tokenizer reads {codes.sample_rate} Hz")
    self.codes, self.whisper = codes, whisper
    self.num_codebooks, self.codebook_sizes = codes.num_codebooks, tuple(codes.codebook_sizes)
    self.feature_width = whisper.shape.feature_dim

  @classmethod
  def from_settings(cls, settings: dict, where) -> "KimiAudioTokenizer":
    from tasks.audio import TOKENIZERS  # the registry this type is one record of

    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
      raise AudioTokenizerError(f"kimi_audio tokenizer settings: unknown keys {unknown} (known: "
                                f"{', '.join(SETTINGS[1:4])})")
    codes = dict(settings.get("codes") or DEFAULT_CODES)
    if "codebook_sizes" in settings:
      codes.setdefault("codebook_sizes", settings["codebook_sizes"])
    kind = codes.get("type")
    if kind == "kimi_audio" or kind not in TOKENIZERS.names():
      raise AudioTokenizerError(f"kimi_audio tokenizer: codes.type {kind!r} must be another registered audio "
                                f"tokenizer ({', '.join(n for n in TOKENIZERS.names() if n != 'kimi_audio')})")
    tokenizer = load_object(TOKENIZERS.get(kind).loader).from_settings(codes, where)
    whisper = KimiWhisperFeatures(where(settings.get("whisper_dir", DEFAULT_WHISPER)), settings.get("dtype", "float32"))
    return cls(tokenizer, whisper)

  def encode(self, wave: np.ndarray, uttid: str) -> np.ndarray:
    return self.codes.encode(wave if self.codes.reads_audio else None, uttid)

  def encode_batch(self, waves: list[np.ndarray], names: list[str] | None = None, progress=None) -> list[np.ndarray]:
    if self.codes.reads_audio:
      return self.codes.encode_batch(waves, names, progress)
    return super().encode_batch(waves, names, progress)  # codes read by name, one by one

  def frame_features(self, waves: list[np.ndarray], progress=None) -> list[np.ndarray]:
    return self.whisper.features(waves, progress)

  def identity(self) -> dict:
    return {"type": "kimi_audio", "codes": self.codes.identity(), "features": self.whisper.identity()}
