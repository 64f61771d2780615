"""Ctrl-C while a MaxText checkpoint is being read (orbax's metadata, then its arrays), by `s2sjax.logprobs`,
`s2sjax.eval` and `s2sjax.watch`: exit 130 and one line saying where to resume (rerun the same command); no file
blamed for the cut read, no asyncio task dump, nothing written. The read held is the N-th worker call (tests/interrupting.py):
1 is orbax's metadata, 2 its arrays."""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
import pytest

from tests.interrupting import interrupt_mid_step
from tests.stack_fixtures import TINY_RUN, tiny_maxtext_checkpoint

pytestmark = pytest.mark.slow  # each case is a command run as a subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOPPED = "stopped by SIGINT: rerun the same command to go on"


def assert_stopped_cleanly(returncode: int, stderr: str, last_line: str = STOPPED) -> None:
  assert returncode == 128 + signal.SIGINT, stderr[-3000:]
  assert stderr.strip().splitlines()[-1] == last_line, stderr[-3000:]
  for blame in ("Traceback", "Task was destroyed", "cannot be read", "holds no", "damaged", "error:"):
    assert blame not in stderr, (blame, stderr[-3000:])


@pytest.mark.parametrize("read", [1, 2])
def test_logprobs_stopped_while_reading_a_maxtext_folder(tmp_path, read):
  step = tiny_maxtext_checkpoint(str(tmp_path / "params_only"))
  np.save(tmp_path / "ids.npy", np.arange(1, 11, dtype=np.int32))
  returncode, stderr, _ = interrupt_mid_step(
    [sys.executable, "-m", "s2sjax.logprobs", f"--checkpoint={step}", f"--maxtext_config={TINY_RUN}",
     f"--input_ids={tmp_path / 'ids.npy'}", f"--output={tmp_path / 'out.npy'}"], read, signal.SIGINT, cwd=ROOT)
  assert_stopped_cleanly(returncode, stderr)
  assert not (tmp_path / "out.npy").exists()


def _eval_flags(bytes_sample, out) -> list[str]:
  return ["--task=sstorycloze", "--modality=t2t", f"--spec={bytes_sample['spec']}",
          f"--data_dir={bytes_sample['data_dir']}", f"--tokenizer_dir={bytes_sample['tokenizer']}",
          f"--output_dir={out}", f"--maxtext_config={TINY_RUN}"]


def test_eval_stopped_while_reading_a_maxtext_folders_arrays(bytes_sample, tmp_path):
  step = tiny_maxtext_checkpoint(str(tmp_path / "params_only"))
  returncode, stderr, _ = interrupt_mid_step(
    [sys.executable, "-m", "s2sjax.eval", f"--checkpoint={step}", *_eval_flags(bytes_sample, tmp_path / "out")],
    2, signal.SIGINT, cwd=ROOT)
  assert_stopped_cleanly(returncode, stderr, (
    f"interrupted by SIGINT: kept 0 finished chunks in {tmp_path / 'out' / 'chunks'}; metrics.json and the tables "
    "cover the 0 task x modality scores files completed; rerun the same command to score only the rest"))
  assert not list((tmp_path / "out").rglob("*.scores.jsonl"))  # nothing scored from a half-read checkpoint


def test_watch_stopped_while_opening_a_step_leaves_it_to_the_rerun(bytes_sample, tmp_path):
  run_dir = tmp_path / "run"
  tiny_maxtext_checkpoint(str(run_dir / "checkpoints" / "1"))
  returncode, stderr, _ = interrupt_mid_step(
    [sys.executable, "-m", "s2sjax.watch", f"--run_dir={run_dir}", "--once",
     *_eval_flags(bytes_sample, tmp_path / "out")], 1, signal.SIGINT, cwd=ROOT)
  assert_stopped_cleanly(returncode, stderr)
  assert not (tmp_path / "out" / "watch.json").exists()  # step 1 is still to score: the rerun scores it
