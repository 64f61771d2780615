"""Model families, one module each, found by name.

A family module (`qwen2.py`, `llama.py`, `glm4.py`, `opt.py`) declares a `Family` (see `family.py`): how each layout of its
checkpoints parses config.json and maps its tensor keys, how it exports back to transformers, how llama.cpp
writes it, the audio inputs it accepts and its published architectures; then calls `register`. The decoder,
converter, verifier, exporter and planner look families up through this package and never list them.

Adding a family is one module of your own: build a `Family` from `keymap` and `hf_config`, `register` it (into
`FAMILIES`, a `s2sjax.runtime.registry.Registry` like the task, spec and audio tokenizer registries), and name the module
in $S2SJAX_PLUGINS (comma-separated) so every command line imports it before its first lookup.
"""

from s2sjax.model.families.family import HF, Family, GgufLayout, HfExport, Layout
from s2sjax.model.families.registry import (FAMILIES, all_layouts, describe, from_hf_config, get, gguf_layout,
  layout_choices, layout_for_model_type, model_types, names, planner_shapes, register)

# The built-in families register on import, in the order their names are listed to users.
from s2sjax.model.families import qwen2, llama, glm4, opt  # noqa: E402,F401,I001

__all__ = [
  "FAMILIES", "HF", "Family", "GgufLayout", "HfExport", "Layout", "all_layouts",
  "describe", "from_hf_config", "get", "gguf_layout", "layout_choices", "layout_for_model_type", "model_types", "names",
  "planner_shapes", "register",
]
