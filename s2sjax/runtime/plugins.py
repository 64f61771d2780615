"""Extensions outside the package: modules named in `S2SJAX_PLUGINS` (comma-separated, importable) are imported
once, before a registry (s2sjax.runtime.registry: tasks, model families, spec presets, audio tokenizers) is first listed or
asked for a name it lacks. A plugin module registers what it adds when imported, with that registry's `register`,
so a new task, family, spec or audio tokenizer is one file of the user's own, and every command line
(`tasks.prepare`, `s2sjax.eval`, `checkpoints_conversion.convert`) sees it.

  S2SJAX_PLUGINS=my_lab.toy_task,my_lab.my_family python -m s2sjax.eval --task=toy ...
"""

from __future__ import annotations

import importlib
import os

from s2sjax.runtime.errors import UserError

ENV = "S2SJAX_PLUGINS"
_loaded: set[str] = set()


class PluginError(UserError, ImportError):
  """A module named in $S2SJAX_PLUGINS that is not there, or whose import fails (its own error is chained: the
  command's --verbosity=1 prints its traceback)."""


def load_plugins() -> None:
  """Imports every module named in $S2SJAX_PLUGINS not imported yet; one that fails to import is a PluginError
  naming the module and its error."""
  for name in filter(None, (part.strip() for part in os.environ.get(ENV, "").split(","))):
    if name in _loaded:
      continue
    _loaded.add(name)  # before the import: a plugin that reads a registry while registering must not recurse
    try:
      importlib.import_module(name)
    except Exception as e:  # the plugin is the user's code: any error it raises on import is theirs to mend
      _loaded.discard(name)
      missing = isinstance(e, ModuleNotFoundError) and e.name == name
      why = "no such module on the Python path" if missing else f"{type(e).__name__}: {e}"
      raise PluginError(f"{ENV} names {name!r}, which cannot be imported ({why})") from e

