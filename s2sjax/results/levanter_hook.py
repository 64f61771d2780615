"""S2SBench inside a levanter run: a hook of `Trainer.add_hook`'s shape (stanford-crfm/levanter 9263f81,
`trainer.py:241`: `fn(StepInfo)`, run when `info.step % every == 0`, `trainer.py:97-99`), as levanter's own
lm-eval harness hook is (`eval_harness.py:763`, registered at `main/train_lm.py:225-231`): it scores
`info.eval_model` (`callbacks/_core.py:21-42`), skips step 0 unless forced, and logs from process 0 to the run's
tracker with `levanter.tracker.log(metrics, step=...)` (`tracker/tracker_fns.py:37`), where levanter writes its own
metrics (W&B, TensorBoard, JSON: whichever the run configured).

    evaluator = Evaluator(config, data, params_adapter=levanter.params_adapter(config))
    trainer.add_hook(s2sbench_hook(evaluator), every=500)

The metric names are `s2sbench/` + `s2sjax.results.reports.scalars`'s: `s2sbench/<task>/<modality>/<metric>` and
`s2sbench/<task>/degradation/<pair>`, as `s2sjax.eval --tensorboard` names them.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from s2sjax.results import reports
from s2sjax.runtime.errors import UserError

PREFIX = "s2sbench"


class HookError(UserError, TypeError):
  """Parameters the hook cannot score (not floating point)."""


def check_float(params: Any) -> None:
  """Every parameter leaf floating point: an int32 tree (a cast gone wrong, a quantized model) would score as
  gibberish, accuracy 0.0 reported as a result; a HookError names the first leaf that is not."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and not jnp.issubdtype(dtype, jnp.floating):
      raise HookError(f"s2sbench_hook: parameter {jax.tree_util.keystr(path)} is {dtype}, not floating point: "
                      "the hook scores float parameters (pass params_of= to cast or dequantize them)")


def metrics_of(result: dict, prefix: str = PREFIX) -> dict[str, float]:
  """`Evaluator.evaluate`'s result as tracker metrics: `<prefix>/<scalar name>`."""
  tasks = {task: value for task, value in result.items() if task != "degradation"}
  return {f"{prefix}/{name}": value for name, value in reports.scalars(tasks, result.get("degradation", {})).items()}


def _levanter_log(metrics: dict[str, float], *, step: int) -> None:
  import levanter.tracker  # the run's own: imported when a levanter run calls the hook

  levanter.tracker.log(metrics, step=step)


def s2sbench_hook(evaluator, params_of: Callable[[Any], Any] = lambda model: model, *,
                  log: Callable[..., None] | None = None, prefix: str = PREFIX) -> Callable[..., None]:
  """`fn(info, force=False)` for `trainer.add_hook(fn, every=N)`: scores `params_of(info.eval_model)` with the
  evaluator (one compiled step per row shape, reused every call) and logs its metrics at `info.step`. `params_of`
  is the identity when the evaluator scores the model itself (an `own_forward.OwnForward` over levanter's model, or
  an evaluator whose `params_adapter` maps it); `log` is levanter's tracker unless given. Parameters that are not
  floating point are refused (`check_float`), naming the first, before anything is scored."""
  write = log or _levanter_log

  def hook(info, force: bool = False) -> None:
    if info.step == 0 and not force:  # as levanter's eval harness hook: nothing trained yet
      return
    params = params_of(info.eval_model)
    check_float(params)
    result = evaluator.evaluate(params, step=info.step)
    if jax.process_index() == 0:
      write(metrics_of(result, prefix), step=info.step)

  return hook
