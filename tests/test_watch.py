"""The MaxText watcher (s2sjax/commands/watch.py): each step of a run scored once orbax has committed it, a
half-written step left until it is, a restarted watcher going on where it stopped, curves and TensorBoard
scalars over the steps. The steps are MaxText's own checkpoint (../shared/upstream-oracles/maxtext) and a later one
saved as MaxText's save_params_to_path saves (checkpointing.py:1112-1120: {"params": params} as orbax's `items`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import jax
import pytest

from s2sjax.runtime import sharding
from s2sjax.commands import eval as eval_command
from s2sjax.commands.watch import STATE, committed_steps, watch
from s2sjax.scoring.checkpoints.stacks import maxtext, maxtext_config
from tests.stack_fixtures import MAXTEXT, folder, needs_maxtext_oracle, run_config

pytestmark = [needs_maxtext_oracle, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def later_step(run_dir, step: int) -> str:
  """Step `step` of the run, written as MaxText writes one, its weights moved from step 1's."""
  from orbax.checkpoint.experimental import v1 as ocp

  tree = maxtext.StepFolder(folder("llama3.1_scan", "training state"), maxtext_config.RunConfig.parse(
    run_config("llama3.1_scan"))).restore_tree(sharding.make_mesh())
  moved = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(step), x.shape), tree)
  path = os.path.join(run_dir, "checkpoints", str(step))
  ocp.save_checkpointables(path, {"items": {"params": {"params": moved}}})
  return path


def test_steps_are_scored_as_orbax_commits_them_and_a_restart_goes_on(tmp_path, bytes_sample):
  run_dir = tmp_path / "run"
  shutil.copytree(MAXTEXT / "llama3.1_scan" / "run" / "checkpoints" / "1", run_dir / "checkpoints" / "1")
  second = later_step(str(run_dir), 2)
  marker = os.path.join(second, "commit_success.txt")
  os.rename(marker, marker + ".held")  # step 2 as orbax leaves it mid-write: every file but the commit marker
  (run_dir / "checkpoints" / "3.orbax-checkpoint-tmp").mkdir()  # and a step being written under orbax's name
  ready, pending = committed_steps(run_dir)
  assert [p.name for p in ready] == ["1"] and pending == ["2", "3.orbax-checkpoint-tmp"]
  out = tmp_path / "out"
  config = run_config("llama3.1_scan")
  flags = [f"--run_dir={run_dir}", "--task=sstorycloze", "--modality=t2t", f"--spec={bytes_sample['spec']}",
           f"--data_dir={bytes_sample['data_dir']}", f"--output_dir={out}",
           f"--tokenizer_dir={bytes_sample['tokenizer']}", f"--maxtext_config={config}", "--once"]
  done = subprocess.run([sys.executable, "-m", "s2sjax.watch", *flags], cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "waiting for orbax to commit 2, 3.orbax-checkpoint-tmp" in done.stdout
  assert [run["step"] for run in json.loads((out / "metrics.json").read_text())["runs"]] == [1]

  os.rename(marker + ".held", marker)  # orbax committed step 2
  cfg = eval_command.EvalConfig(tasks=("sstorycloze",), modalities=("t2t",), spec=bytes_sample["spec"],
                                data_dir=bytes_sample["data_dir"], output_dir=str(out),
                                tokenizer_dir=bytes_sample["tokenizer"], tensorboard=True,
                                maxtext_config=maxtext_config.from_flag(config))
  assert watch(cfg, str(run_dir), once=True) == [2]  # step 1 is not scored again
  assert watch(cfg, str(run_dir), poll_seconds=0, stop_after_step=2) == []
  runs = json.loads((out / "metrics.json").read_text())["runs"]
  assert [run["step"] for run in runs] == [1, 2]
  assert runs[0]["tasks"]["sstorycloze"]["t2t"] != runs[1]["tasks"]["sstorycloze"]["t2t"]
  assert sorted(json.loads((out / STATE).read_text())["scored"]) == ["1", "2"]
  assert (out / "curves_accuracy.png").exists() and (out / "curves_loss.png").exists()
  assert any(name.startswith("events.out.tfevents") for name in os.listdir(out / "tensorboard"))
