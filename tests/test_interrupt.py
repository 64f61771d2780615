"""SIGINT (Ctrl-C) or SIGTERM to a running `s2sjax.eval` keeps what is complete, summarizes it, releases the
lock, and a rerun scores only the rest, ending with the files of an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from s2sjax.output_dir import LOCK_NAME
from s2sjax.task_data import load_task_data
from tasks.preparation import prepare
from tests.eval_fixtures import same_tree, tiny_checkpoint

pytestmark = pytest.mark.slow  # builds a task of the sample and runs evaluations as subprocesses


@pytest.fixture(scope="module")
def setup(tmp_path_factory, qwen_tokenizer_dir):
  root = tmp_path_factory.mktemp("interrupt")
  ckpt = tiny_checkpoint(str(root), qwen_tokenizer_dir)
  data_dir = str(root / "data")
  for modality in ("t2t", "s2t"):
    prepare("scmmlu", "demo", modality, 1024, data_dir, tokenizer_dir=qwen_tokenizer_dir)
  reference = str(root / "reference")  # an uninterrupted run's files
  subprocess.run(_command({"ckpt": ckpt, "data_dir": data_dir}, reference), check=True, capture_output=True,
                 timeout=600)
  return {"ckpt": ckpt, "data_dir": data_dir, "reference": reference}


def _command(setup, out):
  return [sys.executable, "-m", "s2sjax.eval", "--task=scmmlu", "--modality=t2t,s2t", f"--checkpoint={setup['ckpt']}",
          f"--data_dir={setup['data_dir']}", f"--output_dir={out}", "--batch_size=1", "--chunk_rows=1",
          "--row_length=1024"]


def _wait_for(path, process, limit_s=600):
  """Polls for `path` while `process` runs (a generous bound, not a measurement)."""
  deadline = time.monotonic() + limit_s
  while not os.path.exists(path):
    assert process.poll() is None, process.communicate()
    assert time.monotonic() < deadline, f"{path} never appeared"
    time.sleep(0.05)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_keeps_finished_chunks_summarizes_and_resumes(setup, tmp_path, signum):
  reference, out = setup["reference"], str(tmp_path / "interrupted")
  process = subprocess.Popen(_command(setup, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  speech_chunks = os.path.join(out, "chunks", "ckpt-100", "scmmlu-s2t")
  _wait_for(os.path.join(speech_chunks, "chunk-00000.npz"), process)  # T->T is complete, S->T under way
  process.send_signal(signum)
  stdout, stderr = process.communicate(timeout=10)
  assert process.returncode == 128 + signum, stdout + stderr
  assert not os.path.exists(os.path.join(out, LOCK_NAME))
  kept = sorted(f for f in os.listdir(speech_chunks) if f.startswith("chunk-"))
  total = len(load_task_data(setup["data_dir"], "scmmlu", "s2t", "demo", 1024).rows["tokens"])
  assert 1 <= len(kept) < total and kept == [f"chunk-{i:05d}.npz" for i in range(len(kept))]
  assert not [f for f in os.listdir(speech_chunks) if ".tmp-" in f]
  assert f"interrupted by {signal.Signals(signum).name}: kept" in stderr and "rerun the same command" in stderr
  runs = json.load(open(os.path.join(out, "metrics.json")))["runs"]
  assert [sorted(r["tasks"]["scmmlu"]) for r in runs] == [["t2t"]]  # what completed, and only that
  reference_metrics = json.load(open(os.path.join(reference, "metrics.json")))["runs"][0]
  assert runs[0]["tasks"]["scmmlu"]["t2t"] == reference_metrics["tasks"]["scmmlu"]["t2t"]
  assert os.path.exists(os.path.join(out, "table.md"))

  finished = subprocess.run(_command(setup, out), capture_output=True, text=True, timeout=600)
  assert finished.returncode == 0, finished.stdout + finished.stderr
  resumed = f"scmmlu/s2t: resuming, {len(kept)} of {total} chunks done, scoring {total - len(kept)} rows"
  assert resumed in finished.stderr
  assert same_tree(reference, out) == []
