"""The levanter hook's refusal of parameters it cannot score: an int32 tree is refused naming its first int leaf,
before the evaluator scores anything and before a metric reaches the tracker."""

from __future__ import annotations

import types

import jax.numpy as jnp
import pytest

from s2sjax.results.levanter_hook import HookError, s2sbench_hook


class Recording:
  """An evaluator that records what it is asked to score."""

  def __init__(self):
    self.scored = []

  def evaluate(self, params, step=None):
    self.scored.append(step)
    return {}


def test_int32_parameters_are_refused_naming_the_first_and_nothing_is_scored_or_logged():
  evaluator, logged = Recording(), []
  hook = s2sbench_hook(evaluator, log=lambda metrics, step: logged.append(step))
  model = {"embed": {"weight": jnp.ones((4, 2), jnp.float32)},
           "layers": {"0": {"q": jnp.ones((2, 2), jnp.int32), "k": jnp.ones((2, 2), jnp.int32)}}}
  with pytest.raises(HookError) as refused:
    hook(types.SimpleNamespace(step=5, eval_model=model))
  assert str(refused.value).startswith("s2sbench_hook: parameter ['layers']['0']['k'] is int32, not floating point")
  assert evaluator.scored == [] and logged == []
  hook(types.SimpleNamespace(step=5, eval_model={"embed": {"weight": jnp.ones((4, 2), jnp.bfloat16)}}))
  assert evaluator.scored == [5] and logged == [5]
