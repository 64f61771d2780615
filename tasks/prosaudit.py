"""ZeroSpeech's ProsAudit release read as its toolkit scores it (zerospeech-benchmarks 0.9.4, under `zerospeech/`).

A subset (`english/dev`, `english/test`: the index's `english_dev`, `english_test`, datasets/zrc_2021.py:55-57,
submissions/prosAudit.py:62-66) is a folder of recordings and its `gold.csv`, one row per recording, with the columns
`filename, correct, id, voice, type, subtype, transcription` (each named by tasks/lm/prosody.py:63, 73-92; the toolkit
reads `id` and `type` by position, prosody.py:38-45, so a release keeps that column order). Every recording is
scored (the submission's validation, submissions/prosAudit.py:32-36) and the gold joins the scores by filename
(prosody.py:63-70).

Pairs are made by position, not by id: the k-th `correct == 1` row with the k-th `correct == 0` row (prosody.py:
73-77), the pair taking the correct row's `id`, `voice`, `type`, `subtype` (prosody.py:78-92). A pair scores 1 when
the correct recording's score is higher, 0.5 on a tie (prosody.py:30-33); pairs are averaged over voices per
(type, id), then per type with count, mean and std (prosody.py:38-54): the two subtasks, `lexical` and
`protosyntax` (submissions/prosAudit.py:115-116). Questions come out in that groupby's order (type, then id).
"""

from __future__ import annotations

import csv
import os

from s2sjax.data import task_registry
from tasks.release import Problems, Question, ReleaseError, ReleasePaths, whole_recordings

GOLD_COLUMNS = ("filename", "correct", "id", "voice", "type", "subtype", "transcription")
LABELS = ("id", "voice", "type", "subtype")  # the correct row's, as the toolkit's pair keeps them


def read_gold(gold: str) -> list[dict]:
  """gold.csv's rows (with `line`), every column the toolkit reads present and `correct` 0 or 1."""
  if not os.path.isfile(gold):
    raise ReleaseError(f"{gold} does not exist (is --manual_dir the ProsAudit dataset, holding english/dev and "
                       "english/test?)")
  try:
    with open(gold, newline="", encoding="utf-8-sig") as f:  # a byte order mark is no part of a name (as pandas)
      reader = csv.DictReader(f)
      missing = [c for c in GOLD_COLUMNS if c not in (reader.fieldnames or ())]
      if missing:
        raise ReleaseError(f"{gold} lacks the column(s) {', '.join(missing)}: ProsAudit's gold.csv holds "
                           f"{', '.join(GOLD_COLUMNS)}")
      rows = [dict(row, line=n) for n, row in enumerate(reader, 2)]
  except (UnicodeDecodeError, csv.Error) as e:
    raise ReleaseError(f"{gold} is not a UTF-8 CSV file ({e})") from None
  seen = {}
  for row in rows:
    if row["correct"] not in ("0", "1"):
      raise ReleaseError(f"{gold}:{row['line']}: correct {row['correct']!r} is neither 1 nor 0")
    if row["filename"] in seen:
      raise ReleaseError(f"{gold}:{row['line']}: {row['filename']} is listed twice (line {seen[row['filename']]} too)")
    seen[row["filename"]] = row["line"]
  return rows


def pairs_by_position(gold: str, rows: list[dict]) -> list[tuple[dict, dict]]:
  """(correct row, incorrect row) pairs, the k-th of each (prosody.py:73-77); a row left over is refused."""
  correct = [row for row in rows if row["correct"] == "1"]
  incorrect = [row for row in rows if row["correct"] == "0"]
  if len(correct) != len(incorrect):
    longer = correct if len(correct) > len(incorrect) else incorrect
    extra = longer[min(len(correct), len(incorrect))]
    raise ReleaseError(f"{gold}: {len(correct)} correct==1 rows against {len(incorrect)} correct==0 rows, so "
                       f"{extra['filename']} (line {extra['line']}) is unpaired (the k-th of each make a pair)")
  return list(zip(correct, incorrect))


def _toolkit_order(pairs: list[tuple[dict, dict]]) -> list[tuple[dict, dict]]:
  """Sorted by (type, id) as pandas' groupby sorts them, ids as numbers when every id is one (read_csv's int
  column), the pairs of one (type, id) in file order."""
  numeric = all(right["id"].lstrip("-").isdigit() for right, _ in pairs)
  return sorted(pairs, key=lambda pair: (pair[0]["type"], int(pair[0]["id"]) if numeric else pair[0]["id"]))


def read_prosaudit(record: task_registry.Task, paths: ReleasePaths, collect: Problems) -> list[Question]:
  """A subset's pairs, each two whole recordings (the correct one first), labelled with the pair's id, voice, type,
  subtype and `type_id` (what the toolkit averages over voices). A recording not in gold.csv, or a row without its
  recording, is refused naming it."""
  gold, folder = paths.index, paths.audio_dir
  rows = read_gold(gold)
  listed = {row["filename"]: row for row in rows}
  on_disk = sorted(os.path.splitext(n)[0] for n in os.listdir(folder) if n.endswith(".wav")) \
      if os.path.isdir(folder) else []
  for stem in on_disk:
    if stem not in listed:
      raise ReleaseError(f"{folder}/{stem}.wav is not in {gold}: every recording of the subset is scored and "
                         "joined to its gold row by filename")
  for row in rows:
    if not os.path.isfile(os.path.join(folder, f"{row['filename']}.wav")):
      raise ReleaseError(f"{gold}:{row['line']}: {row['filename']}.wav is not in {folder}")
  questions = []
  for right, wrong in _toolkit_order(pairs_by_position(gold, rows)):
    recordings = tuple(paths.inside(os.path.join(record.release_audio_dir, f"{row['filename']}.wav"),
                                    f"{gold}:{row['line']}") for row in (right, wrong))
    labels = {name: right[name] for name in LABELS} | {"type_id": f"{right['type']}/{right['id']}"}
    questions.append(whole_recordings(record, right["filename"], recordings, labels=labels))
  return questions
