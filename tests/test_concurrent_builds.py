"""Two first builds of one config into one fresh data dir at once, and two first conversions of the default model
into one fresh cache: the second waits for the first's work (the lock beside it names the holder) and reuses it,
and both succeed with the same result."""

import os
import subprocess
import sys

import pytest

from s2sjax.runtime.output_dir import LOCK_NAME, RunLock
from s2sjax.data.task_data import load_task_data

pytestmark = pytest.mark.slow  # two tasks.prepare subprocesses


def _until_waiting(stream) -> str:
  """What a run prints up to its line saying it waits (all of it, when it never says so)."""
  lines = []
  for line in stream:
    lines.append(line)
    if ": waiting for the " in line:
      break
  return "".join(lines)


def test_two_prepare_runs_into_one_fresh_data_dir_both_succeed(tmp_path, qwen_tokenizer_dir):
  """The test holds the build's lock while both start, so both must wait (whatever the timing), then lets go: one
  builds, the other waits for it and reuses it (without the lock TFDS fails it at the rename of its build)."""
  data_dir = tmp_path / "data"
  command = [sys.executable, "-m", "tasks.prepare", "--task=scmmlu", "--modality=t2t", "--row_length=1024",
             f"--data_dir={data_dir}", f"--tokenizer_dir={qwen_tokenizer_dir}"]
  held = RunLock(data_dir / "scmmlu", name=f".demo-t2t-1024{LOCK_NAME}")
  with held:
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for _ in range(2)]
    firsts = [_until_waiting(p.stdout) for p in processes]  # each one waits for this test's "build"
  for first in firsts:
    assert f"scmmlu/demo-t2t-1024: waiting for the build of pid {os.getpid()}" in first and "then reusing" in first
  outputs = [first + p.communicate(timeout=600)[0] for first, p in zip(firsts, processes)]
  for process, output in zip(processes, outputs):
    assert process.returncode == 0, output
    assert "scmmlu demo-t2t-1024:" in output, output
  assert not list(data_dir.glob("scmmlu/.*" + LOCK_NAME)) and not list(data_dir.glob("scmmlu/*/incomplete.*"))
  assert len(load_task_data(str(data_dir), "scmmlu", "t2t", "demo", 1024).rows["tokens"]) > 0


def test_two_first_runs_on_one_fresh_cache_convert_the_default_model_once(tmp_path):
  """Two first runs of the embedded default on one fresh $S2SJAX_CACHE: the second waits for the first's
  conversion (the lock beside the checkpoint names the holder) and reuses it; without the lock the second's
  `overwrite` would delete the checkpoint the first is writing."""
  from s2sjax.scoring import default_model
  from s2sjax.scoring.checkpoints import checkpoint

  cache = tmp_path / "cache"
  env = dict(os.environ, S2SJAX_CACHE=str(cache))
  command = [sys.executable, "-m", "s2sjax.commands.default_checkpoint"]
  held = RunLock(cache, name=f".{default_model.CHECKPOINT_NAME}{LOCK_NAME}")
  with held:
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                 for _ in range(2)]
    firsts = [_until_waiting(p.stdout) for p in processes]
  for first in firsts:
    assert f"the default model: waiting for the conversion of pid {os.getpid()}" in first, first
  outputs = [first + p.communicate(timeout=600)[0] for first, p in zip(firsts, processes)]
  converted = str(cache / default_model.CHECKPOINT_NAME)
  for process, output in zip(processes, outputs):
    assert process.returncode == 0 and output.rstrip().endswith(converted), output
  assert not list(cache.glob(".*" + LOCK_NAME))
  assert checkpoint.load_manifest(converted)["source"] == default_model.default_gguf()
