"""zerospeech-benchmarks 0.9.4 (`zrc`) run as the judge of an sLM21 submission, offline, in a virtual environment of
its own (never the project's), built once under the project's cache ($S2SJAX_CACHE/zrc-0.9.4-venv). File:line is of
the 0.9.4 sdist, under `zerospeech/`.

What it takes: Python <= 3.11 with `pydantic<2` (its settings and models are pydantic 1's: settings.py:12-20) and
pandas 2.0 with numpy 1.25 (it does not pin pandas, and under pandas 3 its lexical scoring raises TypeError and its
syntactic scoring IndexError); `APP_DIR` (settings.py:88) holding `repo.json` that lists `sLM21-dataset`
(generics/repository.py:71-75, 183-190) and is older than 7 days, else `import zerospeech` asks the network for a
newer one (startup.py:28-29, networkio.py:32-61); and `datasets/sLM21-dataset/index.json` (datasets/_model.py:63-74)
naming the gold files and the recordings (it never opens a wav: validation reads their names, scoring gold.csv and
the scores). `zrc submission:verify` fails on 0.9.4; validation runs inside `zrc benchmarks:run`
(cmd/benchmarks.py:77-84), which writes its figures as CSVs into the submission's `scores/` (tasks/lm/lexical.py:
173-189, tasks/lm/syntactic.py:111-119).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time

from s2sjax.runtime.cache import cache_dir

PACKAGES = ("zerospeech-benchmarks==0.9.4", "pydantic<2", "pandas>=2.0,<2.1", "numpy>=1.25,<1.26")
WEEK = 7 * 24 * 3600


class Unreachable(Exception):
  """pip could not reach the package registry: the judge cannot be installed here."""


def python() -> str:
  """The Python of the judge's environment, built once (`.complete` is written last: a build cut short is redone)."""
  venv = os.path.join(cache_dir(), "zrc-0.9.4-venv")
  program = os.path.join(venv, "bin", "python")
  if os.path.exists(os.path.join(venv, ".complete")):
    return program
  shutil.rmtree(venv, ignore_errors=True)
  subprocess.run([sys.executable, "-m", "venv", venv], check=True)
  pip = subprocess.run([program, "-m", "pip", "install", "-q", *PACKAGES], capture_output=True, text=True)
  if pip.returncode:
    shutil.rmtree(venv, ignore_errors=True)
    if any(word in pip.stderr for word in ("NewConnectionError", "Network is unreachable", "Temporary failure in name "
                                           "resolution", "No matching distribution")):
      raise Unreachable(pip.stderr.strip().splitlines()[-1])
    raise RuntimeError(f"pip install {' '.join(PACKAGES)} failed:\n{pip.stderr}")
  open(os.path.join(venv, ".complete"), "w").close()
  return program


def app_dir(root: str, release: str, splits: tuple[str, ...] = ("dev",)) -> str:
  """An APP_DIR under `root` whose sLM21-dataset is the release at `release` (absolute paths in its index)."""
  dataset = os.path.join(root, "datasets", "sLM21-dataset")
  os.makedirs(dataset)
  subsets = {}
  for task in ("lexical", "syntactic"):
    for split in splits:
      folder = os.path.join(os.path.abspath(release), task, split)
      subsets[f"{task}_{split}"] = {"items": {
        "gold": {"item_type": "file_item", "file_type": "csv", "relative_path": False,
                 "file": os.path.join(folder, "gold.csv")},
        "wav_list": {"item_type": "filelist_item", "file_type": "wav", "relative_path": False,
                     "files_list": sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".wav"))},
      }}
  with open(os.path.join(dataset, "index.json"), "w") as f:
    json.dump({"subsets": subsets}, f)
  repo = os.path.join(root, "repo.json")
  with open(repo, "w") as f:
    json.dump({"last_modified": "2023-01-01T00:00:00", "checkpoints": [], "samples": [], "datasets": [
      {"name": "sLM21-dataset", "type": "internal", "zip_url": "https://download.zerospeech.com/sLM21-dataset.zip",
       "md5sum": "", "total_size": 0}]}, f)
  old = time.time() - 2 * WEEK
  os.utime(repo, (old, old))
  return root


def judge(submission: str, app: str) -> dict[str, list[dict]]:
  """`zrc benchmarks:run sLM21 SUBMISSION -t lexical syntactic -s dev` offline; {its scores CSV's name: rows}."""
  run = subprocess.run([python(), "-m", "zerospeech", "benchmarks:run", "sLM21",
                        submission, "-t", "lexical", "syntactic", "-s", "dev"],
                       env={**os.environ, "APP_DIR": app, "PYTHONPATH": ""}, capture_output=True, text=True,
                       timeout=300)
  if run.returncode:
    raise RuntimeError(f"zrc benchmarks:run failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
  scores = os.path.join(submission, "scores")
  result = {}
  for name in sorted(os.listdir(scores)):
    with open(os.path.join(scores, name), newline="") as f:
      result[name] = list(csv.DictReader(f))
  return result
