"""What a model family declares: the layouts its checkpoints come in, how it exports back to transformers, how
llama.cpp writes it, which audio inputs it takes and the published architectures the planner knows.

A family is one decoder architecture (`ModelConfig.family`). A *layout* is one spelling of its checkpoints:
transformers' own (`hf`), or a vendor's (Baichuan-Audio's fused `W_pack` with audio tables is a layout of qwen2,
THUDM's ChatGLM files a layout of glm4). A layout is found by the `model_type` its config.json states.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from s2sjax.model.families.keymap import Rule
from s2sjax.model.config import ModelConfig

HF = "hf"  # the name of a family's transformers layout; every other layout name is the converter's to pick

SourceConfig = Mapping[str, Any]  # a checkpoint's config.json, parsed


@dataclasses.dataclass(frozen=True)
class Layout:
  """One spelling of a family's checkpoints: its config.json and its tensor keys."""

  name: str  # HF, or the vendor layout's name ("chatglm", "baichuan_audio")
  model_types: tuple[str, ...]  # config.json `model_type` values written in this spelling
  parse_config: Callable[[SourceConfig], ModelConfig]  # raises ConfigError naming what it refuses
  rules: Callable[[ModelConfig, SourceConfig], list[Rule]]  # every target leaf's source tensors
  kept_prefixes: tuple[str, ...] = ()  # source keys kept verbatim as extras (converted, unused for text scoring)
  # Modules of the release that scoring never runs (audio encoders, vocoders, vision towers): left out without
  # --skip_prefix, and listed in the manifest and the converter's report.
  skipped_prefixes: tuple[str, ...] = ()
  # What a skipped module is and where a user gets it instead (prefix -> a sentence), for the converter's report.
  skipped_notes: Mapping[str, str] = dataclasses.field(default_factory=dict)
  # Modules whose keys depend on config.json (VITA-Audio's MCTP layers sit after its scored layers): source config
  # -> {prefix: what it is}, left out and reported as skipped_prefixes are.
  skipped_by_config: Callable[[SourceConfig], Mapping[str, str]] | None = None
  ignored_suffixes: tuple[str, ...] = ()  # buffers the checkpoint saves that carry no weights
  verifiable: bool = False  # transformers ships this layout's PyTorch model, so `--verify` can run it

  def skipped_modules(self, source_config: SourceConfig) -> dict[str, str]:
    """Every module prefix this layout leaves out of a source with this config.json, with what it is."""
    notes = {prefix: self.skipped_notes.get(prefix, "a module scoring does not run") for prefix in self.skipped_prefixes}
    return {**notes, **(self.skipped_by_config(source_config) if self.skipped_by_config else {})}


@dataclasses.dataclass(frozen=True)
class HfExport:
  """How a family is written back as a transformers checkpoint."""

  architecture: str  # config.json `architectures`, e.g. "LlamaForCausalLM"
  layout: str  # the family's layout whose keys are written; an unfused one (rules are inverted piece by piece)
  config: Callable[[ModelConfig], dict[str, Any]]  # config.json's architecture fields, `model_type` included


def _as_stored(hf_key: str, array: np.ndarray, hf_config: SourceConfig) -> np.ndarray:
  return array


@dataclasses.dataclass(frozen=True)
class GgufLayout:
  """How llama.cpp writes a family: its tensors are presented under the HF layout's keys and config.json."""

  architecture: str  # the file's `general.architecture`
  model_type: str  # the config.json model_type its metadata is presented as (picks the layout that reads it)
  hf_key: Callable[[str], str]  # GGUF tensor name -> HF key; unknown names unchanged (they surface as unexpected)
  restore: Callable[[str, np.ndarray, SourceConfig], np.ndarray] = _as_stored  # undoes llama.cpp's reordering


@dataclasses.dataclass(frozen=True)
class Family:
  name: str  # ModelConfig.family
  layouts: tuple[Layout, ...]
  # The input formats of token rows it reads audio in (s2sjax/data/formats: `codebook_tables`, K embedding tables summed
  # at a placeholder token, as Baichuan-Audio; `extended_vocab`, audio unit k an ordinary token id, as GLM-4-Voice)
  audio_inputs: tuple[str, ...] = ()
  export: HfExport | None = None  # None: not exportable to transformers
  gguf: GgufLayout | None = None  # None: no GGUF files of this family are read
  # Published architectures for the planner, by name: the sizes of their config.json (parsed by its layout).
  planner_shapes: Mapping[str, SourceConfig] = dataclasses.field(default_factory=dict)

  def layout(self, name: str) -> Layout:
    for layout in self.layouts:
      if layout.name == name:
        return layout
    raise KeyError(f"family {self.name} has no layout {name!r}; its layouts: {', '.join(l.name for l in self.layouts)}")
