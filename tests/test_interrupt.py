"""SIGINT (Ctrl-C) or SIGTERM to a running `s2sjax.eval` stops it mid-step, whatever the step's length: it keeps
what is complete, summarizes it, releases the lock, drops the result of the step it did not wait for, and a rerun
scores only the rest, ending with the files of an uninterrupted run.

The step the signal lands in is held (`s2sjax.runtime.cli.STALL_WORKER`) until the command has stopped waiting for it, as
a long XLA step running on past Ctrl-C: a command that waited for its step would never end. The test waits on the
process, not on a clock, and prints how long after the signal it ended (tests/interrupting.py)."""

import json
import os
import signal
import subprocess
import sys

import pytest

from s2sjax.runtime.output_dir import LOCK_NAME
from s2sjax.data.task_data import load_task_data
from tests.eval_fixtures import same_tree
from tests.interrupting import HANG_GUARD_S, interrupt_mid_step

pytestmark = pytest.mark.slow  # builds a task of the sample and runs evaluations as subprocesses


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_sample):
  reference = str(tmp_path_factory.mktemp("interrupt") / "reference")  # an uninterrupted run's files
  subprocess.run(_command(tiny_sample, reference), check=True, capture_output=True, timeout=HANG_GUARD_S)
  rows = {m: load_task_data(tiny_sample["data_dir"], "scmmlu", m, "demo", 1024).num_rows for m in ("t2t", "s2t")}
  return {**tiny_sample, "reference": reference, "rows": rows}


def _command(setup, out):
  # one row a chunk and a step: the N-th step is chunk N-1 of T->T then S->T
  return [sys.executable, "-m", "s2sjax.eval", "--task=scmmlu", "--modality=t2t,s2t", f"--checkpoint={setup['ckpt']}",
          f"--data_dir={setup['data_dir']}", f"--output_dir={out}", "--batch_size=1", "--chunk_rows=1",
          "--row_length=1024"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_step_keeps_finished_chunks_summarizes_and_resumes(setup, tmp_path, signum, record_property):
  reference, out = setup["reference"], str(tmp_path / "interrupted")
  text_rows, speech_rows = setup["rows"]["t2t"], setup["rows"]["s2t"]
  assert speech_rows >= 3
  # T->T complete, S->T's first chunk saved, its second under way
  returncode, stderr, latency = interrupt_mid_step(_command(setup, out), text_rows + 2, signum)
  record_property(f"{signal.Signals(signum).name}_latency_s", round(latency, 3))
  assert returncode == 128 + signum, stderr
  assert not os.path.exists(os.path.join(out, LOCK_NAME))
  speech_chunks = os.path.join(out, "chunks", "ckpt-100", "scmmlu-s2t")
  # the held step's result came after the signal: dropped, not saved
  assert sorted(f for f in os.listdir(speech_chunks) if f.startswith("chunk-")) == ["chunk-00000.npz"]
  assert not [f for f in os.listdir(speech_chunks) if ".tmp-" in f]
  assert [line for line in stderr.splitlines() if line.startswith("interrupted by")] == [
    f"interrupted by {signal.Signals(signum).name}: kept {text_rows + 1} finished chunks in {out}/chunks; "
    "metrics.json and the tables cover the 1 task x modality scores files completed; rerun the same command to "
    "score only the rest"], stderr
  assert "Traceback" not in stderr
  runs = json.load(open(os.path.join(out, "metrics.json")))["runs"]
  assert [sorted(r["tasks"]["scmmlu"]) for r in runs] == [["t2t"]]  # what completed, and only that
  reference_metrics = json.load(open(os.path.join(reference, "metrics.json")))["runs"][0]
  assert runs[0]["tasks"]["scmmlu"]["t2t"] == reference_metrics["tasks"]["scmmlu"]["t2t"]
  assert os.path.exists(os.path.join(out, "table.md"))

  finished = subprocess.run(_command(setup, out), capture_output=True, text=True, timeout=HANG_GUARD_S)
  assert finished.returncode == 0, finished.stdout + finished.stderr
  resumed = f"scmmlu/s2t: resuming, 1 of {speech_rows} chunks done, scoring {speech_rows - 1} rows"
  assert resumed in finished.stderr
  assert same_tree(reference, out) == []
