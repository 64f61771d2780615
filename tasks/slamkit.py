"""SlamKit's StoryCloze layouts (slp-rl/slamkit 388b402), read as its datasets read them: the official spoken
StoryCloze's folders of whole stories (slp-rl/SpokenStoryCloze: sSC/, tSC/), the multi-speaker folders of such
folders (ms_sSC/, ms_tSC/) and the cross-modal stories (cross_ms_tSC/), registered in tasks/release.py as the
readers of the `spoken_pairs` and `cross_modal_pairs` release formats. Every rule cites SlamKit's file and line;
where SlamKit passes silently (an odd count, a stray file), the layout is refused naming the file or folder.
"""

from __future__ import annotations

import os

from s2sjax.data import task_registry
from tasks.release import Problems, Question, ReleaseError, ReleasePaths, is_blank, whole_recordings

# SlamKit's datasets read a folder of recordings, or with the metric config's `subfolder: true` (config/metric/
# ms_ssc.yaml, ms_tsc.yaml, cm_ms_tsc.yaml) each folder directly inside it (slamkit/metric/modelling_metric.py:16-21,
# slamkit/metric/cross_modal_metric.py:18-23), never both: which one a task's folder is, is read from it here, and a
# folder holding a story's files beside folders is refused.
SPOKEN_SEPARATOR = "_"  # storycloze() builds its dataset with sep="_" (modelling_metric.py:137)


def _slamkit_folders(where: str, what: str) -> list[tuple[str, str]]:
  """(name relative to `where`, path) of each folder of recordings: `where` itself, or its subfolders sorted by
  name (SlamKit walks them in the file system's order, `Path.iterdir`; the order decides nothing but the questions'
  order: each pairs within its own folder)."""
  if not os.path.isdir(where):
    raise ReleaseError(f"{where} does not exist: a {what} task reads that folder of recordings (is --manual_dir the "
                       "release that holds it?)")
  entries = sorted(os.listdir(where))
  folders = [n for n in entries if os.path.isdir(os.path.join(where, n))]
  loose = [n for n in entries if n.endswith((".wav", ".txt")) and not os.path.isdir(os.path.join(where, n))]
  if folders and loose:
    raise ReleaseError(f"{where}/{loose[0]}: a story's file beside the folders {folders[:3]}: SlamKit reads either "
                       "the files of a folder or those of its subfolders (its `subfolder` setting), never both")
  return [(n, os.path.join(where, n)) for n in folders] if folders else [("", where)]


def _spoken_number(name: str, where: str) -> int:
  head = name.split(SPOKEN_SEPARATOR)[0]
  if not head.isdigit():
    raise ReleaseError(f"{where}/{name}: a SpokenStoryCloze recording is named <n>{SPOKEN_SEPARATOR}<...>.wav, with a "
                       f"number n before the first {SPOKEN_SEPARATOR!r}")
  return int(head)


def _numbered_pairs(where: str) -> list[tuple[str, str]]:
  """One folder's recordings as ModellingMetricDataset pairs them: sorted by the number before the first `_`
  (modelling_metric.py:19-21), recording 2i the positive, 2i+1 the negative (:26-27)."""
  numbered = sorted((_spoken_number(n, where), n) for n in os.listdir(where) if n.endswith(".wav"))
  for (a, first), (b, second) in zip(numbered, numbered[1:]):
    if a == b:
      raise ReleaseError(f"{where}: {first} and {second} share the number {a}, so which is the right ending cannot "
                         "be told (recordings are numbered one by one: 2i right, 2i+1 wrong)")
  names = [n for _, n in numbered]
  if not names:
    raise ReleaseError(f"{where} holds no .wav recording")
  if len(names) % 2:  # SlamKit's len() // 2 drops the last one silently (:23-24); with subfolders it pairs across
    raise ReleaseError(f"{where} holds {len(names)} recordings: an odd count leaves {names[-1]} without its pair "
                       "(recordings 2i and 2i+1, sorted by their number, are one story's right and wrong telling)")
  return [(names[2 * i], names[2 * i + 1]) for i in range(len(names) // 2)]


def read_spoken_pairs(record: task_registry.Task, paths: ReleasePaths, collect: Problems) -> list[Question]:
  """The official spoken StoryCloze (slp-rl/SpokenStoryCloze) as SlamKit's ModellingMetricDataset reads it
  (slamkit/metric/modelling_metric.py:12-30): a folder (sSC/, tSC/) of whole spoken stories `<n>_<...>.wav`, or a
  folder of such folders (the multi-speaker ms_sSC/, ms_tSC/), each sorted by the number n; question i is the
  i-th pair, recording 2i (the right ending, candidate 0) against 2i+1 (the wrong one), each scored whole (S->S,
  the utterance protocol). An odd count, or two recordings of one number (their order, so which is right, would
  be the folder listing's), is refused naming the folder. Each question is labelled with its folder (`folder`: the
  speaker's, or the task folder's own name), which the multi-speaker tasks break their accuracy down by."""
  questions = []
  for folder, where in _slamkit_folders(paths.index, "SpokenStoryCloze"):
    for right, wrong in _numbered_pairs(where):
      recordings = tuple(paths.inside(os.path.join(record.release_jsonl, folder, n), f"{where}/{n}")
                         for n in (right, wrong))
      names = tuple(os.path.join(folder, os.path.splitext(n)[0]) for n in (right, wrong))
      questions.append(whole_recordings(record, str(len(questions)), recordings, names,
                                        labels={"folder": folder or os.path.basename(where)}))
  return questions


# SlamKit's cross-modal StoryCloze (CrossModalMetricDataset, slamkit/metric/cross_modal_metric.py:14-62): per story
# `<base>_mutual` (the first four sentences), `<base>_correct` and `<base>_incorrect` (the endings), each a .wav and
# its .txt; the stories are the `*_correct.wav` files (:21-23), the text each .txt's stripped contents (:33-35).
CROSS_MODAL_PARTS = ("mutual", "correct", "incorrect")


def _cross_modal_stories(where: str) -> list[str]:
  """The bases of one folder's stories, sorted; a file of the folder that is none of a story's six is refused
  naming it (SlamKit would pass over it, and a story whose ending it is would be missing)."""
  names = sorted(os.listdir(where))
  bases = [n[: -len("_correct.wav")] for n in names if n.endswith("_correct.wav")]
  expected = {f"{b}_{part}{ext}" for b in bases for part in CROSS_MODAL_PARTS for ext in (".wav", ".txt")}
  stray = [n for n in names if n not in expected and n.endswith((".wav", ".txt"))]
  if stray:
    raise ReleaseError(f"{where}/{stray[0]}: not one of a story's files <base>_{{mutual,correct,incorrect}}."
                       f"{{wav,txt}} of a <base>_correct.wav in the folder ({len(stray)} such file(s))")
  missing = sorted(expected - set(names))
  if missing:
    raise ReleaseError(f"{where}/{missing[0]} is missing: every story <base>_correct.wav comes with "
                       f"<base>_{{mutual,correct,incorrect}}.{{wav,txt}} ({len(missing)} file(s) missing)")
  if not bases:
    raise ReleaseError(f"{where} holds no <base>_correct.wav story")
  return bases


def _story_text(path: str, collect: Problems, story: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read().strip()
  except UnicodeDecodeError as e:
    collect.add(path, f"not UTF-8 text ({e.reason} at byte {e.start})", story)
    return ""
  if is_blank(text):
    collect.add(path, "empty text", story)
  return text


def read_cross_modal_pairs(record: task_registry.Task, paths: ReleasePaths, collect: Problems) -> list[Question]:
  """SlamKit's cross-modal StoryCloze: a story's prefix is its `_mutual` recording and text, its candidates the
  `_correct` (candidate 0) and `_incorrect` endings, spoken and written, so every modality can be asked. Under the
  utterance protocol (S->S) prefix and ending are one recording, their waves joined before the audio tokenizer
  runs, as SlamKit joins them when both are speech (:55-58). Labelled with its folder, as `read_spoken_pairs`'."""
  questions = []
  for folder, where in _slamkit_folders(paths.index, "cross-modal StoryCloze"):
    for base in _cross_modal_stories(where):
      story = os.path.join(folder, base)
      file = lambda part, ext: paths.inside(os.path.join(record.release_jsonl, folder, f"{base}_{part}{ext}"),
                                            f"story {story}")
      texts = [_story_text(file(part, ".txt"), collect, story) for part in CROSS_MODAL_PARTS]
      if any(is_blank(t) for t in texts):
        continue
      prompt, right, wrong = texts
      questions.append(Question(
        id=story, language=record.language, uttids=(f"{story}_correct", f"{story}_incorrect"),
        prefixes=(prompt, prompt), audio_paths=(file("mutual", ".wav"),) * 2, candidates=(right, wrong), correct=0,
        candidate_audio_paths=(file("correct", ".wav"), file("incorrect", ".wav")),
        labels={"folder": folder or os.path.basename(where)}))
  return questions
