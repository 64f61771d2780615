r"""Builds the packed rows of S2SBench tasks.

  python -m tasks.prepare --task=TASK|all --spec=demo --modality=t2t,s2t,t2s,s2s|both|all \
      [--protocol=s2sbench,utterance] [--row_length=N] [--manual_dir=RELEASE] [--data_dir=DIR] [--tokenizer_dir=DIR] [--audio_tokenizer_dir=DIR] \
      [--skip_bad] [--max_item_tokens=N] [--noshare_prefix] [--reference_language_quirk] \
      [--overlong=error|truncate_prefix] [--shapes=auto|windows|buckets]

Without --manual_dir the bundled sample is built. Each build prints its throughput and packing, and lists every
question it left out (--skip_bad) with the reason, and every problem of a file as a whole. No question is built
whose prefix and candidate read more positions than the model was trained to (where its tokenizer folder says
so: the converted checkpoint's model_config.json, a transformers folder's config.json, tokenizer_config.json's
model_max_length) or than --max_item_tokens: it is refused naming it, or left out and counted with --skip_bad.
Built data is reused only when it was built from the same inputs (release files, spec, text and audio
tokenizers); otherwise prepare refuses, unless --overwrite. --overwrite builds the new data beside the old (a
hidden `.rebuild-*` folder of the data dir) and swaps it in only once it is complete: a rebuild that fails leaves
the earlier build as it was. Two runs building one config into one data dir at once take turns: the second waits
for the first's build (a lock beside it names the holder) and reuses it. SIGINT or SIGTERM stops a run within
seconds: the builds complete are kept, the one under way leaves nothing, and one line says which and how to go on.

Every build of a run shares one instance of each audio tokenizer, which tokenizes each recording once (S->T and
S->S share their spoken prefixes) and compiles each shape once (`--shapes`: tasks/audio/jax_tokenizer.py); the
last line gives the whole run's audio seconds, audio s/s, and the tokenizer programs compiled or loaded from the
persistent compilation cache.

With --distributed (JAX's multi-process runtime, as `s2sjax.eval --distributed`: --coordinator_address,
--num_processes, --process_id off a managed cluster) each process tokenizes its share of the recordings
(`items[process_index::process_count]`) and receives the others'; process 0 alone writes the builds, which hold
what one process would build (the same rows, the same metadata but for the timings).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile

from absl import flags

from s2sjax.data import task_registry, builds
from s2sjax.runtime import cli, peers
from s2sjax.runtime.errors import UserError
from tasks import audio
from tasks.audio.jax_tokenizer import SHAPE_POLICIES, compile_line
from tasks.preparation import default_data_dir, prepare_build, will_build
from tasks.release import task_paths
from tasks.tfds_builder import resolve_manual_dir

FLAGS = flags.FLAGS


def define_flags() -> None:
  builds.define_flags()  # task, spec, modality, protocol, row length, variants: the builds made
  flags.DEFINE_string("data_dir", None, "Where built datasets go (default: ~/.cache/s2sjax/data).")
  flags.DEFINE_string("manual_dir", None, "The S2SBench release directory (default: the bundled sample).")
  flags.DEFINE_string("tokenizer_dir", None,
                      "Text tokenizer directory (default: the default model's for --spec=demo, else "
                      "MANUAL_DIR/tokenizer).")
  flags.DEFINE_bool("trust_remote_code", False, "Run a text tokenizer shipped as code (GLM-4-Voice's); read it first.")
  flags.DEFINE_string("audio_tokenizer_dir", None, "Files of the audio tokenizer (precomputed codes, HuBERT, Mimi).")
  flags.DEFINE_bool("skip_bad", False, "Leave bad questions out (listed with reasons) instead of failing.")
  flags.DEFINE_integer("max_item_tokens", None, "The most positions a question's prefix and candidate may read "
                       "(default: the model's trained positions, where its tokenizer folder says them); longer ones "
                       "are refused, or left out with --skip_bad.", lower_bound=1)
  flags.DEFINE_bool("overwrite", False, "Rebuild even if the data exists.")
  peers.define_flags()
  flags.DEFINE_enum("shapes", "auto", SHAPE_POLICIES, "How JAX audio tokenizers pad batches: buckets (least "
                    "padding, many shapes), windows (a few fixed shapes), auto (buckets on a CPU, windows on "
                    "accelerators).")


def main(argv):
  del argv
  tasks = [FLAGS.task]
  if FLAGS.task == "all":  # every task the release holds (S2SBench's has no tStoryCloze, the replica does)
    release = resolve_manual_dir(FLAGS.manual_dir)
    tasks = [t for t in task_registry.names() if os.path.exists(task_paths(t, release)[0])]
    for task in task_registry.names():
      if task not in tasks:
        print(f"{task}: {task_paths(task, release)[0]} does not exist, left out")
  selected = builds.from_flags(tasks)
  tokenizer_dir = FLAGS.tokenizer_dir
  if tokenizer_dir is None and FLAGS.spec == "demo":  # the embedded default model's (converted on first use)
    # Imported here: converting the default model is the only model code a build runs, and only without a tokenizer
    from s2sjax.commands.default_checkpoint import default_checkpoint
    tokenizer_dir = os.path.join(default_checkpoint(), "tokenizer")
  builder_kwargs = dict(tokenizer_dir=tokenizer_dir, audio_tokenizer_dir=FLAGS.audio_tokenizer_dir,
                        skip_bad=FLAGS.skip_bad, trust_remote_code=FLAGS.trust_remote_code,
                        max_item_tokens=FLAGS.max_item_tokens, audio_shapes=FLAGS.shapes)
  data_dir = FLAGS.data_dir or default_data_dir()
  process = _start_processes()
  # a distributed run's other processes build beside process 0, in a scratch folder, only what it builds: each
  # tokenizes its share of the recordings and gets the others' (tasks/audio/jax_tokenizer.py)
  scratch = tempfile.mkdtemp(prefix="s2sjax-prepare-peer-") if process else None
  complete, current = [], None  # "task/config" of the builds done (built or reused), and of the one under way
  try:
    for selector in selected:
      current = f"{selector.task}/{selector.config}"
      if FLAGS.distributed and not _agreed_build(selector, data_dir, builder_kwargs) and process:
        continue
      metadata = prepare_build(selector, scratch or data_dir, FLAGS.manual_dir, FLAGS.overwrite, **builder_kwargs)
      complete.append(current)
      if process:
        continue
      report = {k: v for k, v in metadata.report.items() if k not in ("skipped_questions", "file_problems")}
      file_problems = metadata.report["file_problems"]
      print(f"{selector.task} {selector.config}: {json.dumps(dict(report, file_problems=len(file_problems)))}")
      for problem in file_problems:
        print(f"  file problem {problem['where']}: {problem['why']}")
      for skipped in metadata.report["skipped_questions"]:
        print(f"  left out {skipped['where']}: {skipped['why']}")
    done = audio.shared_report()
    if done["tokenizers"]:
      print(f"process {process}: " * FLAGS.distributed + audio_line(done))
  except cli.Interrupted as e:
    unfinished = current if current not in complete else None
    e.message = _interrupted_line(e.signum, data_dir, complete, unfinished, FLAGS.overwrite)
    raise
  finally:
    if scratch:
      shutil.rmtree(scratch, ignore_errors=True)


def _start_processes() -> int:
  """This process's index among a distributed run's (`--distributed`: JAX's multi-process runtime, as
  `s2sjax.eval --distributed`); 0 alone."""
  if not (FLAGS.distributed or FLAGS.cpu_collectives):
    return 0
  import jax

  peers.start_from_flags()
  return jax.process_index()


class PeerRefusedError(UserError, ValueError):
  """Process 0 of a distributed prepare refused a build: its own error names why."""


def _agreed_build(selector, data_dir: str, builder_kwargs: dict) -> bool:
  """Whether process 0 builds `selector` (True) or reuses its finished build, told to every process; a build
  process 0 refuses (made from other inputs) stops every process."""
  import jax
  import numpy as np
  from jax.experimental import multihost_utils

  decision, refusal = np.int32(-1), None
  if jax.process_index() == 0:
    try:
      decision = np.int32(will_build(selector, data_dir, FLAGS.manual_dir, FLAGS.overwrite, **builder_kwargs))
    except UserError as e:
      refusal = e
  decision = int(multihost_utils.broadcast_one_to_all(decision))
  if refusal is not None:
    raise refusal
  if decision < 0:
    raise PeerRefusedError(f"{selector.task} {selector.config}: process 0 refused this build (its error says why)")
  return bool(decision)


def audio_line(done: dict) -> str:
  """The whole run's audio tokenizing (`tasks.audio.shared_report`): what was tokenized, reused across builds,
  and compiled."""
  rate = done["audio_seconds"] / max(done["seconds"], 1e-9)
  return (f"audio: {done['audio_seconds']:,.1f} audio s tokenized in {done['seconds']:,.1f}s ({rate:,.1f} audio "
          f"s/s), {done['reused']} recordings' codes reused across builds; "
          f"{compile_line(done, done['policy'])}")


def _interrupted_line(signum: int, data_dir: str, complete: list[str], unfinished: str | None,
                     overwrite: bool) -> str:
  """What a SIGINT / SIGTERM leaves: the builds complete are kept; the one under way is not (TFDS removes its
  `incomplete.*` folder, an --overwrite its hidden rebuild, the build lock is released as its block ends)."""
  kept = (f"kept {len(complete)} complete build{'s' * (len(complete) > 1)} in {data_dir} ({', '.join(complete)})"
          if complete else f"no build in {data_dir} was complete yet")
  left = ""
  if unfinished:
    left = f"; {unfinished} was not finished and nothing of it is kept"
    if overwrite:
      left += " (its earlier build, if any, is as it was)"
  resume = ("rerun the same command to go on (--overwrite builds every config again)" if overwrite else
            "rerun the same command to build only the rest (complete builds are reused)")
  return f"interrupted by {signal.Signals(signum).name}: {kept}{left}; {resume}"


def command_line() -> None:
  """`python -m tasks.prepare`."""
  with cli.setting_up():
    define_flags()
    usage = builds.usage(__doc__)
  cli.run(main, usage, flag_modules=(__name__, builds.__name__))


if __name__ == "__main__":
  command_line()
