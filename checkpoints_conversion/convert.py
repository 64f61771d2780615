r"""Converts a PyTorch / GGUF checkpoint into an s2sjax (orbax) checkpoint.

  python -m checkpoints_conversion.convert --source=DIR_OR_GGUF --output=DIR \
      [--family=auto|FAMILY|LAYOUT] [--dtype=float32|bfloat16] [--trust_remote_code] [--verify]

The source's config.json `model_type` picks the family layout that reads it (`s2sjax.model.families`). `--family`
only checks that choice: `auto` takes any; a family name (qwen2, llama, glm4) any of that family's layouts; a
vendor layout name (baichuan_audio, chatglm) that layout only. The values are the registry's, so a family
registered through $S2SJAX_PLUGINS is accepted too.

Every key and shape is checked against the abstract target tree before anything is written; tensors are then
read, transformed and written one leaf at a time. Modules a layout knows scoring never runs (Baichuan-Audio's
audio tokenizer, vision towers) are left out without flags, listed in the manifest and named in the report the
command prints, with what each is and where a user gets it instead (`report`).

An architecture of its own (s2sjax/scoring/architectures) whose releases a converter of their own reads
(`own_converters.CONVERTERS`): `--family=NAME` names it. A release whose config.json `architectures` names a
modeling class that converter lists (its `release_classes`) goes to it with no flags, whatever family its
model_type names (Kimi-Audio's says qwen2).

A MaxText checkpoint folder (`<run>/checkpoints/<step>`, or a params-only one: s2sjax/scoring/checkpoints/stacks/maxtext.py) is read
as MaxText wrote it, with `--maxtext_config` (the run config it was trained with, unless MaxText saved its
config.yml beside the run); the manifest records the run config and the checksum of every MaxText leaf read, and
the tokenizer is the run's `tokenizer_path` when that is a folder here.

A tokenizer that is remote code (tokenizer_config.json's `auto_map`, as GLM-4's `ChatGLM4Tokenizer`) is run only
with --trust_remote_code; its code and model files are then copied with the checkpoint, as the source ships them.

SIGINT or SIGTERM stops a conversion within seconds, its partial files removed (a checkpoint it was to replace is
kept as it was), and one line says so; a rerun converts from the start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Iterator, Sequence

import jax.numpy as jnp
import numpy as np
from absl import flags, logging

from checkpoints_conversion import own_converters, verify
from checkpoints_conversion.sources import TensorSource, open_source
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.model import families
from s2sjax.runtime import cli
from s2sjax.data import text_tokenizer
from s2sjax.runtime.errors import UserError
from s2sjax.model.families.keymap import Rule, check_rules
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import abstract_params
from s2sjax.runtime.progress import Progress
from s2sjax.runtime.registry import load_object
from s2sjax.scoring.checkpoints.stacks import maxtext, maxtext_config

TOKENIZER_FILES = (
  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
  "tokenizer.model", "added_tokens.json",
)


class ConversionError(UserError, ValueError):
  """The source does not fit the target: every problem found is listed."""


@dataclasses.dataclass
class Plan:
  source: TensorSource
  model_type: str
  layout: families.Layout
  config: ModelConfig
  rules: list[Rule]
  kept: list[str]
  skipped: list[str]  # by --skip_prefix and by the layout's own skipped_prefixes
  skipped_modules: dict[str, int]  # the layout's skipped prefixes found in the source: how many keys each


INTERRUPTS = (signal.SIGINT, signal.SIGTERM)  # what s2sjax.runtime.cli turns into cli.Interrupted


def converted_architectures() -> tuple[str, ...]:
  """Architectures whose releases a converter of their own reads (their own parameter tree and source layout)."""
  return tuple(own_converters.CONVERTERS.names())


def family_choices() -> tuple[str, ...]:
  """--family's values: auto, then the registry's families and vendor layouts, then the architectures that convert
  their own releases."""
  return ("auto",) + families.layout_choices() + converted_architectures()


def release_converter(source_path: str) -> str | None:
  """The converter ("module:function") of a release folder whose config.json names a modeling class an own
  converter's `release_classes` list, or None."""
  try:
    with open(os.path.join(source_path, "config.json")) as f:
      config = json.load(f)
  except (OSError, ValueError):
    return None  # not such a release: the readers of every other layout say what is wrong with it
  own = own_converters.for_release(config) if isinstance(config, dict) else None
  return own.convert if own else None


def _source_layout(source: TensorSource, family: str) -> tuple[str, families.Layout]:
  """The source's model_type and the layout that reads it, checked against --family."""
  model_type = source.config.get("model_type")
  if family not in family_choices():
    raise ConversionError(f"unknown --family {family!r}; supported: {', '.join(family_choices())}")
  if model_type not in families.model_types(None if family == "auto" else family):
    raise ConversionError(
      f"{source.description}: model_type {model_type!r} is not supported for --family={family}; "
      f"supported families (config model_type): {families.describe()}"
    )
  return model_type, families.layout_for_model_type(model_type)


def plan_conversion(source: TensorSource, family: str = "auto", skip_prefixes: Sequence[str] = ()) -> Plan:
  """Checks every key and shape of the source against the target tree; raises ConversionError listing all
  missing, unexpected and mis-shaped keys. Reads no tensor data."""
  model_type, layout = _source_layout(source, family)
  config = layout.parse_config(source.config)
  rules = layout.rules(config, source.config)
  abstract = dict(checkpoint.flatten(abstract_params(config)))
  problems, rest = check_rules(set(abstract), rules, {key: source.shape(key) for key in source.keys()})
  ignored = [k for k in rest if k.endswith(layout.ignored_suffixes)]
  kept = [k for k in rest if k.startswith(layout.kept_prefixes)]
  left_out = tuple(layout.skipped_modules(source.config))
  skipped = [k for k in rest if k.startswith(tuple(skip_prefixes) + left_out)]
  modules = {p: sum(k.startswith(p) for k in skipped) for p in left_out}
  unexpected = sorted(set(rest) - set(ignored) - set(kept) - set(skipped))
  if unexpected:
    shown = "\n    ".join(unexpected[:50]) + ("\n    ..." if len(unexpected) > 50 else "")
    problems.append(
      f"{len(unexpected)} unexpected key(s) that no rule uses (pass --skip_prefix=... to leave them out "
      f"deliberately):\n    {shown}"
    )
  if problems:
    raise ConversionError(
      f"{source.description} does not fit a {config.family} target ({layout.name} layout of model_type "
      f"{model_type}):\n  " + "\n  ".join(problems)
    )
  return Plan(source, model_type, layout, config, rules, kept, skipped, {p: n for p, n in modules.items() if n})


class InterruptedAfterWriting(cli.Interrupted):
  """SIGINT or SIGTERM came as the checkpoint was being finished: it is written in full."""


@contextlib.contextmanager
def interrupts_between_leaves():
  """While a checkpoint is written, SIGINT / SIGTERM take effect between leaves: at the next leaf the writer asks
  for (write_checkpoint then removes its staging folder), or as InterruptedAfterWriting once the checkpoint is in
  place. A signal that stopped the main thread inside an orbax save would leave that save going on in orbax's
  threads, into the staging folder being removed (found half rewritten afterwards, with their tracebacks). Yields
  the wrapper of the leaf iterators. A second signal ends the process at once, as s2sjax.runtime.cli's does."""
  if threading.current_thread() is not threading.main_thread():  # only the main thread receives signals
    yield lambda leaves: leaves
    return
  held: list[int] = []

  def hold(signum, frame) -> None:
    del frame
    for each in INTERRUPTS:
      signal.signal(each, signal.SIG_DFL)
    held.append(signum)

  def between(leaves):
    for leaf in leaves:
      if held:
        raise cli.Interrupted(held[0])
      yield leaf

  previous = {each: signal.signal(each, hold) for each in INTERRUPTS}
  try:
    yield between
  finally:
    if not held:
      for each, handler in previous.items():
        signal.signal(each, handler if handler is not None else signal.SIG_DFL)
  if held:
    raise InterruptedAfterWriting(held[0])


def with_progress(leaves: Iterator[tuple[tuple[str, ...], np.ndarray]], total: int, description: str
                  ) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """The leaves, drawing progress as they are written (tensors, MB/s, ETA)."""
  progress = Progress(total, description, unit="tensors", rate_unit="MB")
  for path, array in leaves:
    yield path, array
    progress.update(1, array.nbytes // 2**20)


def iter_leaves(plan: Plan, dtype) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """(stored path, array) for each leaf in the checkpoint's disk layout (layers one at a time), reading only
  that leaf's source tensor."""
  abstract = dict(checkpoint.flatten(abstract_params(plan.config, param_dtype=dtype)))
  for index, rule in enumerate(plan.rules, 1):
    target = abstract[rule.target]
    layer_shape = rule.per_layer_shape(target.shape)
    logging.info("[%d/%d] %s %s %s", index, len(plan.rules), "/".join(rule.target), target.shape, target.dtype)
    for i, piece in enumerate(rule.pieces):
      path = ("layers", str(i)) + rule.target[1:] if rule.stacked else rule.target
      yield path, rule.to_target(plan.source.read(piece.key), piece, layer_shape).astype(target.dtype)


def _tokenizer_dir(source_path: str, vocab_size: int, staging: str,
                   trust_remote_code: bool = False) -> tuple[str | None, dict]:
  """A directory with the source's tokenizer, or None, and what the manifest records of it; checks the tokenizer
  fits the embedding. Transformers' own classes are re-saved; remote code is copied file for file."""
  out = os.path.join(staging, "tokenizer")
  if os.path.isfile(source_path):  # GGUF carries its tokenizer in its metadata
    from transformers import AutoTokenizer  # here, not above: a source without a tokenizer needs no torch import

    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(source_path), gguf_file=os.path.basename(source_path))
    code = []
  else:
    present = [name for name in TOKENIZER_FILES if os.path.exists(os.path.join(source_path, name))]
    if not present:
      logging.warning("%s has no tokenizer files: the checkpoint is written without tokenizer/, and evaluating it "
                      "needs --tokenizer_dir (the tokenizer it was trained with)", source_path)
      return None, {"note": "none in the source: evaluate with --tokenizer_dir"}
    # its code is copied with the checkpoint, and evaluating it needs the flag too
    code = text_tokenizer.check_trusted(source_path, trust_remote_code, f"{source_path}'s tokenizer")
    missing = [name for name in code if not os.path.exists(os.path.join(source_path, name))]
    if missing:
      raise ConversionError(f"{source_path}: tokenizer_config.json's auto_map names {missing}, which the folder lacks")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source_path, trust_remote_code=trust_remote_code)
  if len(tokenizer) > vocab_size:
    raise ConversionError(
      f"the tokenizer has {len(tokenizer)} tokens but the embedding table only {vocab_size} rows: "
      "ids beyond the table would be silently clamped"
    )
  record = {"class": type(tokenizer).__name__, "size": len(tokenizer), "remote_code": code}
  if code:  # the class's own save may not write its code: the folder is copied as the source ships it
    vocab_files = list(getattr(tokenizer, "vocab_files_names", {}).values())
    names = sorted(set(present + code + [n for n in vocab_files if os.path.exists(os.path.join(source_path, n))]))
    os.makedirs(out)
    for name in names:
      shutil.copy(os.path.join(source_path, name), out)
    record["files"] = names
  else:
    tokenizer.save_pretrained(out)
  return out, record


def convert(
  source_path: str,
  output: str,
  family: str = "auto",
  dtype: str = "float32",
  skip_prefixes: Sequence[str] = (),
  overwrite: bool = False,
  trust_remote_code: bool = False,
  maxtext_run_config: str | None = None,
) -> dict:
  """Converts and writes; returns the manifest (what was read, kept, skipped). `maxtext_run_config`: a MaxText
  source's run config (--maxtext_config)."""
  if family in converted_architectures():
    return load_object(own_converters.CONVERTERS.get(family).convert)(source_path, output, dtype, overwrite)
  if family == "auto" and (own := release_converter(source_path)):
    return load_object(own)(source_path, output, dtype, overwrite)
  if maxtext.is_step_folder(source_path):
    return convert_maxtext(source_path, output, dtype, overwrite, trust_remote_code,
                           maxtext_config.from_flag(maxtext_run_config))
  start = time.time()
  source = open_source(source_path)
  plan = plan_conversion(source, family, skip_prefixes)
  target_dtype = jnp.dtype(dtype)
  with tempfile.TemporaryDirectory() as staging:
    tokenizer_dir, tokenizer_record = _tokenizer_dir(source_path, plan.config.vocab_size, staging, trust_remote_code)
    manifest = {
      "source": os.path.abspath(source_path),
      "source_description": source.description,
      "source_model_type": plan.model_type,
      "source_config": source.config,
      "dtype": str(target_dtype),
      "kept_as_extras": plan.kept,
      "skipped": plan.skipped,
      "skipped_modules": plan.skipped_modules,
      "tokenizer": tokenizer_record,
      "trust_remote_code": trust_remote_code,
    }
    extras = ((tuple(key.split(".")), np.asarray(source.read(key))) for key in plan.kept)
    leaves = with_progress(iter_leaves(plan, target_dtype), sum(len(rule.pieces) for rule in plan.rules),
                           f"converting {os.path.basename(os.path.normpath(source_path))}")
    with interrupts_between_leaves() as between:
      checkpoint.write_checkpoint(
        output, plan.config, between(leaves), extras=between(extras), tokenizer_dir=tokenizer_dir,
        manifest=manifest, overwrite=overwrite,
      )
  logging.info("wrote %s in %.1fs (%d kept, %d skipped)", output, time.time() - start, len(plan.kept), len(plan.skipped))
  return manifest


def convert_maxtext(source_path: str, output: str, dtype: str = "float32", overwrite: bool = False,
                    trust_remote_code: bool = False, run: maxtext_config.RunConfig | None = None) -> dict:
  """A MaxText checkpoint folder, restored on this host's devices and written leaf by leaf (module docstring);
  `run`: its run config, else the config.yml beside its run."""
  folder = maxtext.StepFolder(source_path, run)
  loaded = folder.load(dtype=jnp.dtype(dtype))
  with tempfile.TemporaryDirectory() as staging:
    tokenizer_dir, tokenizer_record = (None, {"note": "the run config names no tokenizer folder here: evaluate "
                                                      "with --tokenizer_dir"})
    if folder.tokenizer_dir() is not None:
      tokenizer_dir, tokenizer_record = _tokenizer_dir(folder.tokenizer_dir(), loaded.config.vocab_size, staging,
                                                       trust_remote_code)
    manifest = dict(folder.manifest(), source=str(folder.path), dtype=dtype, tokenizer=tokenizer_record,
                    trust_remote_code=trust_remote_code, kept_as_extras=[], skipped=[], skipped_modules={},
                    maxtext_model_keys=dict(maxtext_config.model_keys(folder.run)), source_checksums=loaded.checksums)
    manifest.pop("files")
    checkpoint.save_params(output, loaded.config, loaded.params, tokenizer_dir=tokenizer_dir, manifest=manifest,
                           overwrite=overwrite)
  return manifest


def report(manifest: dict, output: str) -> str:
  """What the command prints: the conversion, then each module of the release it left out, what that module is
  and where a user gets it instead, and any LoRA factors merged."""
  lines = [f"converted {manifest['source_description']} -> {output} ({manifest['dtype']})"]
  skipped = manifest.get("skipped_modules") or {}
  layout = families.layout_for_model_type(manifest["source_model_type"]) if skipped else None
  notes = layout.skipped_modules(manifest["source_config"]) if layout else {}
  for prefix, count in skipped.items():
    lines.append(f"left out {prefix}* ({count} tensor{'' if count == 1 else 's'}): {notes[prefix]}")
  if manifest.get("lora_merged"):
    merged = manifest["lora_merged"]
    lines.append(f"merged LoRA factors into {len(merged['weights'])} weights (W + {merged['scaling']} * B @ A)")
  return "\n".join(lines)


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Command-line flags, defined only when this module is the program (libraries import it freely)."""
  flags.DEFINE_string("source", None, "Hugging Face model directory (safetensors or pytorch_model*.bin) or a .gguf file.")
  flags.DEFINE_string("output", None, "Directory to write the s2sjax checkpoint to.")
  flags.DEFINE_enum("family", "auto", family_choices(),
                    "Model family or vendor layout the source must be; auto reads config.json's model_type.")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Parameter dtype of the output (norms stay fp32).")
  flags.DEFINE_multi_string("skip_prefix", [], "Leave out source keys with this prefix (listed in the manifest).")
  flags.DEFINE_bool("overwrite", False, "Replace an existing output directory.")
  flags.DEFINE_bool("trust_remote_code", False,
                    "Run a tokenizer shipped as code (tokenizer_config.json auto_map); its code is copied along.")
  flags.DEFINE_bool("verify", False, "Compare per-token log-probs with the PyTorch model (needs torch).")
  flags.DEFINE_integer("verify_length", 512, "Tokens in the --verify comparison.")
  maxtext_config.define_flag()


def _interrupted_line(signum: int, output: str, replaced: bool, written: bool) -> str:
  """What a SIGINT / SIGTERM leaves at --output, and how to go on (a conversion does not resume: it is redone)."""
  stopped = f"interrupted by {signal.Signals(signum).name}"
  if written:
    verify = "; the --verify comparison was stopped (rerun with --overwrite --verify)" if FLAGS.verify else ""
    return f"{stopped}: {output} is converted in full and kept{verify}"
  kept = f"the checkpoint already at {output} is kept as it was" if replaced else f"{output} is not written"
  return (f"{stopped}: the conversion was not finished and its partial files are removed; {kept}; rerun the same "
          "command to convert from the start")


def main(argv):
  del argv
  replaced = os.path.exists(os.path.join(FLAGS.output, checkpoint.MANIFEST))  # a checkpoint --overwrite replaces
  try:
    manifest = convert(FLAGS.source, FLAGS.output, FLAGS.family, FLAGS.dtype, FLAGS.skip_prefix, FLAGS.overwrite,
                       FLAGS.trust_remote_code, FLAGS.maxtext_config)
  except cli.Interrupted as e:
    e.message = _interrupted_line(e.signum, FLAGS.output, replaced, isinstance(e, InterruptedAfterWriting))
    raise
  print(report(manifest, FLAGS.output))
  if FLAGS.verify and maxtext.is_step_folder(FLAGS.source):
    raise ConversionError("--verify compares with transformers' model of a Hugging Face source; a MaxText folder has "
                          "none: compare s2sjax.logprobs with MaxText's own forward or its to_huggingface export")
  if FLAGS.verify:
    try:
      result = verify.compare_with_torch(FLAGS.source, FLAGS.output, length=FLAGS.verify_length)
    except cli.Interrupted as e:
      e.message = _interrupted_line(e.signum, FLAGS.output, replaced, written=True)
      raise
    print(
      f"verify: {result['tokens']} tokens, max |log-prob difference| = {result['max_abs_diff']:.3g} "
      f"(mean {result['mean_abs_diff']:.3g}) in {result['dtype']}"
    )


if __name__ == "__main__":
  with cli.setting_up():
    define_flags()
  flags.mark_flags_as_required(["source", "output"])
  cli.run(main)
