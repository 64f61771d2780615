"""Other training stacks' checkpoints and parameters, read as they wrote them: MaxText (`maxtext`, with its run
config in `maxtext_config`) and levanter (`levanter`, and its trainer's hook in `levanter_hook`).
`s2sjax.scoring.checkpoints.checkpoint` asks `open_checkpoint` first, so every command that reads a checkpoint reads a MaxText folder;
levanter's are read in Python (`levanter.load`), with the model's config.json."""

from __future__ import annotations

from etils import epath

from s2sjax.scoring.checkpoints.stacks import maxtext


def open_checkpoint(path: str | epath.Path):
  """The reader of a checkpoint folder another stack wrote (`maxtext.StepFolder`), or None for any other folder
  (this project's own, or nothing at all)."""
  if maxtext.is_step_folder(path):
    return maxtext.StepFolder(path)
  return None
