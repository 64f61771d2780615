r"""Evaluates speech-LLM checkpoints on S2SBench: T->T, S->T, T->S, S->S and the degradation between them.

  python -m s2sjax.eval --task=TASK|all --modality=t2t,s2t,t2s,s2s|both|all \
      [--protocol=s2sbench,utterance] [--checkpoint=DIR|GLOB|A,B,C] [--spec=demo] [--data_dir=DIR] [--output_dir=DIR] [--mesh=data:-1,model:1] \
      [--batch_size=8] [--dtype=float32|bfloat16] [--row_length=N] [--chunk_rows=32] [--step_pattern=REGEX] \
      [--attention=auto|xla|dot_product|cudnn|flash|flash_shared] [--noshare_prefix] [--overlong=truncate_prefix] \
      [--noverify_checkpoint] [--noverify_data] [--accept_config_change]

TASK: a task of the registry (s2sjax/data/task_registry.py), plugins' included. With only task and modality it runs the
embedded default: the bundled sample (built on first use) and SmolLM2-135M-Instruct (its Q4_1 GGUF, converted on
first use; both cached in $S2SJAX_CACHE, default ~/.cache/s2sjax) with an untrained audio table, so its S->T shows
what a text LM that never learned audio does (its spoken candidates are units it never learned either). Several
checkpoints of one run (a glob or a list) give curves over steps, each step read from its folder's name
(s2sjax/scoring/checkpoints/paths.py; --step_pattern for other names). Rerunning into the same --output_dir scores only what
is missing, and refuses chunks another checkpoint, dtype, chunking or data made; SIGINT (Ctrl-C) or SIGTERM stops a
run within seconds, keeping its finished chunks, writing the summaries of what is complete and releasing the lock,
so a rerun goes on. What is read is held to what wrote it: the checkpoint's parameters and config
(--noverify_checkpoint skips the parameter pass; --accept_config_change accepts an edited config), the built data's
record and checksums (--noverify_data skips the checksums), each scores file to its chunks. --noshare_prefix,
--reference_language_quirk and --overlong pick the build `tasks.prepare` made with those flags (flash needs rows
without shared prefixes; flash_shared takes shared ones in two cascaded passes).

This module is the command line and the wiring of the three packages (it builds the bundled sample through
`tasks` and converts the default model through `checkpoints_conversion`), so it sits in `s2sjax/commands/`, apart
from the core; the work is done by `Evaluator` (scoring), `chunk_store` (resume) and `reports` (files).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time

import jax
import numpy as np
from absl import flags, logging
from etils import epath

from s2sjax.scoring import architectures, default_model, planner
from s2sjax.scoring.checkpoints import paths as checkpoint_paths
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.data import task_registry, builds, metrics, modalities, text_tokenizer
from s2sjax.runtime import cache, cli, peers, sharding
from s2sjax.results import flips, reports
from s2sjax.results.chunk_store import ChunkStore, score_resumable
from s2sjax.commands.default_checkpoint import default_checkpoint
from s2sjax.scoring.evaluator import EvalError, Evaluator, ScoringOptions, check_fit
from s2sjax.data.metrics import summarize
from s2sjax.model.attention import ATTENTION_IMPLEMENTATIONS, auto_implementation
from s2sjax.runtime.output_dir import OutputError, RunLock
from s2sjax.data.questions import QuestionScores
from s2sjax.runtime.progress import Progress
from s2sjax.scoring.checkpoints.stacks import maxtext_config
from s2sjax.data.task_data import MissingDataError, TaskData, load_build
from tasks import preparation
from tasks.sample.smoke import smoke_tasks, write_smoke_release

FLAGS = flags.FLAGS
# What --smoke changes unless given: every modality; one row length for every build, so one compiled step scores
# them all (auto lengths would be three: 1024, 2048, 4096); a step of one row, as each build is a row or two and
# a batch of 8 would score 7 rows of padding (the smoke's 16 builds took 8 min so, on a 2-core CPU)
SMOKE_DEFAULTS = {"modality": "all", "output_dir": "outputs/smoke", "row_length": 1024, "batch_size": 1}
DEMO_NAME = "SmolLM2-135M-Instruct (demo)"


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Everything one `run` needs. `scoring` is what an in-training `Evaluator` takes too."""

  tasks: tuple[str, ...]
  modalities: tuple[str, ...] = ("t2t", "s2t")  # names of s2sjax.data.modalities
  protocols: tuple[str, ...] = ("s2sbench",)  # how S->S is scored (tasks/build.py); the others are s2sbench's
  checkpoints: str | None = None  # dirs, globs, comma-separated; None: the embedded default model
  spec: str = "demo"
  data_dir: str | None = None  # None: the default cache (with the bundled sample built on first use)
  output_dir: str = "outputs/eval"
  mesh: str = "data:-1"
  row_length: int | None = builds.AUTO  # the build whose rows' length was chosen from its items (`-auto`)
  chunk_rows: int = 32
  variants: builds.Variants = builds.Variants()
  tensorboard: bool = False
  scoring: ScoringOptions = ScoringOptions(attention="auto")
  tokenizer_dir: str | None = None  # for a checkpoint without tokenizer/ (one with its own may use it too)
  verify_checkpoint: bool = True  # hold every parameter leaf against the checksum written with it
  verify_data: bool = True  # hold the built rows and question table against the checksums written with them
  accept_config_change: bool = False  # score a model_config.json (or tokenizer files) edited after conversion
  step_pattern: str | None = None  # a regex whose first group reads the step from a checkpoint's folder name
  break_lock: bool = False  # take the output directory from a run that died on another host
  trust_remote_code: bool = False  # run a tokenizer shipped as code (GLM-4's)
  ties: str | None = None  # metrics.TIE_RULES: how a tie counts; None: each task's own rule
  smoke: bool = False  # the embedded default on the smoke release (tasks/sample/smoke.py), data of its own
  maxtext_config: maxtext_config.RunConfig | None = None  # MaxText checkpoints' run config (--maxtext_config)

  @property
  def selectors(self) -> list[builds.DataSelector]:
    """The builds the run scores: every protocol for S->S, s2sbench's for the rest (`builds.selectors`)."""
    return builds.selectors(self.tasks, self.modalities, self.protocols, self.spec, self.row_length, self.variants)

  @property
  def is_default(self) -> bool:
    """The embedded default: no checkpoint, the demo spec, the default data (built on first use)."""
    return not self.checkpoints and self.spec == "demo" and self.data_dir is None

  def default_data_dir(self) -> str:
    """Where the embedded default's data is built: the bundled sample's, or the smoke release's apart."""
    return os.path.join(cache.cache_dir(), "smoke", "data") if self.smoke else preparation.default_data_dir()

  def release_dir(self) -> str | None:
    """The release the embedded default builds from (None: the bundled sample)."""
    return write_smoke_release(os.path.join(cache.cache_dir(), "smoke", "release")) if self.smoke else None


def ensure_data(cfg: EvalConfig, data_dir: str, selector: builds.DataSelector, tokenizer_dir: str) -> TaskData:
  try:
    return load_build(data_dir, selector, cfg.verify_data)
  except MissingDataError:
    if not cfg.is_default:
      raise
  # the embedded default builds the bundled sample on first use
  logging.info("building the bundled sample: %s %s", selector.task, selector.modality)
  preparation.prepare_build(selector, data_dir, cfg.release_dir(), tokenizer_dir=tokenizer_dir)
  return load_build(data_dir, selector, cfg.verify_data)


def load_model(reader, data: list[TaskData], mesh, dtype, verify: bool = True):
  """Config and params of one opened checkpoint (`checkpoint.open`: config hash and parameter checksums verified,
  a MaxText folder's arrays held to their shard indexes and to finite values), fitted to the data's spec
  (`default_model.fit_to_spec`: for the embedded default, a unit spec's units become untrained vocabulary rows,
  whichever modalities run; `s2sjax.check` loads the same model). A checkpoint of another architecture
  (s2sjax/scoring/architectures) gives its own config and tree, which the Evaluator scores with that architecture's scorer."""
  if not data:
    raise EvalError("no task data to score: nothing was built or asked for")
  params = reader.load_params(mesh, dtype, verify)
  return default_model.fit_to_spec(reader.config, params, data[0].metadata.spec, reader.manifest())


def pick_attention(choice: str, data: list[TaskData], dtype: str) -> str:
  """--attention, with `auto` resolved for all the data one run scores (`auto_implementation`): shared if
  any build shares prefixes, windowed only if every build records its longest item (one step may be dense)."""
  if choice != "auto":
    return choice
  return auto_implementation(any(td.metadata.variants.share_prefix for td in data),
                                    all(td.shape.max_item > 0 for td in data), dtype)


def run(cfg: EvalConfig, opened=None) -> list[dict]:
  """Scores every checkpoint on every task x modality, writing results as it goes. Returns what metrics.json
  holds on process 0 (every checkpoint scored into the output directory, earlier runs' included), and this
  invocation's checkpoints on the other processes. Each checkpoint is opened once (`checkpoint.open`), or is
  `opened` already (the one `cfg.checkpoints` names: s2sjax.watch's step)."""
  if not cfg.tasks:
    raise EvalError("no task to score (--task=all found none built in --data_dir): build them first with "
                    "python -m tasks.prepare --data_dir=DIR")
  paths = ([default_checkpoint()] if not cfg.checkpoints
           else checkpoint_paths.expand(cfg.checkpoints, cfg.step_pattern))
  missing = [path for path in paths if cfg.checkpoints and not epath.Path(path).exists()]
  if missing:  # said before the data is looked for: a mistyped path is the first thing to mend
    raise checkpoint.CheckpointError(f"--checkpoint {', '.join(missing)} does not exist")
  names = [DEMO_NAME] if cfg.is_default else checkpoint_paths.run_names(paths)
  steps = checkpoint_paths.steps(paths, cfg.step_pattern) if cfg.checkpoints else [None]  # the default has none
  chunk_rows = cfg.chunk_rows
  if chunk_rows < cfg.scoring.batch_size:  # every chunk would be padded to a whole batch of steps
    print(f"--chunk_rows={chunk_rows} is below --batch_size={cfg.scoring.batch_size}: raised to "
          f"{cfg.scoring.batch_size} (a chunk is scored in whole batches; fewer rows pad the rest)", flush=True)
    chunk_rows = cfg.scoring.batch_size
  cfg = dataclasses.replace(cfg, chunk_rows=chunk_rows)
  data_dir = cfg.data_dir or cfg.default_data_dir()
  data = [ensure_data(cfg, data_dir, selector, cfg.tokenizer_dir or os.path.join(paths[0], "tokenizer"))
          for selector in cfg.selectors]
  text_free = not data[0].metadata.spec.text_vocabulary  # a unit LM: no text tokenizer to hold the data against
  mesh = sharding.make_mesh(cfg.mesh)
  attention = pick_attention(cfg.scoring.attention, data, cfg.scoring.dtype)
  options = dataclasses.replace(cfg.scoring, attention=attention)
  with _output_lock(cfg), _summarized_when_interrupted(cfg):
    evaluator, runs = None, []
    for path, name, step in zip(paths, names, steps):
      reader = opened or checkpoint.open(path, cfg.maxtext_config, cfg.accept_config_change)
      identity = None if text_free else _tokenizer_identity(reader, cfg.tokenizer_dir, cfg.trust_remote_code)
      config, params = load_model(reader, data, mesh, options.jnp_dtype, cfg.verify_checkpoint)
      for td in data:
        check_fit(config, td, identity)
      planner.check_step_memory(config, [td.shape for td in data], options.batch_size, options.dtype, attention, mesh)
      if evaluator is None or evaluator.config != config:
        evaluator = Evaluator(config, data, options, mesh=mesh)
      record = {"name": name, "path": path if "://" in path else os.path.abspath(path), "step": step,
                "spec": cfg.spec, "row_length": cfg.row_length or "auto", "ties": cfg.ties}
      scores = _score_checkpoint(cfg, evaluator, params, data, record, reader.content_id())
      if jax.process_index() == 0:
        _write_flips(cfg, data, record, scores)
      summary = summarize(scores, cfg.ties)
      runs.append({**record, "tasks": {k: v for k, v in summary.items() if k != "degradation"},
                   "degradation": summary.get("degradation", {})})
      if jax.process_index() == 0:
        runs_so_far = reports.read_runs(cfg.output_dir)
        reports.write_summaries(cfg.output_dir, runs_so_far)
        if cfg.tensorboard:
          step = record["step"] if record["step"] is not None else len(runs) - 1
          reports.write_tensorboard(cfg.output_dir, runs[-1], step)
  return runs_so_far if jax.process_index() == 0 else runs


def _score_checkpoint(cfg: EvalConfig, evaluator: Evaluator, params, data: list[TaskData], record: dict,
                      content: str) -> dict[tuple[str, str], QuestionScores]:
  """Every task x modality of one checkpoint, resumable, each with its progress bar; each scores file is written
  as soon as it is done."""
  folder = checkpoint_paths.safe_name(record["name"])
  scores = {}
  for td in data:
    store = ChunkStore(reports.chunk_dir(cfg.output_dir, folder, td.task, td.label),
                       {"checkpoint": record["path"], "checkpoint_content": content,
                        "vocab_size": architectures.for_config(evaluator.config).text_rows(evaluator.config),
                        "step": evaluator.scorer(td).step_identity,
                        "dtype": evaluator.options.dtype, "chunk_rows": cfg.chunk_rows, "data": td.fingerprint})
    start = time.time()
    title = td.label.title
    progress = Progress(td.num_rows, f"{record['name']} {td.task} {title}")
    s, details = score_resumable(evaluator, params, td, store, cfg.chunk_rows, progress)
    scores[(td.task, td.label)] = s
    if jax.process_index() == 0:
      print(result_line(f"{record['name']} {td.task} {title}", metrics.task_metrics(td.benchmark, s, cfg.ties),
                        time.time() - start), flush=True)
      reports.write_run(os.path.join(cfg.output_dir, folder), record, {(td.task, td.label): s},
                        {(td.task, td.label): store}, {(td.task, td.label): details} if details else None)
  return scores


def result_line(scored: str, m: dict, seconds: float) -> str:
  """The console's line for one task x modality: accuracy with its interval, and the mean NLL of the right and of
  the wrong candidates (metrics.json's positive_loss and negative_loss)."""
  return (f"{scored}: accuracy {100 * m['accuracy']:.1f}% [{100 * m['accuracy_ci95'][0]:.1f}, "
          f"{100 * m['accuracy_ci95'][1]:.1f}] over {m['comparisons']} comparisons, loss right "
          f"{m['positive_loss']:.3f} / wrong {m['negative_loss']:.3f} ({seconds:.1f}s)")


def _write_flips(cfg: EvalConfig, data: list[TaskData], record: dict,
                 scores: dict[tuple[str, str], QuestionScores]) -> None:
  """Per task and pair of modalities scored now (s2sjax.data.modalities.COMPARISONS): the questions they decide
  differently, with texts and the spoken prefix's recording."""
  by_key = {(td.task, td.label): td for td in data}
  for task in dict.fromkeys(task for task, _ in scores):
    for reference, other in modalities.COMPARISONS:
      if (task, reference) not in scores or (task, other) not in scores:
        continue
      table, benchmark = by_key[(task, reference)].questions, by_key[(task, reference)].benchmark
      prefixes = dict(zip(table.ids, table.prefixes))
      audio_dir = os.path.join(str(by_key[(task, other)].metadata.source), benchmark.release_audio_dir)
      audio = {q: os.path.join(audio_dir, f"{uttids[0]}.wav") for q, uttids in zip(table.ids, table.uttids)}
      found = flips.find_flips(benchmark, scores[(task, reference)], scores[(task, other)])
      flips.write_flips(os.path.join(cfg.output_dir, checkpoint_paths.safe_name(record["name"])), task,
                        benchmark.title, (reference, other), found, prefixes, audio)


@contextlib.contextmanager
def _summarized_when_interrupted(cfg: EvalConfig):
  """On SIGINT or SIGTERM (`cli.Interrupted`), process 0 writes metrics.json and the tables for every task x
  modality scored in full, and the interruption's line says what was kept and how to resume; the lock is released
  as the block around this one ends."""
  try:
    yield
  except cli.Interrupted as e:
    if jax.process_index() == 0:
      reports.write_summaries(cfg.output_dir, reports.read_runs(cfg.output_dir))
      chunks = len(list(epath.Path(cfg.output_dir).glob("chunks/*/*/chunk-*.npz")))
      scored = len(list(epath.Path(cfg.output_dir).glob(f"*/*{reports.SCORES_SUFFIX}")))
      e.message = (f"interrupted by {signal.Signals(e.signum).name}: kept {chunks} finished chunks in "
                   f"{cfg.output_dir}/chunks; metrics.json and the tables cover the {scored} task x modality "
                   "scores files completed; rerun the same command to score only the rest")
    raise


@contextlib.contextmanager
def _output_lock(cfg: EvalConfig):
  """The output directory is this run's while the block runs: process 0 takes the lock (and so finds out at once
  whether it can write there), every process learns whether it got it."""
  with contextlib.ExitStack() as stack:
    refusal = None
    if jax.process_index() == 0:
      try:
        stack.enter_context(RunLock(cfg.output_dir, cfg.break_lock))
      except OutputError as e:
        refusal = e
    if sharding.from_process_0(np.array(refusal is not None)):
      raise refusal or OutputError("process 0 could not take the output directory (see its log)")
    yield


def _tokenizer_identity(reader, tokenizer_dir: str | None, trust_remote_code: bool) -> dict:
  """The identity of the tokenizer the checkpoint reads text with: its own, or --tokenizer_dir's. A checkpoint
  without one is refused: data built for another vocabulary would be scored silently. A tokenizer shipped as code
  runs only when the user says they trust it."""
  if reader.manifest().get("trust_remote_code") and not trust_remote_code:
    raise EvalError(f"{reader.path}'s tokenizer is remote code (converted with --trust_remote_code): read it, then "
                    "pass --trust_remote_code")
  if tokenizer_dir:
    return text_tokenizer.folder_identity(tokenizer_dir, trust_remote_code)
  identity = reader.tokenizer_identity(trust_remote_code)
  if identity is None:
    raise EvalError(f"{reader.path} holds no tokenizer/, so nothing tells which vocabulary its data must be built "
                    "with: pass --tokenizer_dir=DIR (the tokenizer the model was trained with)")
  return identity


def define_flags() -> None:
  builds.define_flags()  # task, spec, modality, protocol, row length, variants: the builds scored
  flags.DEFINE_bool("smoke", False, "Does everything run? The embedded default on every task in every modality "
                    "(--modality=all unless given), over the first 2 questions of each task of the bundled sample, "
                    "built apart in $S2SJAX_CACHE/smoke, results in outputs/smoke: minutes; the numbers mean nothing.")
  flags.DEFINE_string("checkpoint", None, "s2sjax checkpoint dir, glob, or comma-separated list (default: the "
                      "embedded SmolLM2-135M-Instruct, Q4_1 GGUF, with the demo spec).")
  maxtext_config.define_flag()
  flags.DEFINE_string("data_dir", None, "Built datasets (default: $S2SJAX_CACHE/data, ~/.cache/s2sjax/data when "
                      "unset: the bundled sample).")
  flags.DEFINE_string("output_dir", "outputs/eval", "Where results go; rerunning into it resumes.")
  flags.DEFINE_string("mesh", "data:-1", "Mesh axes, e.g. data:-1,model:2 or data:2,fsdp:4.")
  flags.DEFINE_integer("batch_size", 8, "Rows per step (rounded up to the data-parallel devices).", lower_bound=1)
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute and parameter dtype.")
  flags.DEFINE_integer("chunk_rows", 32, "Rows per resumable chunk.", lower_bound=1)
  flags.DEFINE_enum("attention", "auto", ["auto", *ATTENTION_IMPLEMENTATIONS],
                    "Attention kernel: auto = flash on TPU (flash_shared for prefix-shared data), cudnn on a GPU in "
                    "bf16, else xla over item-local windows and dot_product over whole rows "
                    "(auto_implementation).")
  flags.DEFINE_bool("tensorboard", False, "Also write TensorBoard scalars to OUTPUT/tensorboard (tensorboardX).")
  flags.DEFINE_string("tokenizer_dir", None, "The model's text tokenizer, for a checkpoint without tokenizer/.")
  flags.DEFINE_bool("verify_checkpoint", True, "Hold every parameter leaf against its checksum (one device pass; "
                    "--noverify_checkpoint skips it on a trusted bucket).")
  flags.DEFINE_bool("verify_data", True, "Hold the built rows and question table against their checksums (one pass; "
                    "--noverify_data skips it on a trusted bucket).")
  flags.DEFINE_bool("accept_config_change", False, "Score a checkpoint whose model_config.json or tokenizer files "
                    "were edited after conversion (refused otherwise).")
  flags.DEFINE_string("step_pattern", None, "Regex whose first group is the training step in a checkpoint's folder "
                      r"name, for names other than step_N, checkpoint-N, ckpt-N or N (e.g. 'ckpt-(\d+)-fp16').")
  flags.DEFINE_bool("trust_remote_code", False, "Run a tokenizer shipped as code (GLM-4-Voice's); read it first.")
  flags.DEFINE_enum("ties", None, list(metrics.TIE_RULES), "How a tie counts: reference (the decision rule's: wrong for "
                    "stories, right for sCMMLU), half (SlamKit's); default each task's own (half for SpokenStoryCloze).")
  flags.DEFINE_bool("break_lock", False, "Take the output directory from a run that died (its lock names it).")
  peers.define_flags()


def all_tasks(data_dir: str | None) -> list[str]:
  """`--task=all`: every task of the bundled sample (the tasks with text), or with --data_dir the ones built there
  (S2SBench's release has no tStoryCloze, for one), saying which are left out."""
  if data_dir is None:
    return smoke_tasks()
  built = [t for t in task_registry.names() if os.path.isdir(os.path.join(data_dir, t))]
  missing = [t for t in task_registry.names() if t not in built]
  if not built:
    raise EvalError(f"--task=all: no task is built in {data_dir}: build them with python -m tasks.prepare "
                    f"--data_dir={data_dir} (or name --task)")
  if missing:
    print(f"--task=all: {', '.join(missing)} not built in {data_dir}, left out", flush=True)
  return built


def config_from_flags() -> EvalConfig:
  local = lambda path: path and os.path.expanduser(path)  # "--flag=~/x" reaches us unexpanded
  if FLAGS.smoke and (FLAGS.checkpoint or FLAGS.data_dir or FLAGS.spec != "demo"):
    raise EvalError("--smoke runs the embedded default on its own data: leave out --checkpoint, --data_dir and "
                    "--spec (or drop --smoke)")
  smoke_default = lambda name, value: value if (not FLAGS.smoke or FLAGS[name].present) else SMOKE_DEFAULTS[name]
  return EvalConfig(
    tasks=tuple(all_tasks(local(FLAGS.data_dir)) if FLAGS.task == "all" else [FLAGS.task]),
    modalities=modalities.parse(smoke_default("modality", FLAGS.modality)), protocols=tuple(FLAGS.protocol),
    smoke=FLAGS.smoke,
    checkpoints=FLAGS.checkpoint, spec=FLAGS.spec, data_dir=local(FLAGS.data_dir),
    output_dir=local(smoke_default("output_dir", FLAGS.output_dir)), mesh=FLAGS.mesh,
    row_length=smoke_default("row_length", FLAGS.row_length),
    chunk_rows=FLAGS.chunk_rows,
    variants=builds.variants_from_flags(),
    tensorboard=FLAGS.tensorboard, tokenizer_dir=local(FLAGS.tokenizer_dir),
    verify_checkpoint=FLAGS.verify_checkpoint, verify_data=FLAGS.verify_data,
    accept_config_change=FLAGS.accept_config_change, step_pattern=FLAGS.step_pattern, break_lock=FLAGS.break_lock,
    trust_remote_code=FLAGS.trust_remote_code, ties=FLAGS.ties,
    maxtext_config=maxtext_config.from_flag(FLAGS.maxtext_config),
    scoring=ScoringOptions(batch_size=smoke_default("batch_size", FLAGS.batch_size), dtype=FLAGS.dtype,
                           attention=FLAGS.attention),
  )


def main(argv):
  del argv
  peers.start_from_flags()
  config = config_from_flags()
  runs = run(config)
  if jax.process_index() != 0:
    return
  for run_ in runs:
    for task, matrix in run_["degradation"].items():
      for key, report in matrix.items():
        other, _, reference = key.partition("_vs_")
        print(f"{run_['name']} {task}: {modalities.title(reference)} {100 * report['reference_accuracy']:.1f}% vs "
              f"{modalities.title(other)} {100 * report['accuracy']:.1f}%: degradation "
              f"{100 * report['degradation']:.1f} points (McNemar p = {report['mcnemar']['p_value']:.3g})")
  print(f"results in {config.output_dir}: metrics.json, table.md, table.csv, <checkpoint>/*.scores.jsonl"
        + (", <checkpoint>/<task>.<modality>_vs_<reference>.flips.md|html" if len(config.modalities) > 1 else ""))


def command_line() -> None:
  """`python -m s2sjax.eval`."""
  with cli.setting_up():
    define_flags()
    usage = builds.usage(__doc__)
  cli.run(main, usage, flag_modules=(__name__, builds.__name__))


if __name__ == "__main__":
  command_line()
