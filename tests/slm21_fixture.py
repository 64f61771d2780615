"""A tiny ZeroSpeech 2021 sLM21 dev release, written at test time in the official layout (tasks/zerospeech.py: the
folders, gold.csv's columns and their order, `<filename>.wav` beside it): sWUGGY ids in every frequency band, one
pair whose non-word is its word (so its two recordings tie), sBLIMP pairs of three types and four subtypes, two
voices each, spoken by the importer's TTS (espeak-ng; the second voice is the first after 0.15 s of silence, so the
two differ) or, for tests that only read the layout, a short noise per recording.

Like the release: filenames are random letters, a non-word's `word` is empty (its `phones` written), `length`
counts a word's phones, and sBLIMP's rows alternate grammatical and ungrammatical, which zrc pairs by position.
"""

from __future__ import annotations

import csv
import os
import zlib

import numpy as np
import soundfile

from tasks.zerospeech import LEXICAL_COLUMNS, SYNTACTIC_COLUMNS

VOICES = ("Alex", "Victoria")
# (id, word, its phones, frequency, non-word as spoken, its phones): frequencies in every band of lexical.py:116-120
# (oov 0, 1-5 holds 1..4, 6-20 5..19, 21-100 20..99, >100 from 100), "tie" a non-word that is its word.
WORDS = (
  ("w1", "beaver", "b iy v er", 0, "beamer", "b iy m er"),
  ("w2", "garden", "g aa r d ah n", 3, "gorben", "g ao r b ah n"),
  ("w3", "little", "l ih t ah l", 12, "lintle", "l ih n t ah l"),
  ("w4", "window", "w ih n d ow", 57, "wondow", "w aa n d ow"),
  ("w5", "house", "h aw s", 420, "hoube", "h aw b"),
  ("w6", "water", "w ao t er", 100, "wapter", "w ao p t er"),
  ("tie", "river", "r ih v er", 8, "river", "r ih v er"),
)
# (type, subtype, id, grammatical, ungrammatical)
SENTENCES = (
  ("anaphor_agreement", "anaphor_gender_agreement", "0", "the boy saw himself", "the boy saw herself"),
  ("anaphor_agreement", "anaphor_number_agreement", "0", "the girls hid themselves", "the girls hid herself"),
  ("determiner_noun_agreement", "determiner_noun_agreement_1", "0", "this dog runs", "these dog runs"),
  ("determiner_noun_agreement", "determiner_noun_agreement_1", "1", "that cat sleeps", "those cat sleeps"),
  ("irregular_forms", "irregular_past_participle_verbs", "0", "the bird has flown", "the bird has flew"),
)


def _names(count: int, seed: int) -> list[str]:
  """Distinct random-letter filenames, as the release's (e.g. aAAfmkmQpVz)."""
  rng = np.random.default_rng(seed)
  letters = np.array(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))
  names: list[str] = []
  while len(names) < count:
    name = "".join(rng.choice(letters, 11))
    if name not in names:
      names.append(name)
  return names


def _write_wav(path: str, text: str, voice: int, speech: bool, spoken: dict) -> None:
  if not speech:
    seed = zlib.crc32(f"{voice}:{text}".encode())
    soundfile.write(path, np.random.default_rng(seed).normal(0, 0.1, 4000).astype(np.float32), 16000)
    return
  if text not in spoken:
    from tasks.speech import speak

    first = path + ".tts.wav"
    speak(text, "en", first)
    spoken[text] = soundfile.read(first, dtype="float32")[0]
    os.remove(first)
  wave = spoken[text]
  if voice:
    wave = np.concatenate([np.zeros(2400, np.float32), wave])
  soundfile.write(path, wave, 16000, subtype="PCM_16")


def write_release(root: str, speech: bool = True, words=WORDS, sentences=SENTENCES) -> str:
  """The release under `root` (lexical/dev/, syntactic/dev/), of `words` and `sentences`; returns `root`."""
  spoken: dict = {}
  lexical, syntactic = os.path.join(root, "lexical", "dev"), os.path.join(root, "syntactic", "dev")
  os.makedirs(lexical)
  os.makedirs(syntactic)
  names = iter(_names(2 * len(VOICES) * (len(WORDS) + len(SENTENCES)), seed=21))  # the same names for a subset
  rows = []
  for item, word, phones, frequency, other, other_phones in words:
    for v, voice in enumerate(VOICES):
      for text, written, sounds, correct in ((word, word, phones, 1), (other, "", other_phones, 0)):
        name = next(names)
        _write_wav(os.path.join(lexical, f"{name}.wav"), text, v, speech, spoken)
        rows.append({"id": item, "filename": name, "voice": voice, "frequency": frequency if correct else "",
                     "word": written, "phones": sounds, "length": len(phones.split()) if correct else "",
                     "correct": correct})
  _write_csv(os.path.join(lexical, "gold.csv"), LEXICAL_COLUMNS, rows)
  rows = []
  for kind, subtype, item, good, bad in sentences:
    for v, voice in enumerate(VOICES):
      for text, correct in ((good, 1), (bad, 0)):
        name = next(names)
        _write_wav(os.path.join(syntactic, f"{name}.wav"), text, v, speech, spoken)
        rows.append({"id": item, "filename": name, "voice": voice, "type": kind, "subtype": subtype,
                     "transcription": text, "correct": correct})
  _write_csv(os.path.join(syntactic, "gold.csv"), SYNTACTIC_COLUMNS, rows)
  return root


def _write_csv(path: str, columns: tuple[str, ...], rows: list[dict]) -> None:
  with open(path, "w", encoding="utf-8", newline="") as f:
    writer = csv.DictWriter(f, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
