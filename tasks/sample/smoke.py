"""The smoke release: the first questions of each bundled-sample task with text, in the release layout, so that one
run of every task in every modality (`python -m s2sjax.eval --smoke`) shows in minutes that everything works.

It is written once per cache (`write_smoke_release`), whole or not at all, from the bundled sample: its jsonl lines
and only the recordings they name (each line's spoken first part, and its spoken candidates).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid

from s2sjax.data import task_registry
from tasks.release import candidate_audio_dir, spoken_candidates, task_paths
from tasks.sample import RELEASE_DIR

QUESTIONS = 2  # per task: enough for every code path (two stories, two four-option questions), not for a number


def smoke_tasks() -> list[str]:
  """The tasks of the bundled sample with text (a SpokenStoryCloze task has none: its T->T cannot be asked)."""
  return [task for task in task_registry.names()
          if task_registry.get(task).has_text and os.path.exists(task_paths(task, RELEASE_DIR)[0])]


def write_smoke_release(out_dir: str, questions: int = QUESTIONS) -> str:
  """`out_dir` holding the first `questions` of every `smoke_tasks` task (written beside and renamed into place,
  so a concurrent first run finds it whole); kept as it is when it exists. Returns `out_dir`."""
  if os.path.isdir(out_dir):
    return out_dir
  staging = f"{out_dir}.tmp-{uuid.uuid4().hex[:8]}"
  try:
    for task in smoke_tasks():
      _write_task(task, staging, questions)
    try:
      os.rename(staging, out_dir)
    except OSError:  # another run renamed its own first: the same files
      if not os.path.isdir(out_dir):
        raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return out_dir


def _write_task(task: str, out_dir: str, questions: int) -> None:
  record = task_registry.get(task)
  jsonl, audio_dir = task_paths(task, RELEASE_DIR)
  with open(jsonl, encoding="utf-8") as f:
    lines = [json.loads(line) for line in f if line.strip()][: questions * record.release.lines_per_question]
  out_jsonl, out_audio_dir = task_paths(task, out_dir)
  recordings = [(audio_dir, out_audio_dir, str(line["uttid"])) for line in lines]
  recordings += [(candidate_audio_dir(task, RELEASE_DIR), candidate_audio_dir(task, out_dir), name)
                 for line in lines for name in spoken_candidates(task, line)]
  for source, target, name in recordings:
    os.makedirs(target, exist_ok=True)
    shutil.copyfile(os.path.join(source, f"{name}.wav"), os.path.join(target, f"{name}.wav"))
  os.makedirs(os.path.dirname(out_jsonl), exist_ok=True)
  with open(out_jsonl, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
