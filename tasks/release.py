"""Reads a release (as users download it) into benchmark questions, checking everything.

Where each task's files are and which layout they hold is its record in `s2sjax.data.task_registry` (its
`release_format`, a registered `ReleaseFormat`); the reader of each format, keyed by its name, is registered
here (`READERS`: this module's, or a plugin's);
S2SBench's own:

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

Every path a release names (its files and folders, each line's recordings, a folder's recordings, through any
symlink) resolves inside the release directory, or is refused naming the line: one rule, `ReleasePaths.inside`.
A text field that holds nothing but whitespace or zero-width characters is empty.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import unicodedata
from typing import Callable

from s2sjax.data import task_registry, modalities
from s2sjax.runtime.errors import UserError
from s2sjax.runtime.registry import Registry, load_object
from tasks.audio.base import folder_digest

OPTIONS = ("A", "B", "C", "D")


class ReleaseError(UserError, ValueError):
  """The release files are malformed; every problem found is listed."""


class OutsideReleaseError(ReleaseError):
  """A path a release names that resolves outside the release directory."""


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
  # What the release says of the question (a sWUGGY pair's id, voice, frequency band): what the task's record groups
  # its questions by (`averaged_over`) and breaks its accuracy down by (`breakdowns`), in the results files as given.
  labels: dict[str, str] = dataclasses.field(default_factory=dict)


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


@dataclasses.dataclass(frozen=True)
class ReleasePaths:
  """One task's files in one release directory (`root`): every path is made here, and each resolves inside the
  root (`inside`) or is refused."""

  root: str
  record: task_registry.Task

  def inside(self, relative: str, where: str | None = None) -> str:
    """`root/relative`, refused (OutsideReleaseError, naming `where`, e.g. a line) when it resolves outside the
    root: by `..`, an absolute path, or a symlink on the way."""
    path = os.path.join(self.root, relative)
    real, root = os.path.realpath(path), os.path.realpath(self.root)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
      raise OutsideReleaseError(f"{(where + ': ') if where else ''}{relative} resolves to {real}, outside the release "
                                f"{self.root}: a release names files inside it only")
    return path

  @property
  def index(self) -> str:
    """The task's jsonl (or folder of recordings)."""
    return self.inside(self.record.release_jsonl, f"task {self.record.name}'s release_jsonl")

  @property
  def audio_dir(self) -> str:
    return self.inside(self.record.release_audio_dir, f"task {self.record.name}'s release_audio_dir")

  @property
  def candidate_dir(self) -> str:
    return self.inside(self.record.release_candidate_audio_dir,
                       f"task {self.record.name}'s release_candidate_audio_dir")

  def prefix_wav(self, uttid: str) -> str:
    """The spoken prefix of a line."""
    return self.inside(os.path.join(self.record.release_audio_dir, f"{uttid}.wav"))

  def candidate_wav(self, name: str) -> str:
    """A spoken candidate (`spoken_names`' name)."""
    return self.inside(os.path.join(self.record.release_candidate_audio_dir, f"{name}.wav"))


def release_paths(task: str, release_dir: str) -> ReleasePaths:
  try:
    record = task_registry.get(task)
  except KeyError as e:
    raise ReleaseError(e.args[0]) from None
  return ReleasePaths(release_dir, record)


def task_paths(task: str, release_dir: str) -> tuple[str, str]:
  """(the task's jsonl or folder, its prefix recordings' folder) in a release."""
  paths = release_paths(task, release_dir)
  return paths.index, paths.audio_dir


def candidate_audio_dir(task: str, release_dir: str) -> str:
  return release_paths(task, release_dir).candidate_dir


def spoken_candidates(task: str, line: dict) -> dict[str, str]:
  """{wav name without .wav: text} of a release line's spoken candidates, named as its format's reader looks for
  them (none for a format without written lines)."""
  names = READERS.get(task_registry.get(task).release_format).spoken_names
  return names(line) if names else {}


def story_spoken_names(line: dict) -> dict[str, str]:
  """A story line's `last`, as `<uttid>`."""
  return {str(line["uttid"]): line["last"]}


def option_spoken_names(line: dict) -> dict[str, str]:
  """Each option, as `<uttid>_<A|B|C|D>`."""
  return {f"{line['uttid']}_{o}": line[o] for o in OPTIONS}


def is_blank(text: str) -> bool:
  """Whether a text holds nothing to read: whitespace and invisible format characters (zero-width spaces and
  joiners, byte order marks: Unicode's Cf) only."""
  return all(ch.isspace() or unicodedata.category(ch) == "Cf" for ch in text)


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
      empty = [k for k in text_fields if is_blank(record[k])]
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
  """A hash of what a build reads from the release: its index (a jsonl's bytes, or a folder's recordings and texts,
  as the task's release format says) and, of the wav folders it decodes (`audio_dirs`), each wav's name and bytes
  (contents, not times: a copied release is the same release)."""
  paths = release_paths(task, release_dir)
  index = paths.index
  _require(index)
  digest = hashlib.sha256()
  if paths.record.release.index == "folder":
    digest.update(_folder_index_digest(index).encode())
  else:
    with open(index, "rb") as f:
      digest.update(f.read())
  for audio_dir in audio_dirs:
    if os.path.isdir(audio_dir):
      digest.update(folder_digest(audio_dir, ".wav").encode())
  return digest.hexdigest()[:16]


def _folder_index_digest(index: str) -> str:
  """A folder release's recordings, and its texts where it has any, in the folder and in each folder inside it (a
  speaker's: SlamKit's `subfolder` layouts), each folder's under its name."""
  parts = [folder_digest(index, ".wav")]
  inside = sorted(n for n in os.listdir(index) if os.path.isdir(os.path.join(index, n)))
  for name, folder in [("", index)] + [(n, os.path.join(index, n)) for n in inside]:
    if name:
      parts.append(f"{name}/{folder_digest(folder, '.wav')}")
    if any(n.endswith(".txt") for n in os.listdir(folder)):
      parts.append(f"{name}/{folder_digest(folder, '.txt')}.txt")
  return "\n".join(parts)


def _question(collect: Problems, records: list[dict], key: str, make) -> Question | None:
  """`make()`, the question of these lines; one that names a path outside the release is a problem of its lines,
  the question left out."""
  try:
    return make()
  except OutsideReleaseError as e:
    for record in records:
      collect.add(_at(record), str(e), key)
    return None


def read_story_pairs(record: task_registry.Task, paths: ReleasePaths, collect: Problems) -> list[Question]:
  """Lines 2k (right ending) and 2k+1 (wrong ending) of the same story make one question."""
  jsonl = paths.index
  story = lambda line: f"story {line['key'] // 2}"
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
    question = _question(collect, [right, wrong], story(right), lambda: Question(
      id=right["uttid"], language=record.language, uttids=(right["uttid"], wrong["uttid"]),
      prefixes=(right["first"], wrong["first"]),
      audio_paths=(paths.prefix_wav(right["uttid"]), paths.prefix_wav(wrong["uttid"])),
      candidates=(right["last"], wrong["last"]), correct=0,
      candidate_audio_paths=(paths.candidate_wav(right["uttid"]), paths.candidate_wav(wrong["uttid"])),
    ))
    if question is not None:
      questions.append(question)
  return questions


def read_multiple_choice(record: task_registry.Task, paths: ReleasePaths, collect: Problems) -> list[Question]:
  """One line per question: a prefix, options A-D and the answer's letter."""
  questions = []
  for r in _read_lines(paths.index, ("uttid", "first") + OPTIONS + ("answer",), collect, lambda line: line["uttid"]):
    answer = str(r["answer"]).strip().upper()
    if answer not in OPTIONS:
      collect.add(_at(r), f"answer {r['answer']!r} is not one of A, B, C, D", r["uttid"])
      continue
    question = _question(collect, [r], r["uttid"], lambda: Question(
      id=r["uttid"], language=record.language, uttids=(r["uttid"],) * 4, prefixes=(r["first"],) * 4,
      audio_paths=(paths.prefix_wav(r["uttid"]),) * 4, candidates=tuple(r[o] for o in OPTIONS),
      correct=OPTIONS.index(answer), candidate_audio_paths=tuple(paths.candidate_wav(name)
                                                                 for name in option_spoken_names(r)),
    ))
    if question is not None:
      questions.append(question)
  return questions


def check_asked(task: str, modality: str, protocol: str) -> None:
  """A release is asked only what its format's questions hold: a folder of whole spoken stories (spoken_pairs) has
  no text and no prefix recording, so it is asked S->S under the utterance protocol only, as SlamKit scores it."""
  release = task_registry.get(task).release
  name = modalities.get(modality).name
  if name not in release.modalities or (release.protocols is not None and protocol not in release.protocols):
    how = f"--modality={','.join(release.modalities)}" + (
      f" --protocol={','.join(release.protocols)}" if release.protocols is not None else "")
    raise ReleaseError(f"{task} holds {release.summary}: build it with {how} (asked: {modality}, protocol {protocol})")


def whole_recordings(record: task_registry.Task, question_id: str, recordings: tuple[str, ...],
                     names: tuple[str, ...] | None = None, **fields) -> Question:
  """A question of whole recordings, the right one first, each scored alone (S->S, the utterance protocol): no text
  and no prefix; each candidate is named by its file's stem, or by `names` (a speaker's folder and the stem)."""
  stems = names or tuple(os.path.splitext(os.path.basename(path))[0] for path in recordings)
  return Question(id=question_id, language=record.language, uttids=stems, prefixes=("",) * len(stems),
                  audio_paths=("",) * len(stems), candidates=stems, correct=0, candidate_audio_paths=recordings,
                  **fields)


@dataclasses.dataclass(frozen=True)
class ReleaseReader:
  """How the build reads a release format (s2sjax.data.task_registry.RELEASE_FORMATS), registered under the format's
  name: `read(record, paths, problems) -> list[Question]`, every path it names resolved inside the release by
  `paths` (`ReleasePaths`), every bad line a problem naming it, or that function's "module:name" (imported when a
  release of the format is read: a reader in a module of its own builds on this one's `Question`);
  `spoken_names(line) -> {its spoken candidates' wav names: their texts}` for the tools that write a release's
  recordings (tasks.importer, the bundled sample), None for a format without written lines."""

  release_format: str
  read: Callable[[task_registry.Task, ReleasePaths, Problems], list[Question]] | str
  spoken_names: Callable[[dict], dict[str, str]] | None = None

  @property
  def reader(self) -> Callable[[task_registry.Task, ReleasePaths, Problems], list[Question]]:
    return load_object(self.read) if isinstance(self.read, str) else self.read


READERS: Registry[ReleaseReader] = Registry("release reader", name_of=lambda r: r.release_format)
register = READERS.register
register(ReleaseReader("story_pairs", read_story_pairs, story_spoken_names))
register(ReleaseReader("multiple_choice", read_multiple_choice, option_spoken_names))
register(ReleaseReader("spoken_pairs", "tasks.slamkit:read_spoken_pairs"))
# The spoken-LM neighbours' releases, each read by a module of its own.
register(ReleaseReader("prosaudit", "tasks.prosaudit:read_prosaudit"))
register(ReleaseReader("salmon", "tasks.salmon:read_salmon_part"))
register(ReleaseReader("cross_modal_pairs", "tasks.slamkit:read_cross_modal_pairs"))


def read_questions(task: str, release_dir: str, problems: Problems | None = None) -> list[Question]:
  """Questions of one task, read by its release format's reader and held to `Question`'s types (`check_questions`).
  Problems go to `problems` when given (the caller decides), else raise at once."""
  paths = release_paths(task, release_dir)
  collect = problems if problems is not None else Problems()
  read = READERS.get(paths.record.release_format).reader
  questions = check_questions(read(paths.record, paths, collect), paths.record, read)
  if problems is None and collect:
    raise ReleaseError(f"{paths.index} has {len(collect)} problem(s):\n  {collect.text()}")
  return questions


class ReaderError(ReleaseError):
  """A release format's reader (a plugin's) that gave something other than the questions of its task."""


def _question_problem(question, record: task_registry.Task) -> str | None:
  """What is wrong with one record a reader gave, as `Question`'s fields are typed (None: nothing): text where text
  is, one entry per candidate, the task's count of candidates, the right one among them."""
  if not isinstance(question, Question):
    return f"is a {type(question).__name__}, not a tasks.release.Question"
  for name in ("id", "language"):
    if not isinstance(getattr(question, name), str) or not getattr(question, name):
      return f"{name} {getattr(question, name)!r} is not a non-empty string"
  n = len(question.candidates) if isinstance(question.candidates, tuple) else None
  if n != record.candidates:
    return f"candidates {question.candidates!r} are not a tuple of the task's {record.candidates}"
  for name in ("uttids", "prefixes", "audio_paths", "candidates", "candidate_audio_paths"):
    value = getattr(question, name)
    if name == "candidate_audio_paths" and value == ():
      continue  # no spoken candidates
    if not isinstance(value, tuple) or len(value) != n or not all(isinstance(v, str) for v in value):
      return f"{name} {value!r} is not a tuple of {n} strings, one per candidate"
  if isinstance(question.correct, bool) or not isinstance(question.correct, int) or not 0 <= question.correct < n:
    return f"correct {question.correct!r} is not the index of a candidate (0 to {n - 1})"
  labels = question.labels
  if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
    return f"labels {labels!r} are not a dict of strings to strings"
  needed = [name for name in (record.averaged_over, *record.breakdowns) if name is not None and name not in labels]
  if needed:
    return f"labels {labels!r} lack {', '.join(needed)}, which task {record.name} groups or breaks its accuracy down by"
  return None


def check_questions(questions, record: task_registry.Task, read: Callable) -> list[Question]:
  """The questions a release format's reader gave, refused (one line naming the format, its reader, the first
  record that is wrong and why, and how many are) unless each is a `Question` of the types its fields say: a
  plugin's reader is held to them where its records enter, before any is tokenized."""
  reader = f"release format {record.release_format}'s reader {read.__module__}:{read.__qualname__}"
  if not isinstance(questions, list):
    raise ReaderError(f"{reader} gave a {type(questions).__name__}, not a list of questions (task {record.name})")
  wrong = [(i, why) for i, question in enumerate(questions) if (why := _question_problem(question, record))]
  if wrong:
    i, why = wrong[0]
    name = f"question {questions[i].id!r}" if isinstance(questions[i], Question) else "the record"
    raise ReaderError(f"{reader} gave {len(wrong)} malformed question(s) of task {record.name}; first {name} (record "
                      f"{i + 1} of {len(questions)}): {why}")
  return questions
