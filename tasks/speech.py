"""Synthetic speech for written text: espeak-ng's voice for a language, resampled by sox to the release's format
(16 kHz mono 16-bit). The bundled sample (`tasks.sample.make_sample`) and the replica importer (`tasks.importer`)
speak through it."""

from __future__ import annotations

import subprocess
import tempfile

VOICES = {"en": "en", "zh": "cmn"}  # language -> espeak-ng voice


def speak(text: str, language: str, path: str) -> None:
  """espeak-ng speech of `text` in `language`, written to `path` as 16 kHz mono 16-bit."""
  with tempfile.NamedTemporaryFile(suffix=".wav") as raw:
    # The text goes in on stdin, never as an argument: a line such as "-26.8" or "--path=..." would be read as
    # espeak-ng's options (it then writes nothing and still exits 0).
    subprocess.run(["espeak-ng", "-v", VOICES[language], "-w", raw.name, "--stdin"], input=text.encode("utf-8"),
                   check=True)
    # -D: no dither, so the same text always gives the same bytes (story lines 2k and 2k+1 share their audio)
    subprocess.run(["sox", "-D", "-v", "0.9", raw.name, "-r", "16000", "-c", "1", "-b", "16", path], check=True)
