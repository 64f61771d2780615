r"""The paper's two-stage schedule on a tiny model, with S2SBench evaluated inside the training loop.

  python -m s2sjax.examples.two_stage_training [--steps_per_stage=30] [--eval_every=10] [--output_dir=DIR]

Training task: speech-text alignment on the bundled sample's own audio, the spoken `first` (instruction + audio
units) followed by its transcript; the benchmark candidates are never trained on. Stage 1 trains only the audio
embeddings and the head; stage 2 trains everything but the text embeddings and the head. The `Evaluator` is
built once and scores sStoryCloze and sCMMLU (T->T and S->T) every --eval_every steps without recompiling; the
curves are redrawn into --output_dir as it goes.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import flags

from s2sjax.runtime import cli
from s2sjax.results import reports
from s2sjax.commands.default_checkpoint import default_checkpoint
from s2sjax.scoring.evaluator import Evaluator, ScoringOptions
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import init_params
from s2sjax.data.packing import Item, RowShape, fit, longest_item, pack
from s2sjax.scoring.scorer import TARGET_CHUNK, score_batch
from s2sjax.data.spec import load_spec
from s2sjax.data.task_data import TaskData, load_task_data
from tasks.audio import from_spec
from tasks.build import QuestionEncoder
from tasks.preparation import default_data_dir, prepare
from tasks.release import read_questions
from tasks.sample import RELEASE_DIR
from tasks.sample.smoke import smoke_tasks

SHAPE = RowShape.for_length(1024, num_codebooks=1)
SPEC = "demo_tables"  # audio as one codebook table at a placeholder: the table is what stage 1 trains


def alignment_rows(tokenizer, spec_name: str = SPEC) -> tuple[dict[str, np.ndarray], RowShape]:
  """Packed rows of (spoken first half -> its transcript) for every question of the bundled sample, and their shape
  with the target table cut to what the rows hold (`fit`): the head runs over those targets, ~50 a row, not the 512
  slots SHAPE makes room for, each a logsumexp over Qwen2.5's 151,680-token vocabulary."""
  spec = load_spec(spec_name)
  encoder = QuestionEncoder(spec, "s2t", tokenizer, from_spec(spec.audio_tokenizer, spec.codebook_sizes))
  items = []
  for task in smoke_tasks():  # the sample's tasks
    for question in read_questions(task, RELEASE_DIR):
      ids, codes, _ = encoder.prefix(question, 0)
      transcript = encoder.text_ids(question.prefixes[0], special=False)
      items.append(Item(ids, (transcript,), codes, name=question.id))
  rows, _ = pack(items, SHAPE)
  return fit(rows, SHAPE, longest_item(rows["segment_ids"]))


def stage_labels(params, stage: int):
  """'train' / 'freeze' per leaf: stage 1 = audio embeddings + head; stage 2 = all but text embeddings + head."""
  def label(path, _):
    top = path[0].key
    in_stage1 = top.startswith("audio_embed") or top == "lm_head"
    if stage == 1:
      return "train" if in_stage1 else "freeze"
    return "freeze" if top in ("embed", "lm_head") else "train"

  return jax.tree_util.tree_map_with_path(label, params)


def make_train_step(config: ModelConfig, optimizer, shape: RowShape):
  @jax.jit
  def train_step(params, opt_state, batch):
    def loss_fn(p):
      out = score_batch(config, jnp.float32, TARGET_CHUNK, shape.max_slots, p, batch)
      return out["nll_sum"].sum() / jnp.maximum(out["n_tokens"].sum(), 1)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return train_step


def tiny_config(vocab_size: int, placeholder: int) -> ModelConfig:
  return ModelConfig(
    family="qwen2", vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=16, rope_theta=10000.0, rotary_dim=16, rope_interleaved=False, rms_norm_eps=1e-6,
    qkv_bias=True, o_bias=False, mlp_bias=False, tie_embeddings=False, audio_codebook_sizes=(256,),
    audio_placeholder_id=placeholder,
  )


def train(tokenizer_dir: str, data_dir: str, output_dir: str, steps_per_stage: int, eval_every: int,
          learning_rate: float = 3e-3, batch_rows: int = 2) -> dict:
  from transformers import AutoTokenizer

  tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
  data: list[TaskData] = []
  for task in ("sstorycloze", "scmmlu"):
    for modality in ("t2t", "s2t"):
      prepare(task, SPEC, modality, SHAPE.length, data_dir, tokenizer_dir=tokenizer_dir)
      data.append(load_task_data(data_dir, task, modality, SPEC, SHAPE.length))
  config = tiny_config(len(tokenizer), data[1].metadata.audio_ids.placeholder)
  params = init_params(config, jax.random.PRNGKey(0))
  evaluator = Evaluator(config, data, ScoringOptions(batch_size=4))
  rows, shape = alignment_rows(tokenizer)
  fields = ("tokens", "segment_ids", "branch_ids", "positions", "audio_codes", "target_pos", "target_ids", "target_slot")
  os.makedirs(output_dir, exist_ok=True)
  log, step, after_stage = [], 0, []
  for stage in (1, 2):
    optimizer = optax.multi_transform({"train": optax.adam(learning_rate), "freeze": optax.set_to_zero()},
                                      stage_labels(params, stage))
    opt_state = optimizer.init(params)
    train_step = make_train_step(config, optimizer, shape)
    for _ in range(steps_per_stage):
      picks = np.arange(step * batch_rows, (step + 1) * batch_rows) % len(rows["tokens"])
      batch = {k: jnp.asarray(rows[k][picks]) for k in fields}
      params, opt_state, loss = train_step(params, opt_state, batch)
      step += 1
      log.append({"step": step, "stage": stage, "train_loss": float(loss)})
      if step % eval_every == 0:
        evaluator.evaluate(params, step)
        runs = [{"step": h["step"], "tasks": {k: v for k, v in h.items() if k not in ("step", "degradation")}}
                for h in evaluator.history]
        reports.plot_curves(output_dir, runs)
        print(f"step {step} (stage {stage}): train loss {float(loss):.3f}; " + ", ".join(
          f"{t} {m} {100 * h[t][m]['accuracy']:.0f}%" for h in evaluator.history[-1:] for t in ("sstorycloze", "scmmlu")
          for m in ("t2t", "s2t")), flush=True)
    after_stage.append(params)
  summary = {"train_log": log, "history": evaluator.history, "compilations": evaluator.compiled_count()}
  reports.write_json(os.path.join(output_dir, "training_history.json"), summary)
  return dict(summary, config=config, params_after_stage=after_stage)


def main(argv):
  del argv
  FLAGS = flags.FLAGS
  tokenizer_dir = FLAGS.tokenizer_dir or os.path.join(default_checkpoint(), "tokenizer")
  train(tokenizer_dir, FLAGS.data_dir or default_data_dir(), FLAGS.output_dir, FLAGS.steps_per_stage, FLAGS.eval_every)
  print(f"curves and history in {FLAGS.output_dir}")


if __name__ == "__main__":
  flags.DEFINE_integer("steps_per_stage", 30, "Optimizer steps in each of the two stages.")
  flags.DEFINE_integer("eval_every", 10, "Evaluate S2SBench every this many steps.")
  flags.DEFINE_string("output_dir", "outputs/two_stage", "Where the curves and history go.")
  flags.DEFINE_string("data_dir", None, "Built datasets (default: ~/.cache/s2sjax/data).")
  flags.DEFINE_string("tokenizer_dir", None, "Text tokenizer (default: the embedded default model's).")
  cli.run(main)  # the console every command line has: the libraries' INFO records and bars hidden
