"""Small releases laid out as ZeroSpeech's ProsAudit and SALMon ship them (names, CSV columns in their order, folder
depth), spoken by the importer's TTS (tasks.speech: espeak-ng) and changed by plain signal operations where a
benchmark varies the acoustics: the layout is what is tested, the content only has to differ."""

from __future__ import annotations

import csv
import hashlib
import json
import os

import numpy as np
import soundfile

from tasks.prosaudit import GOLD_COLUMNS
from tasks.speech import speak

SAMPLE_RATE = 16000
PAUSE = np.zeros(SAMPLE_RATE * 2 // 5, np.float32)  # 0.4 s, ProsAudit's inserted pause

# (type, id, subtype, pause at a natural place, pause at an unnatural one): protosyntax moves a pause from a strong
# prosodic boundary into a phrase, lexical from between two words into a word. Ids 10 and 2 sort differently as
# numbers and as text; the file lists protosyntax first, the toolkit's groupby puts lexical first.
PROSAUDIT_ITEMS = (
  ("protosyntax", "10", "boundary", ("the old man", "saw the big dog"), ("the old", "man saw the big dog")),
  ("protosyntax", "2", "boundary", ("after dinner", "we walked home"), ("after", "dinner we walked home")),
  ("lexical", "7", "pause", ("the butter", "melted slowly"), ("the but", "ter melted slowly")),
  ("lexical", "3", "pause", ("a window", "opened"), ("a win", "dow opened")),
)
VOICES = {"en_f": 1.0, "en_m": 0.85}  # a voice: espeak-ng's speech resampled by this factor (lower, slower)


class Speech:
  """espeak-ng clips of texts, each spoken once per cache folder (a test module shares one)."""

  def __init__(self, folder: str):
    self.folder = folder
    os.makedirs(folder, exist_ok=True)

  def __call__(self, text: str) -> np.ndarray:
    path = os.path.join(self.folder, hashlib.sha256(text.encode()).hexdigest()[:16] + ".wav")
    if not os.path.exists(path):
      speak(text, "en", path)
    return soundfile.read(path, dtype="float32")[0]


def resample(wave: np.ndarray, factor: float) -> np.ndarray:
  """The wave played `factor` times as long (pitch and speed lowered together)."""
  positions = np.arange(int(len(wave) * factor)) / factor
  return np.interp(positions, np.arange(len(wave)), wave).astype(np.float32)


def zerospeech_name(*parts: str) -> str:
  """An 11-letter name as ZeroSpeech's recordings have (e.g. aAAfmkmQpVz), fixed by what it holds."""
  digest = hashlib.sha256("/".join(parts).encode()).digest()
  letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
  return "".join(letters[b % len(letters)] for b in digest[:11])


def write_prosaudit(root: str, speech: Speech, subset: str = "english/dev") -> list[dict]:
  """`root/<subset>/` holding every item x voice as two recordings (natural and unnatural pause) and gold.csv
  (GOLD_COLUMNS, in that order): each item's rows voice by voice, the correct row before its pair. Returns the
  rows as written."""
  folder = os.path.join(root, subset)
  os.makedirs(folder, exist_ok=True)
  rows = []
  for kind, item, subtype, natural, unnatural in PROSAUDIT_ITEMS:
    for voice, factor in VOICES.items():
      for correct, chunks in ((1, natural), (0, unnatural)):
        name = zerospeech_name(kind, item, voice, str(correct))
        wave = np.concatenate([speech(chunks[0]), PAUSE, speech(chunks[1])])
        soundfile.write(os.path.join(folder, f"{name}.wav"), resample(wave, factor), SAMPLE_RATE, subtype="PCM_16")
        rows.append({"filename": name, "correct": correct, "id": item, "voice": voice, "type": kind,
                     "subtype": subtype, "transcription": " ".join(natural)})
  write_gold(os.path.join(folder, "gold.csv"), rows)
  return rows


def write_gold(path: str, rows: list[dict], columns: tuple[str, ...] = GOLD_COLUMNS) -> None:
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)


SALMON_SENTENCES = ("the train leaves at noon", "she opened the red door", "we planted trees in spring")


def _noise(seed: int, length: int, level: float) -> np.ndarray:
  return (np.random.default_rng(seed).normal(0, level, length)).astype(np.float32)


def _room(seed: int, wave: np.ndarray) -> np.ndarray:
  """`wave` in a room: convolved with a decaying noise burst of its own length (seed) as impulse response."""
  length = 800 + 1600 * (seed % 3)
  response = _noise(seed, length, 1.0) * np.exp(-np.arange(length) / (length / 5))
  response[0] = 1.0
  wet = np.convolve(wave, response)[: len(wave)]
  return (wet / np.abs(wet).max() * 0.8).astype(np.float32)


def _halves(wave: np.ndarray, first, second) -> np.ndarray:
  half = len(wave) // 2
  return np.concatenate([first(wave[:half]), second(wave[half:])])


def _background(wave: np.ndarray, same: tuple[int, float], other: tuple[int, float]) -> tuple[np.ndarray, np.ndarray]:
  """One noise (seed, level) under the whole wave; the same noise, then another from halfway."""
  noisy = lambda seed, level: lambda x: x + _noise(seed, len(x), level)
  return noisy(*same)(wave), _halves(wave, noisy(*same), noisy(*other))


# Per part, (positive, negative) from one spoken sentence: the positive keeps one acoustic condition throughout,
# the negative changes it halfway (consistency) or pairs it with a mismatched one (alignment).
SALMON_CHANGES = {
  "speaker_consistency": lambda w: (w, _halves(w, lambda x: x, lambda x: resample(x, 0.8))),
  "gender_consistency": lambda w: (w, _halves(w, lambda x: x, lambda x: resample(x, 0.7))),
  "sentiment_consistency": lambda w: (w, _halves(w, lambda x: x, lambda x: resample(x, 1.25))),
  "bg_domain_consistency": lambda w: _background(w, (1, 0.02), (2, 0.08)),
  "bg_all_consistency": lambda w: _background(w, (3, 0.03), (4, 0.1)),
  "rir_consistency": lambda w: (_room(1, w), _halves(w, lambda x: _room(1, x), lambda x: _room(2, x))),
  "sentiment_alignment": lambda w: (w, resample(w, 1.3)),
  "bg_alignment": lambda w: (w + _noise(5, len(w), 0.01), w + _noise(6, len(w), 0.1)),
}


def write_salmon(root: str, speech: Speech, parts: tuple[str, ...] = tuple(SALMON_CHANGES)) -> str:
  """`root/<part>/sample_<i>_0.wav` (positive) and `sample_<i>_1.wav` (negative) for each sentence, with the part's
  metadata.json (one record per sample, as data_generation writes it; the scorer never reads it). Returns root."""
  for part in parts:
    folder = os.path.join(root, part)
    os.makedirs(folder, exist_ok=True)
    metadata = []
    for i, sentence in enumerate(SALMON_SENTENCES):
      for j, wave in enumerate(SALMON_CHANGES[part](speech(sentence))):
        soundfile.write(os.path.join(folder, f"sample_{i}_{j}.wav"), np.clip(wave, -1, 1), SAMPLE_RATE)
      metadata.append({"index": i, "text": sentence})
    with open(os.path.join(folder, "metadata.json"), "w") as f:
      json.dump(metadata, f)
  return root
