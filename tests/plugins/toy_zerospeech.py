"""A release laid out as ZeroSpeech 2021's lexical task (sWUGGY) is, which only the tests define: a gold file
pairing randomly named recordings, a word and a non-word (zerospeech/zerospeech2021 zerospeech2021/lexical.py,
`load_data`: gold.csv's columns id, filename, voice, frequency, word, phones, length, correct; the recordings
`<filename>.wav` beside it; a pair is the two lines of one id and voice, `correct` 1 the word; `evaluate_by_pair`
counts a tie half). One registration each, in this plugin module (S2SJAX_PLUGINS): its release format, its
reader (below), and a task that names it; no project file knows any. Each recording is scored whole (S->S, the
utterance protocol), as spoken-LM benchmarks score them.
"""

from __future__ import annotations

import collections
import csv
import os

from s2sjax.data import task_registry
from tasks import release
from tasks.release import OutsideReleaseError, Problems, Question, ReleaseError

COLUMNS = ("id", "filename", "voice", "word", "correct")

RELEASE = task_registry.RELEASE_FORMATS.register(task_registry.ReleaseFormat(
  "zerospeech_gold", "words and non-words as recordings paired by a gold file, no text", modalities=("s2s",),
  protocols=("utterance",)))

TASK = task_registry.register(task_registry.Task(
  "toy_swuggy", "ToySWUGGY", "en", "zerospeech_gold", "lexical/dev/gold.csv", "lexical/dev", "lexical/dev",
  decision="pair", candidates=2, sizes=task_registry.PlannerSizes(questions=3, prefix_tokens=0, candidate_tokens=0,
                                                               seconds=1.0), ties="half"))


def read_gold(record: task_registry.Task, paths, collect: Problems) -> list[Question]:
  """One question per (id, voice): the word (candidate 0, the right one) against the non-word, each recording
  `<filename>.wav` in the task's audio folder; a pair without exactly one of each is a problem naming its lines."""
  index = paths.index
  if not os.path.isfile(index):
    raise ReleaseError(f"{index} does not exist (is --manual_dir the ZeroSpeech release?)")
  with open(index, encoding="utf-8", newline="") as f:
    reader = csv.DictReader(f)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
      raise ReleaseError(f"{index}: no column {', '.join(missing)} (a gold file has {', '.join(COLUMNS)})")
    pairs = collections.defaultdict(list)
    for number, line in enumerate(reader, 2):  # line 1 is the header
      pairs[(line["id"], line["voice"])].append((f"{os.path.basename(index)}:{number}", line))
  questions = []
  for (pair, voice), lines in sorted(pairs.items()):
    key = f"{pair}_{voice}"
    words = [entry for entry in lines if entry[1]["correct"] == "1"]
    others = [entry for entry in lines if entry[1]["correct"] == "0"]
    if len(words) != 1 or len(others) != 1 or len(lines) != 2:
      for where, _ in lines:
        collect.add(where, f"pair {key} needs one word (correct 1) and one non-word (correct 0)", key)
      continue
    try:
      recordings = tuple(paths.inside(os.path.join(record.release_audio_dir, f"{line['filename']}.wav"), where)
                         for where, line in words + others)
    except OutsideReleaseError as e:
      for where, _ in lines:
        collect.add(where, str(e), key)
      continue
    questions.append(Question(
      id=key, language=record.language, uttids=tuple(line["filename"] for _, line in words + others),
      prefixes=("", ""), audio_paths=("", ""), candidates=tuple(line["word"] for _, line in words + others),
      correct=0, candidate_audio_paths=recordings))
  return questions


READER = release.register(release.ReleaseReader(RELEASE.name, read_gold))
