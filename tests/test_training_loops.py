"""S2SBench inside training loops: levanter's hook driven by a stand-in of its Trainer (levanter does not install
here), and MaxText's live parameters through the in-memory adapter in an optax loop, evaluated every 5 steps with
no recompilation and with the numbers the on-disk path gives."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.runtime import sharding
from s2sjax.scoring.evaluator import Evaluator, ScoringOptions
from s2sjax.model import decoder
from s2sjax.model.config import ModelConfig
from s2sjax.scoring.checkpoints.stacks import levanter, maxtext, maxtext_config
from s2sjax.results.levanter_hook import s2sbench_hook
from s2sjax.data.task_data import load_task_data
from tests.stack_fixtures import folder, needs_maxtext_oracle, run_config

CONFIG = ModelConfig(family="llama", vocab_size=256, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, rope_theta=10000.0, rotary_dim=8, rope_interleaved=False,
                     rms_norm_eps=1e-5, qkv_bias=False, o_bias=False, mlp_bias=False, tie_embeddings=False)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 48)), jnp.int32)


@pytest.fixture(scope="module")
def data(bytes_sample):
  return [load_task_data(bytes_sample["data_dir"], "sstorycloze", "t2t", bytes_sample["spec"], None)]


def language_model_loss(config: ModelConfig, params) -> jax.Array:
  log_probs = decoder.sequence_log_probs(config, params, TOKENS)
  return -jnp.take_along_axis(log_probs[:, :-1], TOKENS[:, 1:, None], axis=-1).mean()


# ---- levanter ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class State:
  step: int  # levanter's TrainerState.step: steps taken
  eval_model: dict


@dataclasses.dataclass
class StepInfo:
  """levanter's StepInfo (callbacks/_core.py:21-42): the step just completed is state.step - 1."""

  state: State

  @property
  def step(self) -> int:
    return int(self.state.step) - 1

  @property
  def eval_model(self):
    return self.state.eval_model


class StandInTrainer:
  """levanter's Trainer as its hooks see it: add_hook(fn, every=N) and, after each step, every hook whose `every`
  divides the step (trainer.py:97-99, 121-142)."""

  def __init__(self):
    self.hooks: list[tuple] = []

  def add_hook(self, fn, *, every: int = 1):
    self.hooks.append((fn, every))

  def run_hooks(self, info: StepInfo, force: bool = False):
    for fn, every in self.hooks:
      if force or info.step % every == 0:
        fn(info)


def levanter_tree(params) -> dict:
  """The decoder's parameters as levanter's LlamaLMHeadModel holds them (s2sjax/scoring/checkpoints/stacks/levanter.py's layout, built
  here from the layout's description: Linear weights out axes first, the layers Stacked)."""
  c, layers = CONFIG, params["layers"]
  q = layers["attn"]["q"]["kernel"].reshape(c.num_layers, c.hidden_size, c.num_kv_heads, -1, c.head_dim)
  return {
    "embeddings": {"token_embeddings": {"weight": params["embed"]["embedding"]}},
    "lm_head": {"weight": params["lm_head"]["kernel"].T},
    "transformer": {"norm": {"weight": params["final_norm"]["scale"]}, "layers": {"stacked": {
      "input_layernorm": {"weight": layers["attn_norm"]["scale"]},
      "post_attention_layernorm": {"weight": layers["mlp_norm"]["scale"]},
      "self_attn": {"q_proj": {"weight": jnp.transpose(q, (0, 2, 3, 4, 1))},
                    "k_proj": {"weight": jnp.transpose(layers["attn"]["k"]["kernel"], (0, 2, 3, 1))},
                    "v_proj": {"weight": jnp.transpose(layers["attn"]["v"]["kernel"], (0, 2, 3, 1))},
                    "o_proj": {"weight": jnp.transpose(layers["attn"]["o"]["kernel"], (0, 3, 1, 2))}},
      "mlp": {name: {"weight": jnp.swapaxes(layers["mlp"][ours]["kernel"], 1, 2)}
              for name, ours in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down"))}}}},
  }


@pytest.mark.slow
def test_the_levanter_hook_logs_s2sbench_metrics_to_the_tracker_every_n_steps(data):
  model = levanter_tree(decoder.init_params(CONFIG, jax.random.PRNGKey(0)))
  evaluator = Evaluator(CONFIG, data, ScoringOptions(batch_size=2), params_adapter=levanter.params_adapter(CONFIG))
  logged = []
  trainer = StandInTrainer()
  trainer.add_hook(s2sbench_hook(evaluator, log=lambda metrics, step: logged.append((step, metrics))), every=5)
  optimizer = optax.adam(1e-2)
  opt_state = optimizer.init(model)
  loss = jax.jit(jax.value_and_grad(lambda tree: language_model_loss(CONFIG, levanter.to_decoder_params(CONFIG, tree))))
  snapshots = {}
  for step in range(1, 21):
    _, grads = loss(model)
    updates, opt_state = optimizer.update(grads, opt_state)
    model = optax.apply_updates(model, updates)
    snapshots[step - 1] = model
    trainer.run_hooks(StepInfo(State(step, model)))
  assert [step for step, _ in logged] == [5, 10, 15]  # step 0 is skipped, as levanter's eval harness hook skips it
  assert evaluator.compiled_count() == 1
  reference = Evaluator(CONFIG, data, ScoringOptions(batch_size=2))
  for step, metrics in logged:
    expected = reference.evaluate(levanter.to_decoder_params(CONFIG, snapshots[step]))["sstorycloze"]["t2t"]
    assert metrics["s2sbench/sstorycloze/t2t/accuracy"] == expected["accuracy"]
    assert metrics["s2sbench/sstorycloze/t2t/positive_loss"] == pytest.approx(expected["positive_loss"], abs=1e-6)
  assert logged[0][1]["s2sbench/sstorycloze/t2t/positive_loss"] != logged[-1][1]["s2sbench/sstorycloze/t2t/positive_loss"]


# ---- MaxText -------------------------------------------------------------------------------------------------------


@needs_maxtext_oracle
@pytest.mark.slow
def test_maxtexts_live_params_evaluated_every_5_steps_of_an_optax_loop_without_recompiling(data, tmp_path):
  from orbax.checkpoint.experimental import v1 as ocp

  run = run_config("llama3.1_scan")
  tree = maxtext.StepFolder(folder("llama3.1_scan", "training state"),
                            maxtext_config.RunConfig.parse(run)).restore_tree(sharding.make_mesh())
  config, adapter = maxtext.decoder_config(run), maxtext.params_adapter(run)
  evaluator = Evaluator(config, data, ScoringOptions(batch_size=2), params_adapter=adapter)
  optimizer = optax.adamw(3e-3)
  opt_state = optimizer.init(tree)
  loss = jax.jit(jax.value_and_grad(lambda t: language_model_loss(config, maxtext.to_decoder_params(
    maxtext_config.describe(maxtext_config.RunConfig.parse(run)), t))))
  results, compiled = {}, []
  for step in range(1, 21):
    _, grads = loss(tree)
    updates, opt_state = optimizer.update(grads, opt_state, tree)
    tree = optax.apply_updates(tree, updates)
    if step % 5 == 0:
      results[step] = evaluator.evaluate({"params": tree}, step=step)
      compiled.append((evaluator.compiled_count(), adapter._cache_size()))
  assert compiled == [(1, 1)] * 4  # one scoring step and one adapter program, compiled once for all four
  assert results[5]["sstorycloze"]["t2t"] != results[20]["sstorycloze"]["t2t"]
  # step 20 saved as MaxText's save_params_to_path saves (checkpointing.py:1112-1120: {"params": params} as items)
  ocp.save_checkpointables(tmp_path / "checkpoints" / "20", {"items": {"params": {"params": tree}}})
  on_disk = checkpoint.open(str(tmp_path / "checkpoints" / "20"), maxtext_config.from_flag(run)).load_params()
  from_disk = Evaluator(config, data, ScoringOptions(batch_size=2)).evaluate(on_disk)["sstorycloze"]["t2t"]
  live = results[20]["sstorycloze"]["t2t"]
  assert from_disk["accuracy"] == live["accuracy"]
  for key in ("positive_loss", "negative_loss"):
    assert from_disk[key] == pytest.approx(live[key], abs=1e-6)
