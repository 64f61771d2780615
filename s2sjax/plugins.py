"""Extensions outside the package: modules named in `S2SJAX_PLUGINS` (comma-separated, importable) are imported
once, before a registry (s2sjax.registry: tasks, model families, spec presets, audio tokenizers) is first listed or
asked for a name it lacks. A plugin module registers what it adds when imported, with that registry's `register`,
so a new task, family, spec or audio tokenizer is one file of the user's own, and every command line
(`tasks.prepare`, `s2sjax.eval`, `checkpoints_conversion.convert`) sees it.

  S2SJAX_PLUGINS=my_lab.toy_task,my_lab.my_family python -m s2sjax.eval --task=toy ...
"""

from __future__ import annotations

import importlib
import os

ENV = "S2SJAX_PLUGINS"
_loaded: set[str] = set()


def load_plugins() -> None:
  """Imports every module named in $S2SJAX_PLUGINS not imported yet; one that fails to import is an error."""
  for name in filter(None, (part.strip() for part in os.environ.get(ENV, "").split(","))):
    if name in _loaded:
      continue
    _loaded.add(name)  # before the import: a plugin that reads a registry while registering must not recurse
    try:
      importlib.import_module(name)
    except ImportError as e:
      _loaded.discard(name)
      raise ImportError(f"{ENV} names {name!r}, which cannot be imported ({e})") from e
