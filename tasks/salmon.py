"""A SALMon part (slp-rl/salmon) read as its scorer reads it (salmon.py; SlamKit's copy,
slamkit/metric/modelling_metric.py:33-68).

The release is one folder per part (salmon.py:78-87: bg_alignment, bg_all_consistency, bg_domain_consistency,
gender_consistency, rir_consistency, sentiment_alignment, sentiment_consistency, speaker_consistency), each holding
`sample_<i>_<j>.wav` (data_generation/*_consistency.py, *_alignment.py: j = 0 the positive, 1 the negative) and a
`metadata.json` the scorer does not read. The scorer globs the part's `*.wav`, groups them by the number after the
first `_` (salmon.py:17-34), sorts each sample's files by name (salmon.py:36-37) and takes the first as the positive,
the second as the negative (salmon.py:53-55, modelling_metric.py:64-68), samples in number order. A sample scores 1
when the positive's likelihood is higher, 0.5 on a tie (salmon.py:101-107); a part's accuracy is the mean
(salmon.py:111-112).
"""

from __future__ import annotations

import collections
import os

from s2sjax.data import task_registry
from tasks.release import Problems, Question, ReleaseError, ReleasePaths, whole_recordings


def sample_number(folder: str, name: str) -> int:
  """The sample a recording belongs to: the number after the name's first `_` (salmon.py:22-24)."""
  parts = os.path.splitext(name)[0].split("_")
  if len(parts) < 2 or not parts[1].isdigit():
    raise ReleaseError(f"{folder}/{name}: a SALMon recording is named sample_<i>_<j>.wav, the sample's number i "
                       "after the first '_'")
  return int(parts[1])


def read_salmon_part(record: task_registry.Task, paths: ReleasePaths, collect: Problems) -> list[Question]:
  """The part's samples in number order, each its positive and negative recording, whole. A sample with one
  recording, or more than two (the scorer unpacks two, salmon.py:54), is refused naming its files."""
  folder = paths.index
  if not os.path.isdir(folder):
    raise ReleaseError(f"{folder} does not exist: a SALMon task reads that part's folder (is --manual_dir the "
                       "SALMon release, holding its eight part folders?)")
  samples = collections.defaultdict(list)
  for name in os.listdir(folder):
    if name.endswith(".wav"):
      samples[sample_number(folder, name)].append(name)
  if not samples:
    raise ReleaseError(f"{folder} holds no .wav recording")
  questions = []
  for number in sorted(samples):
    names = sorted(samples[number])
    if len(names) != 2:
      what = "has no negative" if len(names) == 1 else f"has {len(names)} recordings"
      raise ReleaseError(f"{folder}: sample {number} ({', '.join(names)}) {what}: a sample is one positive and one "
                         "negative recording")
    recordings = tuple(paths.inside(os.path.join(record.release_jsonl, n), f"{folder}/{n}") for n in names)
    questions.append(whole_recordings(record, str(number), recordings))
  return questions
