"""ZeroSpeech 2021's spoken language modelling releases (sLM21: `lexical/` sWUGGY, `syntactic/` sBLIMP) read as
`zerospeech-benchmarks` 0.9.4 (`zrc`) reads them; file:line below is of its sdist, under `zerospeech/`:

    lexical/dev/gold.csv    + lexical/dev/<filename>.wav      swuggy       (lexical/test/: swuggy_test)
    syntactic/dev/gold.csv  + syntactic/dev/<filename>.wav    sblimp       (syntactic/test/: sblimp_test)

A gold file is a CSV with a header; `filename` names a recording (no folder, no `.wav`), `correct` is 1 for the
word (the grammatical sentence) and 0 for the non-word (the ungrammatical one). Its columns, in the release's order
(zrc reads some of them by position, tasks/lm/lexical.py:86-91, tasks/lm/syntactic.py:35-40, so the order is the
layout too):

    lexical:    id, filename, voice, frequency, word, phones, length, correct
    syntactic:  id, filename, voice, type, subtype, transcription, correct

Pairs: sWUGGY's word and non-word of one (`id`, `voice`) (lexical.py:46-48, a merge on voice and id); sBLIMP's by
position, the k-th `correct == 1` row with the k-th `correct == 0` row (syntactic.py:66-74, a column-wise concat):
a sBLIMP pair whose two rows differ in id, voice, type or subtype is refused here, so that on every release read
the two rules agree. Each recording is scored whole (S->S, the utterance protocol); where the gold file writes the
items (sWUGGY's `word`, or, when no non-word has one, every item's `phones`, lexical.py:40-42; sBLIMP's
`transcription`) they are asked T->T too, so the degradation matrix compares the two.

Each question (a pair in one voice) is labelled (`Question.labels`) as zrc groups it: sWUGGY `id` (averaged over
voices, then over ids: lexical.py:86-91, submissions/sLM21.py:347), `frequency_band` (`pd.cut` of the word's
frequency over [0, 1, 5, 20, 100, inf), right=False, labels oov, 1-5, 6-20, 21-100, >100: lexical.py:116-120),
`in_vocabulary` (not oov: the in-vocabulary figure, sLM21.py:350-358) and `length`; sBLIMP `item` (its type,
subtype and id: syntactic.py:35, averaged over voices, then over items) and `type` (syntactic.py:48-49).
The release's recordings are exactly its gold file's: a wav the gold file does not name, a named one missing, a
gold file without one of its columns, an unpaired row, each a one-line error naming the file (zrc's validation
holds a submission to the recordings of the dataset's index, submissions/sLM21.py:34-59).
"""

from __future__ import annotations

import collections
import csv
import os

from s2sjax.data import task_registry
from tasks.release import Problems, Question, ReleaseError, ReleasePaths

LEXICAL_COLUMNS = ("id", "filename", "voice", "frequency", "word", "phones", "length", "correct")
SYNTACTIC_COLUMNS = ("id", "filename", "voice", "type", "subtype", "transcription", "correct")
# lexical.py:116-120: pd.cut(frequency, [0, 1, 5, 20, 100, inf], right=False): each band holds [low, high).
BANDS = ((0, "oov"), (1, "1-5"), (5, "6-20"), (20, "21-100"), (100, ">100"))


def frequency_band(frequency: int) -> str:
  """The band of a word's frequency (its count in LibriSpeech), as zrc cuts it."""
  return [label for low, label in BANDS if frequency >= low][-1]


def _read_gold(paths: ReleasePaths, columns: tuple[str, ...]) -> list[tuple[str, dict]]:
  """(file:line, row) of every row of the gold file, after holding its header to the release's columns and its
  recordings to the folder's wavs."""
  gold = paths.index
  if not os.path.isfile(gold):
    raise ReleaseError(f"{gold} does not exist (is --manual_dir the sLM21 dataset, holding lexical/ and syntactic/?)")
  with open(gold, encoding="utf-8", newline="") as f:
    reader = csv.DictReader(f)
    header = tuple(reader.fieldnames or ())
    missing = [c for c in columns if c not in header]
    if missing:
      raise ReleaseError(f"{gold}: no column {', '.join(missing)} (an sLM21 gold file has {', '.join(columns)})")
    rows = [(f"{gold}:{number}", row) for number, row in enumerate(reader, 2)]  # line 1 is the header
  named = collections.Counter(row["filename"] for _, row in rows)
  twice = sorted(name for name, count in named.items() if count > 1)
  if twice:
    raise ReleaseError(f"{gold}: filename {twice[0]} is on {named[twice[0]]} rows (each recording is one row)")
  folder = paths.audio_dir
  wavs = {name[: -len(".wav")] for name in os.listdir(folder) if name.endswith(".wav")}
  stray = sorted(wavs - set(named))
  if stray:
    raise ReleaseError(f"{os.path.join(folder, stray[0] + '.wav')} is not in {gold} ({len(stray)} such recording(s)): "
                       "a release's recordings are its gold file's rows")
  absent = sorted(set(named) - wavs)
  if absent:
    raise ReleaseError(f"{gold} names {absent[0]}, but {os.path.join(folder, absent[0] + '.wav')} does not exist "
                       f"({len(absent)} such row(s))")
  for where, row in rows:
    if row["correct"] not in ("0", "1"):
      raise ReleaseError(f"{where}: correct {row['correct']!r} is neither 1 (the word) nor 0 (the non-word)")
  return rows


def _pair(record: task_registry.Task, paths: ReleasePaths, key: str, right: dict, wrong: dict, text: str,
          labels: dict[str, str]) -> Question:
  """The word (candidate 0, the right one) against the non-word: each recording whole, and the gold's text."""
  recordings = tuple(paths.inside(os.path.join(record.release_audio_dir, f"{row['filename']}.wav"))
                     for row in (right, wrong))
  return Question(id=key, language=record.language, uttids=(right["filename"], wrong["filename"]),
                  prefixes=("", ""), audio_paths=("", ""), candidates=(right[text], wrong[text]), correct=0,
                  candidate_audio_paths=recordings, labels=labels)


def read_lexical(record: task_registry.Task, paths: ReleasePaths, collect: Problems) -> list[Question]:
  """sWUGGY: one question per (id, voice), its word against its non-word, in frequency band order (zrc's table
  order), then the gold file's."""
  rows = _read_gold(paths, LEXICAL_COLUMNS)
  # lexical.py:40-42: when no non-word is written, every item's text is its phones
  text = "phones" if all(not row["word"] for _, row in rows if row["correct"] == "0") else "word"
  by_pair = collections.defaultdict(list)
  for where, row in rows:
    by_pair[(row["id"], row["voice"])].append((where, row))
  questions = []
  for (item, voice), shared in by_pair.items():
    words = [row for _, row in shared if row["correct"] == "1"]
    others = [row for _, row in shared if row["correct"] == "0"]
    if len(words) != 1 or len(others) != 1:
      raise ReleaseError(f"{shared[0][0]}: id {item} voice {voice} has {len(words)} word(s) and {len(others)} "
                         "non-word(s) (a pair is one of each, lexical.py:46-48): unpaired recording "
                         f"{shared[0][1]['filename']}")
    word, other = words[0], others[0]
    try:
      frequency = int(word["frequency"])
    except ValueError:
      frequency = -1
    if frequency < 0:
      raise ReleaseError(f"{shared[0][0]}: the word {word['filename']}'s frequency {word['frequency']!r} is not a "
                         "count (0 or more)")
    band = frequency_band(frequency)
    questions.append(_pair(record, paths, f"{item}_{voice}", word, other, text, {
      "id": item, "voice": voice, "frequency_band": band, "in_vocabulary": "no" if band == "oov" else "yes",
      "length": word["length"]}))
  order = {label: rank for rank, (_, label) in enumerate(BANDS)}
  return sorted(questions, key=lambda q: order[q.labels["frequency_band"]])


def read_syntactic(record: task_registry.Task, paths: ReleasePaths, collect: Problems) -> list[Question]:
  """sBLIMP: the k-th grammatical row against the k-th ungrammatical one (syntactic.py:66-74), in the gold file's
  order."""
  rows = _read_gold(paths, SYNTACTIC_COLUMNS)
  right = [(where, row) for where, row in rows if row["correct"] == "1"]
  wrong = [(where, row) for where, row in rows if row["correct"] == "0"]
  if len(right) != len(wrong):
    more = right if len(right) > len(wrong) else wrong
    where, row = more[min(len(right), len(wrong))]
    raise ReleaseError(f"{where}: unpaired recording {row['filename']}: {len(right)} grammatical and {len(wrong)} "
                       "ungrammatical rows (zrc pairs the k-th of each, syntactic.py:66-74)")
  questions = []
  for (where, good), (other, bad) in zip(right, wrong):
    differ = [c for c in ("id", "voice", "type", "subtype") if good[c] != bad[c]]
    if differ:
      raise ReleaseError(f"{where} and {other}: zrc pairs them by position (syntactic.py:66-74), but their "
                         f"{', '.join(differ)} differ: a row is missing or out of order")
    item = f"{good['type']}/{good['subtype']}/{good['id']}"
    questions.append(_pair(record, paths, f"{good['id']}_{good['voice']}_{good['filename']}", good, bad,
                           "transcription", {"id": good["id"], "voice": good["voice"], "type": good["type"],
                                             "subtype": good["subtype"], "item": item}))
  return questions
