"""A ZeroSpeech 2021 submission folder (sLM21's lexical and syntactic tasks) written from an s2sjax output directory,
laid out as zerospeech-benchmarks 0.9.4 (`zrc`) loads, validates and scores it (file:line of its sdist, under
`zerospeech/`):

    DIR/meta.yaml           the submission's description (submissions/_model/meta_file.py:127-135's fields)
    DIR/lexical/dev.txt     `<filename> <score>` per sWUGGY recording (submissions/sLM21.py:550-555)
    DIR/syntactic/dev.txt   the same per sBLIMP recording (sLM21.py:557-563)

(`test.txt` from the `_test` tasks.) zrc requires exactly the dataset's recordings, each once, with a float score
(sLM21.py:34-59, 213-238), in any order (it aligns them to gold.csv by name, keeping the gold's order:
tasks/lm/lexical.py:37, tasks/lm/syntactic.py:66), and writes its own params.yaml when there is none
(sLM21.py:544-545). A recording's score
is minus its loss as the task forms it (`s2sjax.data.metrics.candidate_loss`: sWUGGY's and sBLIMP's summed NLL, so
the score is the recording's log-probability: higher, more probable, as zrc compares them, tasks/lm/lexical.py:79-82),
written in full (`repr`), so that zrc's comparisons, ties included, are s2sjax's own.
"""

from __future__ import annotations

import datetime
import json
import os

import yaml
from etils import epath

from s2sjax.data import task_registry
from s2sjax.data.metrics import candidate_loss
from s2sjax.data.questions import QuestionScores
from s2sjax.results.reports import SCORES_SUFFIX
from s2sjax.runtime.errors import UserError
from s2sjax.runtime.output_dir import write_atomic

# zrc's task folder -> the s2sjax task of each split
TASKS = {"lexical": "swuggy", "syntactic": "sblimp"}
SPLITS = ("dev", "test")


class SubmissionError(UserError, ValueError):
  """An output directory that does not hold what a ZeroSpeech submission needs."""


def task_of(folder: str, split: str) -> str:
  return TASKS[folder] + ("" if split == "dev" else f"_{split}")


def recording_scores(scores: QuestionScores, task: str) -> dict[str, float]:
  """{recording (its gold filename): score} of a task's scores, each recording once."""
  loss = candidate_loss(task_registry.get(task), scores)
  result: dict[str, float] = {}
  for q, names in enumerate(scores.uttids):
    for c, name in enumerate(names):
      if name in result:
        raise SubmissionError(f"recording {name} is scored twice in {task}'s scores (questions of one release "
                              "name each recording once)")
      result[name] = -float(loss[q, c])
  return result


def _scores(run_dir: epath.Path, task: str, modality: str) -> QuestionScores:
  path = run_dir / f"{task}-{modality}{SCORES_SUFFIX}"
  if not path.exists():
    raise SubmissionError(f"{path} does not exist: score {task} into this output directory first (python -m "
                          f"s2sjax.eval --task={task} --modality=s2s --protocol=utterance ...)")
  lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
  return QuestionScores.from_lines(lines, where=str(path))


def meta(checkpoint: str, modality: str) -> dict:
  """meta.yaml's fields (meta_file.py:36-45, 93-97, 127-135), what s2sjax knows filled in and the rest left for the
  submitter (zrc's upload asks for them; its scoring does not read them)."""
  return {
    "username": None, "submission_id": None, "benchmark_name": "sLM21",
    "model_info": {"model_id": None, "train_set": "", "gpu_budget": None,
                   "system_description": f"{checkpoint}, scored by s2sjax ({modality}): a recording's score is its "
                                         "log-probability"},
    "publication": {"author_label": "", "authors": "", "paper_title": None, "paper_url": None,
                    "publication_year": datetime.date.today().year, "bib_reference": None, "DOI": None,
                    "institution": "", "team": None},
    "open_source": False, "code_url": None,
  }


def write_submission(output_dir: str, submission_dir: str, checkpoint: str | None = None,
                     modality: str = "s2s_utterance", splits: tuple[str, ...] = ("dev",)) -> list[str]:
  """The submission of one checkpoint's scores in `output_dir` (its folder name; the only one when None), for
  `splits`; returns the files written."""
  out = epath.Path(output_dir)
  folders = sorted(p.parent.name for p in out.glob("*/run.json"))
  if not folders:
    raise SubmissionError(f"{output_dir} holds no run (no <checkpoint>/run.json): score sWUGGY and sBLIMP into it with "
                          "s2sjax.eval first")
  if checkpoint is None:
    if len(folders) != 1:
      raise SubmissionError(f"{output_dir} holds the runs {', '.join(folders)}: name one with --checkpoint")
    checkpoint = folders[0]
  elif checkpoint not in folders:
    raise SubmissionError(f"{output_dir} holds no run {checkpoint!r} (runs: {', '.join(folders)})")
  written = []
  for folder in TASKS:
    for split in splits:
      task = task_of(folder, split)
      lines = "".join(f"{name} {score!r}\n" for name, score in
                      recording_scores(_scores(out / checkpoint, task, modality), task).items())
      path = os.path.join(submission_dir, folder, f"{split}.txt")
      os.makedirs(os.path.dirname(path), exist_ok=True)
      write_atomic(path, lines.encode())
      written.append(path)
  path = os.path.join(submission_dir, "meta.yaml")
  write_atomic(path, yaml.safe_dump(meta(checkpoint, modality), sort_keys=False).encode())
  return written + [path]
