"""Where families are found: `FAMILIES`, a `s2sjax.runtime.registry.Registry` as tasks, spec presets and audio tokenizers
are. A family module calls `register` when imported (the built-ins are imported by `s2sjax.model.families`, a user's own
through $S2SJAX_PLUGINS); the config parser, converter, GGUF reader, exporter, verifier and planner look families
and layouts up here, by name, by config.json `model_type` or by GGUF architecture, and never list them themselves.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from s2sjax.data import formats
from s2sjax.model.families.family import HF, Family, GgufLayout, Layout
from s2sjax.model.config import ConfigError, ModelConfig
from s2sjax.runtime.registry import Registry
from s2sjax.data.rows import TOKEN_ROWS


def _clashes(new: Family, registered: Mapping[str, Family]) -> list[str]:
  """What besides its name would give a lookup two answers: model_types, layout names (vendor layouts share the
  --family namespace with families), GGUF architecture, planner shapes; and what the family names wrongly."""
  families = registered.values()
  readers = {t: f"{f.name}/{l.name}" for f in families for l in f.layouts for t in l.model_types}
  taken = set(registered) | {l.name for f in families for l in f.layouts if l.name != HF}
  problems, seen = [], {new.name}
  for layout in new.layouts:
    problems += [f"model_type {t!r} is read by {readers[t]} already" for t in layout.model_types if t in readers]
    if layout.name != HF:
      if layout.name in taken | seen:
        problems.append(f"layout name {layout.name!r} is taken (family and layout names must differ)")
      seen.add(layout.name)
  audio_inputs = [f.name for f in formats.INPUT_FORMATS.registered() if f.takes_audio and f.row_format is TOKEN_ROWS]
  problems += [f"unknown audio input {a!r} (known: {', '.join(audio_inputs)})" for a in new.audio_inputs
               if a not in audio_inputs]
  if new.export and new.export.layout not in {l.name for l in new.layouts}:
    problems.append(f"export.layout {new.export.layout!r} is not one of the family's layouts")
  if new.gguf and any(f.gguf and f.gguf.architecture == new.gguf.architecture for f in families):
    problems.append(f"GGUF architecture {new.gguf.architecture!r} is read by another family already")
  shapes = {name for f in families for name in f.planner_shapes}
  problems += [f"planner shape {n!r} is another family's" for n in new.planner_shapes if n in shapes]
  return problems


FAMILIES: Registry[Family] = Registry(
  "family", check=_clashes, error=ConfigError,
  unknown=lambda name, known: f"unknown model family {name!r}; registered: {', '.join(known)}")
# Adds a family; refuses one whose name, model_types, layout names, GGUF architecture or planner shapes clash with
# a registered family's, since every lookup must have one answer.
register = FAMILIES.register
get = FAMILIES.get


def names() -> tuple[str, ...]:
  """Registered family names, in registration order."""
  return tuple(FAMILIES.names())


def all_layouts() -> Iterator[tuple[Family, Layout]]:
  for family in FAMILIES:
    for layout in family.layouts:
      yield family, layout


def from_hf_config(cfg: Mapping[str, Any]) -> ModelConfig:
  """Builds a ModelConfig from a parsed `config.json`: the layout that reads its `model_type` parses it."""
  return layout_for_model_type(cfg.get("model_type")).parse_config(cfg)


def layout_for_model_type(model_type: str | None) -> Layout:
  """The layout that reads a config.json stating this `model_type`."""
  for _, layout in all_layouts():
    if model_type in layout.model_types:
      return layout
  raise ConfigError(f"config.json model_type {model_type!r} is not supported; supported: {describe()}")


def layout_choices() -> tuple[str, ...]:
  """What a converter's --family may name besides auto: a family (any of its layouts), or a vendor layout."""
  vendor = tuple(layout.name for _, layout in all_layouts() if layout.name != HF)
  return names() + vendor


def model_types(choice: str | None = None) -> tuple[str, ...]:
  """config.json model_types read by a family's layouts or by one named vendor layout; all of them for None."""
  return tuple(
    t for family, layout in all_layouts() if choice in (None, family.name, layout.name) for t in layout.model_types
  )


def describe() -> str:
  """Every family and vendor layout with the config.json model_types it reads, for error messages."""
  listed = [f"{name} ({', '.join(model_types(name))})" for name in names()]
  vendor = [f"{l.name} ({', '.join(l.model_types)})" for _, l in all_layouts() if l.name != HF]
  return ", ".join(listed) + (f"; vendor layouts: {', '.join(vendor)}" if vendor else "")


def gguf_layout(architecture: str) -> GgufLayout:
  """How llama.cpp files of this `general.architecture` are read."""
  readable = {f.gguf.architecture: f.gguf for f in FAMILIES if f.gguf}
  if architecture not in readable:
    raise ConfigError(f"GGUF architecture {architecture!r} is not supported (supported: {', '.join(readable)})")
  return readable[architecture]


def planner_shapes() -> dict[str, ModelConfig]:
  """Every family's published architectures by name, each parsed from its config.json sizes."""
  return {
    name: layout_for_model_type(cfg.get("model_type")).parse_config(cfg)
    for family in FAMILIES
    for name, cfg in family.planner_shapes.items()
  }
