"""The official spoken StoryCloze (slp-rl/SpokenStoryCloze), read as SlamKit's `ModellingMetricDataset` reads it, so
that S→S scores are comparable with TWIST's and Moshi's published ones.

The release holds whole spoken stories, the context and its ending in one recording: `sSC/` (sStoryCloze) and
`tSC/` (topic StoryCloze) folders of `<n>_<...>.wav`. Sorted by the leading number `n`, recordings 2i and 2i+1 are
one story told with its right ending and with its wrong one (slamkit/metric/modelling_metric.py). Each recording is
scored whole, as SlamKit scores it: the utterance protocol of S→S, with nothing before the recording but what opens
a sequence. Two recordings with one number are refused: their order, and so which is right, would be the folder
listing's (SlamKit's sort leaves them so).
"""

from __future__ import annotations

import os

from tasks.release import Question, ReleaseError

FOLDERS = {"sstorycloze": "sSC", "tstorycloze": "tSC"}
SEPARATOR = "_"  # storycloze() builds its dataset with sep="_"


def folder(task: str, root: str) -> str | None:
  """The task's folder of recordings when `root` is laid out as SpokenStoryCloze (else None)."""
  path = os.path.join(root, FOLDERS[task]) if task in FOLDERS else None
  return path if path and os.path.isdir(path) else None


def _number(name: str, where: str) -> int:
  head = name.split(SEPARATOR)[0]
  if not head.isdigit():
    raise ReleaseError(f"{where}/{name}: a SpokenStoryCloze recording is named <n>{SEPARATOR}<...>.wav, with a "
                       f"number n before the first {SEPARATOR!r}")
  return int(head)


def read_pairs(task: str, root: str) -> list[Question]:
  """Question i: recording 2i (the right ending, candidate 0) against 2i+1 (the wrong one). An odd count leaves
  a story without its pair: refused, naming the folder."""
  where = folder(task, root)
  if where is None:
    raise ReleaseError(f"{root} has no {FOLDERS.get(task, '?')}/ folder of SpokenStoryCloze recordings for {task}")
  numbered = sorted((_number(n, where), n) for n in os.listdir(where) if n.endswith(".wav"))
  for (a, first), (b, second) in zip(numbered, numbered[1:]):
    if a == b:
      raise ReleaseError(f"{where}: {first} and {second} share the number {a}, so which is the right ending cannot "
                         "be told (recordings are numbered one by one: 2i right, 2i+1 wrong)")
  names = [n for _, n in numbered]
  if not names:
    raise ReleaseError(f"{where} holds no .wav recording")
  if len(names) % 2:
    raise ReleaseError(f"{where} holds {len(names)} recordings: an odd count leaves {names[-1]} without its pair "
                       "(recordings 2i and 2i+1, sorted by their number, are one story's right and wrong telling)")
  questions = []
  for i in range(len(names) // 2):
    right, wrong = names[2 * i], names[2 * i + 1]
    stems = tuple(os.path.splitext(n)[0] for n in (right, wrong))
    questions.append(Question(id=str(i), language="en", uttids=stems, prefixes=("", ""), audio_paths=("", ""),
                              candidates=stems, correct=0,
                              candidate_audio_paths=tuple(os.path.join(where, n) for n in (right, wrong))))
  return questions
