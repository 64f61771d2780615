r"""Builds a local S2SBench replica, in the release layout, from the public raw sources, with synthesized speech.

  python -m tasks.importer --output=DIR \
      --storycloze_csv="cloze_test_test__spring2016 - cloze_test_ALL_test.csv" \
      --xstorycloze_zh=spring2016.val.zh.tsv.split_20_80_train.tsv,spring2016.val.zh.tsv.split_20_80_eval.tsv \
      --cmmlu_dir=CMMLU/data/test [--workers=CPUS] [--limit=N] [--nospeech]

* sStoryCloze: StoryCloze Spring 2016 test (CSV) -> uttid 2k = the four sentences + the right ending
  (`AnswerRightEnding`), 2k+1 = the same + the wrong one.
* tStoryCloze: the same stories, the wrong ending the right ending of another story (`topic_stories`, seed 0).
* zh-sStoryCloze: XStoryCloze zh (TSV, quoting off), the same mapping; sentences joined without spaces.
* sCMMLU: CMMLU test (67 subject CSVs) -> each question rewritten into four statements that share their first
  half (`rewrite_question`); questions that cannot be rewritten cleanly are listed with the reason and left out.
* Speech: espeak-ng (en, cmn) speaks every distinct `first` and every candidate (the spoken-candidate folders of
  tasks/release.py) at 16 kHz, in parallel, with progress, into a cache keyed by a hash of (language, text)
  (`speech_cache/`); each wav is a link to its text's clip, made afresh on every import, so re-importing into the
  same directory never pairs a line with another text's audio.

A task's jsonl is written last, once its wavs match it, and replica_report.json once every task is: SIGINT or
SIGTERM stops an import within seconds, keeping the tasks written and the clips spoken (a rerun speaks only the
rest), with one line saying so.

The public files stay where they are: this reads them by path and writes only the replica. It is a replica, not
the official release: S2SBench's own rewrites and recordings differ.
"""

from __future__ import annotations

import collections
import csv
import glob
import hashlib
import json
import multiprocessing
import os
import shutil
import signal

import numpy as np
from absl import flags

from s2sjax.data import task_registry
from s2sjax.runtime import cli
from s2sjax.runtime.errors import MissingFileError, UserError
from s2sjax.runtime.progress import Progress
from tasks.release import OPTIONS, spoken_candidates
from tasks.speech import speak

# The blank markers CMMLU questions use, in the order they are tried.
BLANKS = ("（）", "（ ）", "()", "( )", "____", "___", "__")
# Questions about "the following" options read as no statement once the options are split off.
REFERS_TO_OPTIONS = ("下列", "以下", "哪")
SPEECH_CACHE = "speech_cache"
SIGNALS = (signal.SIGINT, signal.SIGTERM)  # what s2sjax.runtime.cli turns into cli.Interrupted in the importer


class SourceFileError(UserError, ValueError):
  """A public raw source file (StoryCloze CSV, XStoryCloze TSV) whose rows are not that format's; names the line."""


STORY_COLUMNS = ("InputStoryid", *(f"InputSentence{i}" for i in range(1, 5)), "RandomFifthSentenceQuiz1",
                 "RandomFifthSentenceQuiz2", "AnswerRightEnding")


def read_stories(path: str, delimiter: str) -> list[dict]:
  """StoryCloze-format rows (CSV or TSV with quoting off) -> [{first sentences, right, wrong}]."""
  quoting = csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE
  if not os.path.isfile(path):
    raise MissingFileError(f"{path} does not exist (a StoryCloze-format {'CSV' if delimiter == ',' else 'TSV'})")
  with open(path, encoding="utf-8", newline="") as f:
    reader = csv.DictReader(f, delimiter=delimiter, quoting=quoting)
    missing = [column for column in STORY_COLUMNS if column not in (reader.fieldnames or ())]
    if missing:
      raise SourceFileError(f"{path}: its header has no {', '.join(missing)} (StoryCloze's columns: "
                            f"{', '.join(STORY_COLUMNS)})")
    rows = list(reader)
  stories = []
  for n, row in enumerate(rows, 2):
    answer = row.get("AnswerRightEnding", "").strip()
    if answer not in ("1", "2"):
      raise SourceFileError(f"{path}:{n}: AnswerRightEnding is {answer!r}, expected 1 or 2")
    endings = [row["RandomFifthSentenceQuiz1"].strip(), row["RandomFifthSentenceQuiz2"].strip()]
    right = int(answer) - 1
    stories.append({"id": row["InputStoryid"], "sentences": [row[f"InputSentence{i}"].strip() for i in range(1, 5)],
                    "right": endings[right], "wrong": endings[1 - right]})
  return stories


TOPIC_SEED = 0


def topic_stories(stories: list[dict], seed: int = TOPIC_SEED) -> list[dict]:
  """tStoryCloze (TWIST, Hassid et al. 2023; slp-rl/SpokenStoryCloze README: "we randomly sample the negative
  ending sentence from the dataset"): each story's wrong ending replaced by the right ending of another story,
  drawn uniformly among the others with a fixed seed, so every import draws the same."""
  rng = np.random.default_rng(seed)
  topical = []
  for k, story in enumerate(stories):
    other = int(rng.integers(0, len(stories) - 1))
    other += other >= k  # any story but this one
    topical.append(dict(story, wrong=stories[other]["right"]))
  return topical


def story_lines(stories: list[dict], joiner: str) -> list[dict]:
  lines = []
  for k, story in enumerate(stories):
    first = joiner.join(story["sentences"])
    lines.append({"uttid": 2 * k, "first": first, "last": story["right"], "story_id": story["id"]})
    lines.append({"uttid": 2 * k + 1, "first": first, "last": story["wrong"], "story_id": story["id"]})
  return lines


def rewrite_question(question: str, options: list[str]) -> tuple[str, list[str]] | str:
  """(first half, four continuations) or the reason the question cannot be rewritten.

  Rule: with one blank marker, the first half is the text before it and each continuation is the option followed
  by the text after it ("水在（）沸腾" -> "水在" + "一百度沸腾"); without a marker, the question is the first half and
  each option its continuation. Refused: several blanks, a blank at the very start (no first half), a question
  that asks (ends in ？) or points at the options (下列 / 以下 / 哪) since no statement continues it, empty options,
  or options that repeat."""
  question = question.strip()
  options = [str(o).strip() for o in options]
  if any(not o for o in options):
    return "an empty option"
  if any(word in question for word in REFERS_TO_OPTIONS):
    return "refers to the options (下列/以下/哪)"
  if len(set(options)) < len(options):
    return "repeated options"
  for blank in BLANKS:
    count = question.count(blank)
    if count > 1:
      return f"{count} blanks"
    if count == 1:
      before, after = question.split(blank)
      before = before.rstrip()
      if not before:
        return "the blank opens the question (no first half)"
      return before, [option + after for option in options]
  if not question:
    return "an empty question"
  if question.endswith(("？", "?")):
    return "a question with no blank (ends in ？)"
  return question, options


def read_cmmlu(directory: str) -> tuple[list[dict], collections.Counter, list[dict]]:
  """All subjects' test questions rewritten; (lines without uttids, reasons counted, the left-out list)."""
  files = sorted(glob.glob(os.path.join(directory, "*.csv")))
  if not files:
    raise MissingFileError(f"{directory} holds no CMMLU *.csv files")
  kept, reasons, left_out = [], collections.Counter(), []
  for path in files:
    subject = os.path.basename(path)[: -len(".csv")]
    with open(path, encoding="utf-8", newline="") as f:
      for row in csv.DictReader(f):
        answer = row["Answer"].strip()
        rewritten = rewrite_question(row["Question"], [row[o] for o in OPTIONS])
        if answer not in OPTIONS:
          rewritten = f"answer {answer!r}"
        if isinstance(rewritten, str):
          reasons[rewritten] += 1
          left_out.append({"subject": subject, "row": row[""], "reason": rewritten})
          continue
        first, continuations = rewritten
        kept.append({"first": first, **dict(zip(OPTIONS, continuations)), "answer": answer,
                     "subject": subject, "row": row[""]})
  return kept, reasons, left_out


def clip_path(output: str, language: str, text: str) -> str:
  """Where the speech of `text` is cached: named by its content, so a changed text never finds old audio."""
  digest = hashlib.sha256(f"{language}\n{text}".encode()).hexdigest()[:32]
  return os.path.join(output, SPEECH_CACHE, f"{digest}.wav")


def _speak(job: tuple[str, str, str]) -> tuple[str, float, bool]:
  """(clip, seconds, whether it was synthesized now); a clip already cached is reused."""
  text, language, path = job
  synthesized = not os.path.exists(path)
  if synthesized:
    partial = f"{path[: -len('.wav')]}.{os.getpid()}.partial.wav"  # sox picks the format by extension
    # the pool's terminate (SIGTERM) waits for the clip under way: an espeak-ng / sox cut off from this process
    # would go on and write its files after they were cleaned up
    held = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    try:
      speak(text, language, partial)
      os.replace(partial, path)  # a clip is complete or absent, even after an interrupted import
    finally:
      signal.signal(signal.SIGTERM, previous)
      if os.path.exists(partial):
        os.remove(partial)
    if held:
      os._exit(128 + held[0])  # what SIGTERM does to an idle synthesis process, now that the clip is whole
  import soundfile

  return path, soundfile.info(path).duration, synthesized


def _speech_worker() -> None:
  """A synthesis process leaves SIGINT (Ctrl-C reaches the whole process group) to the importer, which stops the
  pool; SIGTERM (the pool's terminate) ends it at once, as it ends any pool's workers, or once the clip under way
  is spoken (_speak), not by an exception: one raised in a GC callback is only printed, and the process would go
  on waiting for work. It starts with both signals blocked (synthesize) and unblocks them once they are set."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def synthesize(jobs: list[tuple[str, str, str]], workers: int, description: str = "speech"
               ) -> tuple[dict[str, float], int]:
  """Speaks every (text, language, path) job not cached yet; returns every clip's duration and how many were
  synthesized now, with a progress bar (utterances, seconds of audio per second, ETA)."""
  durations, synthesized = {}, 0
  progress = Progress(len(jobs), description, unit="utterances", rate_unit="audio s")
  # blocked while the pool forks, so no worker meets a signal before _speech_worker has set its handlers
  held = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
  try:
    pool = multiprocessing.Pool(workers, initializer=_speech_worker)
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, held)
  with pool:
    for path, seconds, new in pool.imap_unordered(_speak, jobs, chunksize=4):
      durations[path] = seconds
      synthesized += new
      progress.update(1, seconds)
  return durations, synthesized


def _link_audio(output: str, audio_dir: str, texts: dict[str, str], language: str) -> tuple[int, int]:
  """Points each `<name>.wav` of `texts` ({name: text}) at its text's cached clip, replacing whatever was there;
  removes the wavs of names without a clip and of names no longer wanted. Returns (linked, removed)."""
  linked, removed = 0, 0
  for name, text in texts.items():
    path, clip = os.path.join(audio_dir, f"{name}.wav"), clip_path(output, language, text)
    if os.path.lexists(path):
      os.remove(path)
      removed += not os.path.exists(clip)
    if os.path.exists(clip):
      try:
        os.link(clip, path)
      except OSError:  # a filesystem without hard links
        shutil.copyfile(clip, path)
      linked += 1
  for name in sorted(os.listdir(audio_dir)):
    if name.endswith(".wav") and name[: -len(".wav")] not in texts:
      os.remove(os.path.join(audio_dir, name))
      removed += 1
  return linked, removed


def _cache_previous_audio(output: str, jsonl: str, audio_dir: str, language: str) -> int:
  """Moves the wavs of an earlier import that kept no speech cache into the cache under the texts they were spoken
  from, so a re-import keeps the ones that still match rather than deleting or re-speaking them."""
  if not (os.path.isfile(jsonl) and os.path.isdir(audio_dir)):
    return 0
  os.makedirs(os.path.join(output, SPEECH_CACHE), exist_ok=True)
  moved = 0
  with open(jsonl, encoding="utf-8") as f:
    for line in map(json.loads, f):
      path, clip = os.path.join(audio_dir, f"{line['uttid']}.wav"), clip_path(output, language, line["first"])
      if os.path.isfile(path) and not os.path.exists(clip):
        os.replace(path, clip)
        moved += 1
  return moved


def write_task(output: str, task: str, lines: list[dict], speech: bool, workers: int) -> dict:
  """Writes one task's jsonl and wavs: the spoken prefixes and the spoken candidates (tasks/release.py's layout);
  lines sharing a text share one clip. Without speech, wavs already in the output are relinked to the cached clips
  of the new texts, and removed where there is none."""
  record = task_registry.get(task)
  jsonl = os.path.join(output, record.release_jsonl)
  folders = {  # audio folder -> {wav name: text}
    os.path.join(output, record.release_audio_dir): {str(line["uttid"]): line["first"] for line in lines},
    os.path.join(output, record.release_candidate_audio_dir):
      {name: text for line in lines for name, text in spoken_candidates(task, line).items()},
  }
  _cache_previous_audio(output, jsonl, os.path.join(output, record.release_audio_dir), record.language)
  if os.path.exists(jsonl):  # written again last, once the wavs match it: a task cut short has none
    os.remove(jsonl)
  report = {"lines": len(lines)}
  if not speech:
    for role, (audio_dir, texts) in zip(("wavs", "candidate_wavs"), folders.items()):
      if os.path.isdir(audio_dir):
        report[role], report[f"stale_{role}_removed"] = _link_audio(output, audio_dir, texts, record.language)
    _write_lines(jsonl, lines)
    return report
  os.makedirs(os.path.join(output, SPEECH_CACHE), exist_ok=True)
  clips = {clip_path(output, record.language, text): text for texts in folders.values() for text in texts.values()}
  durations, synthesized = synthesize([(text, record.language, clip) for clip, text in clips.items()], workers,
                                      f"{task} speech")
  report.update(distinct_utterances=len(clips), synthesized=synthesized)
  for role, (audio_dir, texts) in zip(("wavs", "candidate_wavs"), folders.items()):
    os.makedirs(audio_dir, exist_ok=True)
    report[role], report[f"stale_{role}_removed"] = _link_audio(output, audio_dir, texts, record.language)
  seconds = np.array([durations[clip_path(output, record.language, line["first"])] for line in lines])
  chars = np.array([len(line["first"]) for line in lines])
  report.update(audio_hours=round(sum(durations.values()) / 3600, 3),
                seconds_per_character={"min": round(float((seconds / chars).min()), 4),
                                       "median": round(float(np.median(seconds / chars)), 4),
                                       "max": round(float((seconds / chars).max()), 4)})
  _write_lines(jsonl, lines)
  return report


def _write_lines(path: str, lines: list[dict]) -> None:
  """The task's jsonl, whole or not at all (written beside it, then renamed)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  partial = f"{path}.{os.getpid()}.partial"
  try:
    with open(partial, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    os.replace(partial, path)
  finally:
    if os.path.exists(partial):
      os.remove(partial)


REPORT = "replica_report.json"


def import_all(output: str, storycloze_csv: str | None, xstorycloze_zh: list[str], cmmlu_dir: str | None,
               speech: bool = True, workers: int = 2, limit: int | None = None) -> dict:
  """Writes the tasks whose sources are given, then replica_report.json (removed first: it describes a finished
  import, and a task cut short leaves no jsonl). SIGINT / SIGTERM (cli.Interrupted) keep the tasks written and
  the clips spoken, and the interruption's line says which."""
  report = {"note": "a local replica built from public sources, not the official S2SBench release"}
  if os.path.exists(os.path.join(output, REPORT)):
    os.remove(os.path.join(output, REPORT))
  task = None
  try:
    if storycloze_csv:
      stories = read_stories(storycloze_csv, ",")[:limit]
      task = "sstorycloze"
      report[task] = dict(write_task(output, task, story_lines(stories, " "), speech, workers), pairs=len(stories))
      task = "tstorycloze"
      report[task] = dict(write_task(output, task, story_lines(topic_stories(stories), " "), speech, workers),
                          pairs=len(stories), seed=TOPIC_SEED)
    if xstorycloze_zh:
      stories = [s for path in xstorycloze_zh for s in read_stories(path, "\t")][:limit]
      task = "zh_sstorycloze"
      report[task] = dict(write_task(output, task, story_lines(stories, ""), speech, workers), pairs=len(stories))
    if cmmlu_dir:
      kept, reasons, left_out = read_cmmlu(cmmlu_dir)
      kept = kept[:limit]
      lines = [dict(line, uttid=k) for k, line in enumerate(kept)]
      task = "scmmlu"
      written = write_task(output, task, lines, speech, workers)
      _write_lines(os.path.join(output, "cmmlu", "left_out.jsonl"), left_out)
      report[task] = dict(written, questions_kept=len(kept), questions_left_out=len(left_out),
                          left_out_reasons=dict(reasons))
  except cli.Interrupted as e:
    e.message = _interrupted_line(e.signum, output, [t for t in report if t != "note"],
                                  task if task not in report else None)
    raise
  with open(os.path.join(output, REPORT), "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2, ensure_ascii=False)
  return report


def _interrupted_line(signum: int, output: str, complete: list[str], unfinished: str | None) -> str:
  """What an interrupted import keeps: the tasks written in full and every clip spoken (complete or absent)."""
  cache = os.path.join(output, SPEECH_CACHE)
  clips = sum(not name.endswith(".partial.wav") for name in os.listdir(cache)) if os.path.isdir(cache) else 0
  tasks = f"the tasks written in full ({', '.join(complete)}) and " if complete else ""
  left = f"; {unfinished} was not finished" if unfinished else ""
  return (f"interrupted by {signal.Signals(signum).name}: kept {tasks}the {clips} spoken clips in {cache}{left}; "
          "rerun the same command to go on (spoken clips are reused)")


def main(argv):
  del argv
  FLAGS = flags.FLAGS
  report = import_all(FLAGS.output, FLAGS.storycloze_csv, FLAGS.xstorycloze_zh, FLAGS.cmmlu_dir, FLAGS.speech,
                      FLAGS.workers, FLAGS.limit)
  print(json.dumps(report, indent=2, ensure_ascii=False))


if __name__ == "__main__":
  flags.DEFINE_string("output", None, "Directory for the replica (release layout).", required=True)
  flags.DEFINE_string("storycloze_csv", None, "StoryCloze Spring 2016 test CSV.")
  flags.DEFINE_list("xstorycloze_zh", [], "XStoryCloze zh TSV file(s), e.g. its train and eval splits.")
  flags.DEFINE_string("cmmlu_dir", None, "CMMLU data/test directory (67 subject CSVs).")
  flags.DEFINE_bool("speech", True, "Synthesize the spoken first halves and candidates (espeak-ng, sox).")
  flags.DEFINE_integer("workers", max(1, (os.cpu_count() or 2)), "Parallel speech synthesis processes.")
  flags.DEFINE_integer("limit", None, "Only the first N stories / questions of each task (for a quick look).")
  cli.run(main)
