r"""Scores each checkpoint of a MaxText run as it is saved: MaxText has no evaluation hook (its eval block computes
the loss only, `trainers/pre_train/train.py:869-898`), so this watches the run's checkpoint folder instead.

  python -m s2sjax.watch --run_dir=gs://BUCKET/RUN --task=TASK --modality=t2t,s2t [--spec=...] [--data_dir=DIR] \
      [--output_dir=DIR] [--maxtext_config="model_name=... base_*=..."] [--poll_seconds=60] \
      [--stop_after_step=N] [--once]   (and s2sjax.eval's scoring flags)

`--run_dir` is MaxText's `<base_output_directory>/<run_name>`; its `checkpoints/<step>` folders are scored in step
order, each once orbax has committed it (`commit_success.txt`, written last: a step still being written, or an
orbax `<step>.orbax-checkpoint-tmp-*` folder, is left until it is). Each step is one `s2sjax.eval` run into the
same `--output_dir`: per-step result folders, metrics.json over all steps, the curves and TensorBoard scalars (on by
default here). What was scored is recorded in `watch.json` there, by each step's content id (s2sjax/scoring/checkpoints/stacks/maxtext.py),
so a restarted watcher goes on where it stopped (a step half scored resumes from its chunks) and a step rewritten
at the same path is scored again. It polls every `--poll_seconds` until `--stop_after_step` is scored (or, with
`--once`, stops after one pass). One process; a pod's evaluation is `s2sjax.eval` over the finished run.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from absl import flags
from etils import epath

from s2sjax.data import builds
from s2sjax.scoring.checkpoints import paths as checkpoint_paths
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.runtime import cli
from s2sjax.results import reports
from s2sjax.commands import eval as eval_command
from s2sjax.runtime.errors import UserError
from s2sjax.runtime.output_dir import read_json
from s2sjax.scoring.checkpoints.stacks import maxtext

FLAGS = flags.FLAGS
STATE = "watch.json"


class WatchError(UserError, ValueError):
  """A run folder that holds no MaxText checkpoints folder, or flags that do not name one."""


def committed_steps(run_dir: str | epath.Path) -> tuple[list[epath.Path], list[str]]:
  """(the committed step folders of a run, in step order; the names of those still being written)."""
  folder = epath.Path(run_dir) / "checkpoints"
  if not folder.is_dir():
    raise WatchError(f"{run_dir} has no checkpoints/ folder: --run_dir is MaxText's <base_output_directory>/<run_name>")
  ready, pending = [], []
  for path in folder.iterdir():
    if checkpoint_paths.ORBAX_TEMPORARY.search(path.name) or (path.name.isdigit() and not maxtext.is_committed(path)):
      pending.append(path.name)
    elif path.name.isdigit() and maxtext.is_step_folder(path):
      ready.append(path)
  return sorted(ready, key=lambda p: int(p.name)), sorted(pending)


def _read_state(output_dir: str) -> dict[str, str]:
  """{step folder name: content id} of the steps scored into `output_dir` so far."""
  path = epath.Path(output_dir) / STATE
  if not path.exists():
    return {}
  return read_json(path, "the watcher's record", "delete it to score every step again")["scored"]


def watch(cfg: eval_command.EvalConfig, run_dir: str, poll_seconds: float = 60.0, stop_after_step: int | None = None,
          once: bool = False, sleep: Callable[[float], None] = time.sleep) -> list[int]:
  """Scores every committed step of the run not scored yet (module docstring); returns the steps scored now."""
  scored_now: list[int] = []
  state = _read_state(cfg.output_dir)
  while True:
    ready, pending = committed_steps(run_dir)
    for step_dir in ready:
      reader = checkpoint.open(str(step_dir), cfg.maxtext_config)  # opened once: its content id, then its scores
      content = reader.content_id()
      if state.get(step_dir.name) == content:
        continue
      print(f"scoring step {step_dir.name} of {run_dir}", flush=True)
      eval_command.run(dataclasses.replace(cfg, checkpoints=str(step_dir)), opened=reader)
      state[step_dir.name] = content
      reports.write_json(epath.Path(cfg.output_dir) / STATE, {"run_dir": str(run_dir), "scored": state})
      scored_now.append(int(step_dir.name))
    if pending:
      print(f"waiting for orbax to commit {', '.join(pending)}", flush=True)
    done = stop_after_step is not None and any(int(name) >= stop_after_step for name in state)
    if once or done:
      return scored_now
    sleep(poll_seconds)


def main(argv) -> None:
  del argv
  if FLAGS.checkpoint:
    raise WatchError("s2sjax.watch scores the steps of --run_dir as they come; --checkpoint is s2sjax.eval's")
  cfg = dataclasses.replace(eval_command.config_from_flags(), tensorboard=True)
  watch(cfg, FLAGS.run_dir, FLAGS.poll_seconds, FLAGS.stop_after_step, FLAGS.once)


def command_line() -> None:
  """`python -m s2sjax.watch`."""
  with cli.setting_up():
    eval_command.define_flags()
  flags.DEFINE_string("run_dir", None, "MaxText's <base_output_directory>/<run_name>: its checkpoints/ is watched.")
  flags.DEFINE_float("poll_seconds", 60.0, "Seconds between looks at the checkpoint folder.", lower_bound=0.0)
  flags.DEFINE_integer("stop_after_step", None, "Stop once this step (or a later one) is scored.")
  flags.DEFINE_bool("once", False, "Score what is committed now, then stop.")
  flags.mark_flags_as_required(["run_dir"])
  cli.run(main, __doc__, flag_modules=(__name__, eval_command.__name__, builds.__name__))
