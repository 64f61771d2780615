"""Model kinds, one registered `Architecture` each (see `architecture.py`), found by config type, by
model_config.json's `family` or by spec: the shared decoder (`decoder.py`: every family of `s2sjax.model.families`,
token rows), Moshi (`moshi.py`, parallel streams) and Kimi-Audio (`kimi_audio.py`, two id streams and a Whisper
feature track). The checkpoint reader and writer, the evaluator and the converter look architectures up here and never
list them.

Adding one is a module of your own that builds an `Architecture` (its config class, parameter tree and logical axes,
its scorer over one of s2sjax/data/rows.py's row formats, its fit check) and `register`s it; name the module in
$S2SJAX_PLUGINS so every command line imports it before its first lookup.
"""

from s2sjax.scoring.architectures.architecture import (ARCHITECTURES, DECODER, Architecture, FitError, detail_names,
  for_config, for_family, for_spec, get, planner_shapes, register)

# The built-ins register on import: the shared decoder first, then the models of their own.
from s2sjax.scoring.architectures import decoder  # noqa: E402,F401,I001
from s2sjax.scoring.architectures import moshi  # noqa: E402,F401
from s2sjax.scoring.architectures import kimi_audio  # noqa: E402,F401
from s2sjax.scoring.architectures import mimo_audio  # noqa: E402,F401
from s2sjax.scoring.architectures import step_audio2  # noqa: E402,F401

__all__ = ["ARCHITECTURES", "DECODER", "Architecture", "FitError", "detail_names", "for_config", "for_family",
           "for_spec", "get", "planner_shapes", "register"]
