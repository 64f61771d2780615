"""Reads the S2SBench release layout (as users download it) into benchmark questions, checking everything.

Where each task's files are and which format they hold is its record in `s2sjax.benchmarks`; S2SBench's own:

    StoryCloze/sStory_s2t.jsonl   + StoryCloze/s-story-firstspeech/<uttid>.wav     sstorycloze     (en)
    StoryCloze/zh_story.jsonl     + StoryCloze/zh_story/<uttid>.wav                zh_sstorycloze  (zh)
    cmmlu/cmmlu_rewrite_4.jsonl   + cmmlu/cmmlu_rewrite/<uttid>.wav                scmmlu          (zh)

`story_pairs` lines carry `uttid, first, last`: uttid 2k holds the right ending and 2k+1 the wrong one of the same
story; a uttid is an int or a string whose part before the first `_` is that int. `multiple_choice` lines carry
`uttid, first, A, B, C, D, answer`. The audio is the spoken `first`.

Spoken candidates (T->S, S->S) extend the layout, one folder per task beside the prefixes' (the record's
`release_candidate_audio_dir`): `<uttid>.wav` speaks a story line's `last`, `<uttid>_<A|B|C|D>.wav` an option:

    StoryCloze/s-story-lastspeech/<uttid>.wav    StoryCloze/zh_story_last/<uttid>.wav
    cmmlu/cmmlu_rewrite_options/<uttid>_A.wav ... <uttid>_D.wav
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os

from s2sjax import benchmarks, modalities
from s2sjax.errors import UserError
from tasks.audio.base import folder_digest

OPTIONS = ("A", "B", "C", "D")


class ReleaseError(UserError, ValueError):
  """The release files are malformed; every problem found is listed."""


@dataclasses.dataclass(frozen=True)
class Question:
  """One decision of the benchmark: candidates (each with the prefix text and audio it follows) and the right one."""

  id: str
  language: str
  uttids: tuple[str, ...]  # per candidate: the jsonl line it came from
  prefixes: tuple[str, ...]  # per candidate: `first`
  audio_paths: tuple[str, ...]  # per candidate: the spoken `first`
  candidates: tuple[str, ...]
  correct: int
  candidate_audio_paths: tuple[str, ...] = ()  # per candidate: the spoken candidate (read only for T->S, S->S)


@dataclasses.dataclass
class Problems:
  """Problems found while reading or building; raised together, or (with skip_bad) listed. `entries` are lines or
  questions left out, `questions` the questions they leave out where a line says which (a line that is not JSON
  cannot; its partner's broken pair then does); `file_entries` concern a file as a whole and leave nothing out by
  themselves (the lines they affect are entries too), so they are counted apart."""

  entries: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  attributed: list[str] = dataclasses.field(default_factory=list)  # the question of each entry that names one
  file_entries: list[tuple[str, str]] = dataclasses.field(default_factory=list)

  def add(self, where: str, why: str, question: str | None = None) -> None:
    self.entries.append((where, why))
    if question is not None:
      self.attributed.append(question)

  @property
  def questions(self) -> set[str]:
    return set(self.attributed)

  def add_file(self, where: str, why: str) -> None:
    self.file_entries.append((where, why))

  def __bool__(self) -> bool:
    return bool(self.entries or self.file_entries)

  def __len__(self) -> int:
    return len(self.entries) + len(self.file_entries)

  def text(self, limit: int = 30) -> str:
    everything = self.file_entries + self.entries
    lines = [f"{where}: {why}" for where, why in everything[:limit]]
    more = len(everything) - limit
    return "\n  ".join(lines + ([f"... and {more} more"] if more > 0 else []))


def task_paths(task: str, release_dir: str, jsonl: str | None = None, audio_dir: str | None = None) -> tuple[str, str]:
  try:
    record = benchmarks.get(task)
  except KeyError as e:
    raise ReleaseError(e.args[0]) from None
  return (jsonl or os.path.join(release_dir, record.release_jsonl),
          audio_dir or os.path.join(release_dir, record.release_audio_dir))


def candidate_audio_dir(task: str, release_dir: str) -> str:
  return os.path.join(release_dir, benchmarks.get(task).release_candidate_audio_dir)


def spoken_candidates(task: str, line: dict) -> dict[str, str]:
  """{wav name without .wav: text} of a release line's spoken candidates, named as the readers below look for
  them: a story line's `last` as `<uttid>`, an option as `<uttid>_<A|B|C|D>`."""
  if benchmarks.get(task).release_format == "story_pairs":
    return {str(line["uttid"]): line["last"]}
  return {f"{line['uttid']}_{o}": line[o] for o in OPTIONS}


def _require(path: str) -> None:
  if not os.path.exists(path):
    raise ReleaseError(f"{path} does not exist (is --manual_dir the S2SBench release directory?)")


def _at(record: dict) -> str:
  return f"{record['where']} uttid {record['uttid']}"


def _read_lines(path: str, fields: tuple[str, ...], problems: Problems, question_of) -> list[dict]:
  """Valid lines as dicts (with `key`, the uttid's number, and `where`, file:line); every other line is a problem,
  counted against its question (`question_of(record)`) where the line says which. Lines sharing an uttid are all
  left out: which copy is right cannot be told."""
  _require(path)
  text_fields = [k for k in fields if k not in ("uttid", "answer")]
  records, lines_of = [], collections.defaultdict(list)
  with open(path, "rb") as f:  # decoded line by line: one bad line is a problem of that line, not of the file
    for number, raw in enumerate(f, 1):
      where = f"{os.path.basename(path)}:{number}"
      # the last line of a file cut short (an interrupted copy or download) has no newline and does not parse
      cut = "the file ends mid-line, this line cut short (a truncated copy?): " if not raw.endswith(b"\n") else ""
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        problems.add(where, f"{cut}not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})")
        continue
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        problems.add(where, f"{cut}not JSON ({e.msg})")
        continue
      if not isinstance(record, dict):
        problems.add(where, f"not a JSON object (got {type(record).__name__})")
        continue
      missing = [k for k in fields if k not in record]
      if missing:
        problems.add(where, f"missing field(s) {missing}")
        continue
      if isinstance(record["uttid"], bool) or not isinstance(record["uttid"], (int, str)):
        problems.add(where, f"uttid {json.dumps(record['uttid'])} is neither an integer nor a string")
        continue
      uttid = str(record["uttid"])
      try:
        key = int(uttid.split("_")[0])
      except ValueError:
        problems.add(where, f"uttid {uttid!r} does not start with an integer")
        continue
      lines_of[uttid].append(number)
      record = dict(record, uttid=uttid, key=key, where=where)
      not_text = {k: record[k] for k in text_fields if not isinstance(record[k], str)}
      if not_text:
        problems.add(_at(record), f"not text: {json.dumps(not_text, ensure_ascii=False)}", question_of(record))
        continue
      empty = [k for k in text_fields if not record[k].strip()]
      if empty:
        problems.add(_at(record), f"empty text in {empty}", question_of(record))
        continue
      records.append(record)
  kept = []
  for record in records:
    if len(lines_of[record["uttid"]]) > 1:
      problems.add(_at(record), f"duplicate uttid {record['uttid']} (lines {lines_of[record['uttid']]}): "
                                "every copy left out", question_of(record))
    else:
      kept.append(record)
  return kept


def source_fingerprint(task: str, release_dir: str, audio_dirs: tuple[str, ...] = ()) -> str:
  """A hash of what a build reads from the release: the jsonl's bytes and, of the wav folders it decodes
  (`audio_dirs`), each wav's name and bytes (contents, not times: a copied release is the same release)."""
  jsonl, _ = task_paths(task, release_dir)
  _require(jsonl)
  digest = hashlib.sha256()
  if os.path.isdir(jsonl):  # a task whose release is a folder of recordings (spoken_pairs)
    digest.update(folder_digest(jsonl, ".wav").encode())
  else:
    with open(jsonl, "rb") as f:
      digest.update(f.read())
  for audio_dir in audio_dirs:
    if os.path.isdir(audio_dir):
      digest.update(folder_digest(audio_dir, ".wav").encode())
  return digest.hexdigest()[:16]


def _story_pairs(jsonl: str, wav, candidate_wav, language: str, collect: Problems) -> list[Question]:
  """Lines 2k (right ending) and 2k+1 (wrong ending) of the same story make one question."""
  story = lambda record: f"story {record['key'] // 2}"
  records = _read_lines(jsonl, ("uttid", "first", "last"), collect, story)
  lines_of = collections.defaultdict(list)
  for r in records:
    lines_of[r["key"]].append(r)
  by_key = {}
  for key, shared in lines_of.items():
    if len(shared) == 1:
      by_key[key] = shared[0]
      continue
    for r in shared:  # which of them is the story's line cannot be told: all are left out
      collect.add(_at(r), f"its number {key} is shared by uttids {[s['uttid'] for s in shared]}: all left out",
                  story(r))
  if len(records) % 2:
    collect.add_file(os.path.basename(jsonl),
                     f"odd number of story lines ({len(records)}): every story needs 2k and 2k+1")
  questions = []
  for key in sorted(by_key):
    partner = key + 1 if key % 2 == 0 else key - 1
    if partner not in by_key:
      role = "wrong ending 2k+1" if key % 2 == 0 else "right ending 2k"
      collect.add(_at(by_key[key]), f"has no partner {partner} ({role}): broken pair", story(by_key[key]))
      continue
    if key % 2:
      continue
    right, wrong = by_key[key], by_key[partner]
    questions.append(Question(
      id=right["uttid"], language=language, uttids=(right["uttid"], wrong["uttid"]),
      prefixes=(right["first"], wrong["first"]), audio_paths=(wav(right["uttid"]), wav(wrong["uttid"])),
      candidates=(right["last"], wrong["last"]), correct=0,
      candidate_audio_paths=(candidate_wav(right["uttid"]), candidate_wav(wrong["uttid"])),
    ))
  return questions


def _multiple_choice(jsonl: str, wav, candidate_wav, language: str, collect: Problems) -> list[Question]:
  """One line per question: a prefix, options A-D and the answer's letter."""
  questions = []
  for r in _read_lines(jsonl, ("uttid", "first") + OPTIONS + ("answer",), collect, lambda record: record["uttid"]):
    answer = str(r["answer"]).strip().upper()
    if answer not in OPTIONS:
      collect.add(_at(r), f"answer {r['answer']!r} is not one of A, B, C, D", r["uttid"])
      continue
    questions.append(Question(
      id=r["uttid"], language=language, uttids=(r["uttid"],) * 4, prefixes=(r["first"],) * 4,
      audio_paths=(wav(r["uttid"]),) * 4, candidates=tuple(r[o] for o in OPTIONS),
      correct=OPTIONS.index(answer), candidate_audio_paths=tuple(candidate_wav(f"{r['uttid']}_{o}") for o in OPTIONS),
    ))
  return questions


# One reader per `release_format` of s2sjax.benchmarks.
SPOKEN_SEPARATOR = "_"  # SlamKit's storycloze() builds its dataset with sep="_"


def _spoken_number(name: str, where: str) -> int:
  head = name.split(SPOKEN_SEPARATOR)[0]
  if not head.isdigit():
    raise ReleaseError(f"{where}/{name}: a SpokenStoryCloze recording is named <n>{SPOKEN_SEPARATOR}<...>.wav, with a "
                       f"number n before the first {SPOKEN_SEPARATOR!r}")
  return int(head)


def check_asked(task: str, modality: str, protocol: str) -> None:
  """A release of whole spoken stories (spoken_pairs) has no text and no prefix recording: it is asked S->S under
  the utterance protocol only, as SlamKit scores it."""
  if benchmarks.get(task).release_format == "spoken_pairs" and (modalities.get(modality).name != "s2s"
                                                               or protocol != "utterance"):
    raise ReleaseError(f"{task} holds whole spoken stories, no text and no separate prefix: build it with "
                       f"--modality=s2s --protocol=utterance (asked: {modality}, protocol {protocol})")


def _spoken_pairs(where: str, wav, candidate_wav, language: str, collect: Problems) -> list[Question]:
  """The official spoken StoryCloze (slp-rl/SpokenStoryCloze) as SlamKit's ModellingMetricDataset reads it
  (slamkit/metric/modelling_metric.py): a folder (sSC/, tSC/) of whole spoken stories `<n>_<...>.wav`, sorted by
  the number n; question i is recording 2i (the right ending, candidate 0) against 2i+1 (the wrong one), each
  scored whole (S->S, the utterance protocol). An odd count, or two recordings of one number (their order, so
  which is right, would be the folder listing's), is refused naming the folder."""
  if not os.path.isdir(where):
    raise ReleaseError(f"{where} does not exist: a SpokenStoryCloze task reads that folder of recordings (is "
                       "--manual_dir the SpokenStoryCloze release, holding sSC/ and tSC/?)")
  numbered = sorted((_spoken_number(n, where), n) for n in os.listdir(where) if n.endswith(".wav"))
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
    questions.append(Question(id=str(i), language=language, uttids=stems, prefixes=("", ""), audio_paths=("", ""),
                              candidates=stems, correct=0,
                              candidate_audio_paths=tuple(os.path.join(where, n) for n in (right, wrong))))
  return questions


READERS = {"story_pairs": _story_pairs, "multiple_choice": _multiple_choice, "spoken_pairs": _spoken_pairs}


def read_questions(task: str, release_dir: str, jsonl: str | None = None, audio_dir: str | None = None,
                   problems: Problems | None = None) -> list[Question]:
  """Questions of one task. Problems go to `problems` when given (the caller decides), else raise at once."""
  jsonl, audio_dir = task_paths(task, release_dir, jsonl, audio_dir)
  record = benchmarks.get(task)
  collect = problems if problems is not None else Problems()
  candidates_dir = candidate_audio_dir(task, release_dir)
  questions = READERS[record.release_format](jsonl, lambda uttid: os.path.join(audio_dir, f"{uttid}.wav"),
                                             lambda name: os.path.join(candidates_dir, f"{name}.wav"),
                                             record.language, collect)
  if problems is None and collect:
    raise ReleaseError(f"{jsonl} has {len(collect)} problem(s):\n  {collect.text()}")
  return questions
