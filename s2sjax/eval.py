r"""Evaluates speech-LLM checkpoints on S2SBench: T->T, S->T and the degradation between them.

  python -m s2sjax.eval --task=sstorycloze|zh_sstorycloze|scmmlu|all --modality=text|speech|both \
      [--checkpoint=DIR|GLOB|A,B,C] [--spec=demo] [--data_dir=DIR] [--output_dir=DIR] [--mesh=data:-1,model:1] \
      [--batch_size=8] [--dtype=float32|bfloat16] [--row_length=1024] [--chunk_rows=32] \
      [--attention=auto|xla|dot_product|flash] [--noshare_prefix] [--overlong=truncate_prefix]

With only task and modality it runs the embedded default: the bundled sample (built on first use) and SmolLM2-135M
(converted on first use) with an untrained audio table, so its S->T shows what a text LM that never learned audio
does. Several checkpoints of one run (a glob or a list) give curves over steps. Rerunning into the same
--output_dir scores only what is missing, and refuses chunks another checkpoint, dtype, chunking or data made.
--noshare_prefix, --reference_language_quirk and --overlong pick the build `tasks.prepare` made with those flags
(flash attention needs rows without shared prefixes).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from etils import epath
from jax.experimental import multihost_utils

from s2sjax import checkpoint, default_model, metrics, results, sharding
from s2sjax.evaluator import (EvalError, Evaluator, TaskData, Variants, check_fit, load_task_data, summarize,
                              with_untrained_audio_tables)
from s2sjax.scoring import CandidateScores, Progress, collect

TASKS = ("sstorycloze", "zh_sstorycloze", "scmmlu")
FLAGS = flags.FLAGS


def resolve_checkpoints(spec: str | None) -> list[str]:
  """Paths from a comma-separated list of paths and globs, in step order; the default model when empty."""
  if not spec:
    return [default_model.default_checkpoint()]
  paths = []
  for part in filter(None, (p.strip() for p in spec.split(","))):
    part = os.path.expanduser(part)  # "--checkpoint=~/x" reaches us unexpanded
    matches = _glob(part) if any(ch in part for ch in "*?[") else [part]
    if not matches:
      raise EvalError(f"--checkpoint pattern {part!r} matches nothing")
    paths += matches
  return sorted(dict.fromkeys(paths), key=lambda p: (step_of(p) is None, step_of(p) or 0, p))


def _glob(pattern: str) -> list[str]:
  """Local or gs:// glob (the pattern in the last path component for buckets)."""
  if "://" not in pattern:
    return sorted(glob.glob(pattern))
  parent, _, name = pattern.rstrip("/").rpartition("/")
  return sorted(str(p) for p in epath.Path(parent).glob(name))


def step_of(path: str) -> int | None:
  numbers = re.findall(r"\d+", os.path.basename(os.path.normpath(path)))
  return int(numbers[-1]) if numbers else None


def ensure_data(data_dir: str, task: str, modality: str, spec: str, row_length: int, tokenizer_dir: str,
                is_default: bool, variants: Variants = Variants()) -> TaskData:
  try:
    return load_task_data(data_dir, task, modality, spec, row_length, variants)
  except ValueError:
    if not is_default:
      raise
  from tasks.prepare import prepare  # the embedded default builds the bundled sample on first use

  logging.info("building the bundled sample: %s %s", task, modality)
  prepare(task, spec, modality, row_length, data_dir, tokenizer_dir=tokenizer_dir, **dataclasses.asdict(variants))
  return load_task_data(data_dir, task, modality, spec, row_length, variants)


def load_model(path: str, data: list[TaskData], mesh, dtype):
  """Config and params of one checkpoint, fitted to the data's spec (the demo's untrained audio table)."""
  config = checkpoint.load_config(path)
  params = checkpoint.load_params(path, mesh=mesh, dtype=dtype)
  speech = [td for td in data if td.modality == "speech"]
  if speech and not config.audio_codebook_sizes and speech[0].metadata["spec"]["name"] == "demo":
    spec = speech[0].metadata["spec"]
    config, params = with_untrained_audio_tables(config, params, tuple(spec["codebook_sizes"]),
                                                 speech[0].metadata["audio_ids"]["placeholder"])
  return config, params


def _tokenizer_identity(path: str) -> dict | None:
  """The checkpoint's tokenizer identity (copied locally first when the checkpoint is in a bucket)."""
  import tempfile

  from transformers import AutoTokenizer

  from tasks.tfds_builder import tokenizer_identity

  tokenizer_dir = epath.Path(path) / "tokenizer"
  if not tokenizer_dir.exists():
    return None
  with tempfile.TemporaryDirectory() as local:
    for item in tokenizer_dir.iterdir():
      (epath.Path(local) / item.name).write_bytes(item.read_bytes())
    return tokenizer_identity(AutoTokenizer.from_pretrained(local))


def score_resumable(evaluator: Evaluator, params, td: TaskData, store: results.ChunkStore, chunk_rows: int,
                    progress: Progress) -> CandidateScores:
  """Scores `td` chunk by chunk, reusing finished chunks of the same run. Only process 0 reads and writes the
  store (an output directory local to worker 0 works too); every process gets its decisions and arrays."""
  num_rows = len(td.rows["tokens"])
  chunks = [(start, min(start + chunk_rows, num_rows)) for start in range(0, num_rows, chunk_rows)]
  mismatch = store.mismatch() if jax.process_index() == 0 else None
  if _from_process_0(np.array(mismatch is not None)):
    raise EvalError(mismatch or "process 0 refused the output directory (see its log)")
  done = _from_process_0(np.array([jax.process_index() == 0 and store.done(i) for i in range(len(chunks))]))
  todo_rows = sum(stop - start for (start, stop), d in zip(chunks, done) if not d)
  if done.any():
    logging.info("%s/%s: resuming, %d of %d chunks done, scoring %d rows", td.task, td.modality, int(done.sum()),
                 len(chunks), todo_rows)
  nll_sum, n_tokens = [], []
  scorer = evaluator.scorer(td)
  for i, (start, stop) in enumerate(chunks):
    if done[i]:
      empty = (np.zeros((stop - start, td.shape.max_slots)), np.zeros((stop - start, td.shape.max_slots), np.int64))
      part = tuple(_from_process_0(x) for x in (store.load(i) if jax.process_index() == 0 else empty))
    else:
      rows = {k: v[start:stop] for k, v in td.rows.items()}
      part = scorer.score(evaluator.params_adapter(params), rows, progress=False)
      unscored = (rows["slot_item"] >= 0) & (part[1] == 0)
      if unscored.any():  # never save (and so resume from) a chunk that lost candidates
        raise EvalError(f"{td.task}/{td.modality} rows {start}-{stop - 1}: {int(unscored.sum())} laid candidates "
                        "scored no tokens; nothing was saved")
      if jax.process_index() == 0:
        store.save(i, *part)
      progress.update(stop - start, int((rows["segment_ids"] > 0).sum()))
    nll_sum.append(part[0])
    n_tokens.append(part[1])
  return collect(td.rows, np.concatenate(nll_sum), np.concatenate(n_tokens), td.candidates_per_item)


def _from_process_0(value: np.ndarray) -> np.ndarray:
  return np.asarray(multihost_utils.broadcast_one_to_all(value)) if jax.process_count() > 1 else np.asarray(value)


def run_names(paths: list[str]) -> list[str]:
  """A readable, distinct name per checkpoint: its folder name, with as many parent folders as it takes to tell
  apart checkpoints that share one (runA/ckpt-100, runB/ckpt-100)."""
  parts = [os.path.normpath(p.split("://", 1)[-1]).split(os.sep) for p in paths]
  for depth in range(1, max(map(len, parts)) + 1):
    names = ["/".join(p[-depth:]) for p in parts]
    if len(set(names)) == len(names):
      return names
  raise EvalError(f"--checkpoint lists the same checkpoint twice: {paths}")


def run(task_names: list[str], modalities: list[str], checkpoints: str | None, spec: str, data_dir: str | None,
        output_dir: str, mesh_spec: str, batch_size: int, dtype, row_length: int, chunk_rows: int,
        attention: str = "auto", tensorboard: bool = False, variants: Variants = Variants()) -> list[dict]:
  is_default = not checkpoints and spec == "demo" and data_dir is None
  paths = resolve_checkpoints(checkpoints)
  from tasks.prepare import default_data_dir

  data_dir = data_dir or default_data_dir()
  data = [ensure_data(data_dir, t, m, spec, row_length, os.path.join(paths[0], "tokenizer"), is_default, variants)
          for t in task_names for m in modalities]
  mesh = sharding.make_mesh(mesh_spec)
  evaluator, runs = None, []
  total_rows = len(paths) * sum(len(td.rows["tokens"]) for td in data)
  progress = Progress(total_rows, log=lambda s: logging.info("%s", s))
  for path, name in zip(paths, ["SmolLM2-135M (demo)"] if is_default else run_names(paths)):
    full_path = path if "://" in path else os.path.abspath(path)
    config, params = load_model(path, data, mesh, dtype)
    identity = _tokenizer_identity(path)
    for td in data:
      check_fit(config, td, identity)
    if evaluator is None or evaluator.config != config:
      evaluator = Evaluator(config, data, mesh=mesh, batch_size=batch_size, dtype=dtype,
                            attention=pick_attention(attention, data))
    arrays = {}
    for td in data:
      store = results.ChunkStore(os.path.join(output_dir, "chunks", _safe(name), f"{td.task}-{td.modality}"), {
        "checkpoint": full_path, "dtype": jnp.dtype(dtype).name, "chunk_rows": chunk_rows, "data": td.fingerprint})
      start = time.time()
      scores = score_resumable(evaluator, params, td, store, chunk_rows, progress)
      arrays[(td.task, td.modality)] = metrics.question_arrays(td.questions, scores.nll_sum, scores.n_tokens)
      m = metrics.task_metrics(td.kind, arrays[(td.task, td.modality)])
      if jax.process_index() == 0:
        print(f"{name} {td.task} {td.modality}: accuracy {100 * m['accuracy']:.1f}% "
              f"[{100 * m['accuracy_ci95'][0]:.1f}, {100 * m['accuracy_ci95'][1]:.1f}] over {m['comparisons']} "
              f"comparisons, loss +{m['positive_loss']:.3f} / -{m['negative_loss']:.3f} ({time.time() - start:.1f}s)",
              flush=True)
        results.write_jsonl(os.path.join(output_dir, _safe(name), f"{td.task}-{td.modality}.scores.jsonl"),
                            results.scores_lines(td.questions, arrays[(td.task, td.modality)]))
    summary = summarize(data, arrays)
    runs.append({"name": name, "path": full_path,
                 "step": step_of(path) if not is_default else None,
                 "tasks": {k: v for k, v in summary.items() if k != "degradation"},
                 "degradation": summary.get("degradation", {})})
    if jax.process_index() == 0:
      write_outputs(output_dir, runs, spec, row_length)
      if tensorboard:
        results.write_tensorboard(output_dir, runs[-1], runs[-1]["step"] if runs[-1]["step"] is not None else len(runs) - 1)
  return runs


def pick_attention(choice: str, data: list[TaskData]) -> str:
  """auto: the TPU flash kernel where rows have no shared prefixes, else `jax.nn.dot_product_attention` (cuDNN's
  fused kernel on GPU; on CPU XLA's lowering of it ran 10% faster than our einsums at L=1024, 2.5x at 2048)."""
  if choice != "auto":
    return choice
  if jax.default_backend() == "tpu" and all(not td.metadata["share_prefix"] for td in data):
    return "flash"
  return "dot_product"


def write_outputs(output_dir: str, runs: list[dict], spec: str, row_length: int) -> None:
  """metrics.json, the Table 1 files and the curves, redrawn after every checkpoint."""
  results.write_json(os.path.join(output_dir, "metrics.json"), {"spec": spec, "row_length": row_length, "runs": runs})
  results.write_tables(output_dir, runs)
  results.plot_curves(output_dir, runs)


def _safe(name: str) -> str:
  return re.sub(r"[^\w.\-]+", "_", name).strip("_")


def define_flags() -> None:
  flags.DEFINE_enum("task", "all", list(TASKS) + ["all"], "Benchmark task.")
  flags.DEFINE_enum("modality", "both", ["text", "speech", "both"], "Prefix modality (both: with degradation).")
  flags.DEFINE_string("checkpoint", None, "s2sjax checkpoint dir, glob, or comma-separated list (default: demo).")
  flags.DEFINE_string("spec", "demo", "Speech-LLM spec the data was built with.")
  flags.DEFINE_string("data_dir", None, "Built datasets (default: ~/.cache/s2sjax/data, bundled sample).")
  flags.DEFINE_string("output_dir", "outputs/eval", "Where results go; rerunning into it resumes.")
  flags.DEFINE_string("mesh", "data:-1", "Mesh axes, e.g. data:-1,model:2 or data:2,fsdp:4.")
  flags.DEFINE_integer("batch_size", 8, "Rows per step (rounded up to the data-parallel devices).", lower_bound=1)
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute and parameter dtype.")
  flags.DEFINE_integer("row_length", 1024, "Packed row length of the built data.", lower_bound=1)
  flags.DEFINE_bool("share_prefix", True, "Read the data built with shared prefixes (False: the -noshare build).")
  flags.DEFINE_bool("reference_language_quirk", False, "Read the -zhquirk build (tasks.prepare's flag of that name).")
  flags.DEFINE_enum("overlong", "error", ["error", "truncate_prefix"], "Read the build with this overlong policy.")
  flags.DEFINE_integer("chunk_rows", 32, "Rows per resumable chunk.", lower_bound=1)
  flags.DEFINE_enum("attention", "auto", ["auto", "xla", "dot_product", "flash"],
                    "Attention kernel: auto = flash on TPU for -noshare data, else dot_product.")
  flags.DEFINE_bool("tensorboard", False, "Also write TensorBoard scalars to OUTPUT/tensorboard (tensorboardX).")
  flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() first (TPU pods, multi-host GPU).")
  flags.DEFINE_string("coordinator_address", None, "With --distributed off a managed cluster: host:port of process 0.")
  flags.DEFINE_integer("num_processes", None, "With --coordinator_address: how many processes.")
  flags.DEFINE_integer("process_id", None, "With --coordinator_address: this process's index.")
  flags.DEFINE_enum("cpu_collectives", None, ["gloo", "mpi"], "CPU collectives for multi-process runs on CPUs.")


def main(argv):
  del argv
  if FLAGS.cpu_collectives:
    jax.config.update("jax_cpu_collectives_implementation", FLAGS.cpu_collectives)
  if FLAGS.distributed:  # TPU VMs and managed clusters find their peers; elsewhere name the coordinator
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  tasks = list(TASKS) if FLAGS.task == "all" else [FLAGS.task]
  modalities = ["text", "speech"] if FLAGS.modality == "both" else [FLAGS.modality]
  local = lambda path: path and os.path.expanduser(path)  # "--flag=~/x" reaches us unexpanded
  variants = Variants(FLAGS.share_prefix, FLAGS.reference_language_quirk, FLAGS.overlong)
  runs = run(tasks, modalities, FLAGS.checkpoint, FLAGS.spec, local(FLAGS.data_dir), local(FLAGS.output_dir),
             FLAGS.mesh, FLAGS.batch_size, jnp.dtype(FLAGS.dtype), FLAGS.row_length, FLAGS.chunk_rows, FLAGS.attention,
             FLAGS.tensorboard, variants)
  if jax.process_index() != 0:
    return
  for run_ in runs:
    for task, report in run_["degradation"].items():
      print(f"{run_['name']} {task}: T→T {100 * report['text_accuracy']:.1f}% vs S→T "
            f"{100 * report['speech_accuracy']:.1f}%: degradation {100 * report['degradation']:.1f} points "
            f"(McNemar p = {report['mcnemar']['p_value']:.3g})")
  print(f"results in {FLAGS.output_dir}: metrics.json, table.md, table.csv, <checkpoint>/*.scores.jsonl")


if __name__ == "__main__":
  define_flags()
  app.run(main)
