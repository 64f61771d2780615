r"""A pre-flight a user runs before a long pod job: does this checkpoint (and this data) score what they think?

  python -m s2sjax.check [--checkpoint=DIR] [--trust_remote_code] [--spec=NAME_OR_YAML]
      [--data_dir=DIR --task=TASK --modality=t2t|s2t|t2s|s2s|text|speech --row_length=N]

Without --checkpoint it checks the embedded default (converted into $S2SJAX_CACHE on first use, as s2sjax.eval
does). Prints one verdict per check, then what it did not check and why (and what no file of the checkpoint
confirms: a MaxText folder's model settings without the config.yml of its run), and exits non-zero when any fails:

- config: the source config.json the checkpoint was converted from is parsed again by its architecture, so a switch
  the model does not implement (ALiBi, sparse layers, ...) is refused by name even in a checkpoint converted
  before it was;
- stored parameters: every parameter file there and whole (the sizes the manifest records; a MaxText folder's
  shard indexes, read with their crc32c), without loading the parameters;
- tokenizer: the checkpoint's tokenizer loads (remote code only with --trust_remote_code) and fits the embedding;
- spec: every special token of the spec resolves in that tokenizer and equals the id the source config states, and
  its ids and streams meet the model as its architecture reads them;
- data: built for this tokenizer, with the same special ids, every id within the model's tables, and
  `evaluator.check_fit`;
- smoke: one row scored: its NLL is finite, and scoring it again with its audio made uninformative (the input
  format's rule: codes zeroed, every unit set to unit 0, ...) changes it, so the audio really reaches the model.

The model checked is the one `s2sjax.eval` scores: the checkpoint fitted to the spec (`default_model.fit_to_spec`:
the embedded default's untrained unit rows), its config hash verified; whatever its architecture (the shared
decoder, Moshi, a plugin's), through that architecture (s2sjax/scoring/architectures).
"""

from __future__ import annotations

import os
import sys

from absl import flags

from s2sjax.commands.default_checkpoint import default_checkpoint
from s2sjax.data import modalities
from s2sjax.data.task_data import load_task_data
from s2sjax.runtime import cli
from s2sjax.runtime.errors import UserError
from s2sjax.scoring import default_model, preflight
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.checkpoints.stacks import maxtext_config


class UsageError(UserError, ValueError):
  """Flags that do not name what to check."""


def define_flags() -> None:
  flags.DEFINE_string("checkpoint", None, "s2sjax checkpoint directory (as written by the converter; default: the "
                      "embedded default, converted into $S2SJAX_CACHE on first use).")
  flags.DEFINE_bool("trust_remote_code", False, "Run a tokenizer shipped as code (recorded in the manifest).")
  flags.DEFINE_string("spec", None, "Spec preset name or YAML path whose special tokens are checked.")
  flags.DEFINE_string("data_dir", None, "Built data to check against the checkpoint (with --task, --spec).")
  flags.DEFINE_string("task", None, "Task of the built data.")
  flags.DEFINE_enum("modality", "s2t", [*modalities.NAMES, "text", "speech"],
                    "Modality of the built data: t2t, s2t, t2s, s2s, or text (t2t), speech (s2t), as eval takes.")
  flags.DEFINE_integer("row_length", None, "Row length of the built data (default: the -auto build).")
  flags.DEFINE_bool("verify_data", True, "Hold the built data to its checksums (--noverify_data skips it).")
  flags.DEFINE_bool("accept_config_change", False, "Check a checkpoint whose model_config.json was edited.")
  maxtext_config.define_flag()


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  local = lambda path: path and os.path.expanduser(path)  # "--flag=~/x" reaches us unexpanded
  # Without a checkpoint, the embedded default and its spec, converted on first use.
  ckpt_dir = local(f.checkpoint) or default_checkpoint()
  spec = f.spec or (None if f.checkpoint else default_model.SPEC)
  data = None
  if f.data_dir:
    if not (f.task and spec):
      raise UsageError("--data_dir needs --task and --spec (and --modality, --row_length) to name the built data")
    data = load_task_data(local(f.data_dir), f.task, modalities.get(f.modality).name, spec, f.row_length,
                          verify=f.verify_data)
  reader = checkpoint.open(ckpt_dir, maxtext_config.from_flag(f.maxtext_config), f.accept_config_change)
  verdicts = preflight.run(reader, f.trust_remote_code, spec, data)
  print(f"checked {ckpt_dir}" + ("" if f.checkpoint else " (the embedded default)"))
  print(preflight.table(verdicts))
  for line in preflight.not_checked(reader, spec, data):
    print(line)
  failed = sum(not v.ok for v in verdicts)
  print(f"{failed} check(s) failed" if failed else "all checks passed")
  sys.exit(1 if failed else 0)


def command_line() -> None:
  """`python -m s2sjax.check`."""
  define_flags()
  cli.run(main, __doc__, flag_modules=(__name__,))
