"""What a model kind declares, and where the kinds are found: `Architecture` records in `ARCHITECTURES`, a
`s2sjax.runtime.registry.Registry` as families, tasks, specs and audio tokenizers are.

An architecture is one parameter tree and the rows it scores: the shared decoder (every family of
`s2sjax.model.families`, token rows) is one, a model of its own reading parallel streams is another. The checkpoint
reader and writer, the scorer, the evaluator's fit checks and the converter look the
architecture up here, by its config's type, by model_config.json's `family`, or by a spec, and never name one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from s2sjax.runtime import plugins
from s2sjax.runtime.errors import UnknownNameError, UserError
from s2sjax.runtime.registry import Registry
from s2sjax.data import modalities
from s2sjax.data.rows import RowFormat

DECODER = "decoder"  # the shared decoder's architecture: what every family of s2sjax.model.families is


class FitError(UserError, ValueError):
  """A checkpoint and built data that do not fit together; the message names both and says what to run."""


@dataclasses.dataclass(frozen=True)
class Architecture:
  """One model kind. `scorer(config, shape, mesh=None, batch_size=8, dtype=float32, attention="xla")` compiles its
  step over rows of `row_format` (an object with `score(params, rows) -> (nll_sum, n_tokens)` and
  `compiled_count()`); `check_fit(config, task_data)` raises FitError for data the model cannot read;
  `check_ids(rows, config)` raises a ScoringError for ids beyond the model's tables (the scorer's own check, which
  the pre-flight runs too); `parse_config(config_json)` reads a release's config.json into its config, refusing by
  name what it does not implement; `spec_checks(config, spec, audio_ids)` are the pre-flight's verdicts on how a
  spec's ids and streams meet the model, as (check, ok, detail) (how its releases are converted is
  checkpoints_conversion's: own_converters.py).
  `log_probs(config, params, input_ids, audio_codes, features) -> (text [T, vocab], audio head or None)` is the fp32
  log-softmax of one sequence that `s2sjax.logprobs` writes, inputs checked (`s2sjax.scoring.sequence_inputs`); None: the
  architecture has no such command. `planned(config)` is the shared-decoder shape whose FLOPs and activations its
  scoring step costs (`s2sjax.plan`; the memory of its parameters is `config.num_params()`), None: not planned;
  `planner_shapes` its published releases' config.json, by name, for planning without the weights.
  `details(config)` names the further per-candidate numbers its step gives beside the NLL (per target
  `target_details` [B, M, D], one column a name, summed over a candidate's targets as its NLL is) for candidates of
  kind `details_of` (s2sjax.data.modalities' SPEECH or TEXT); the evaluator writes them to a details file beside
  the scores (`s2sjax.data.question_details`); () for none, and no file."""

  name: str  # model_config.json's `family` for an architecture of its own; DECODER for the shared decoder
  config_class: type  # its config: hashable, with to_json / from_json and `family` (model_config.json's)
  row_format: RowFormat
  abstract_params: Callable[..., Any]  # (config, param_dtype=float32) -> the tree of ShapeDtypeStructs
  param_logical_axes: Callable[[Any], Any]  # config -> the tree of logical axis names
  scorer: Callable[..., Any]
  text_rows: Callable[[Any], int]  # config -> rows of its text embedding (the largest text tokenizer it reads)
  check_fit: Callable[[Any, Any], None]
  check_ids: Callable[[Mapping[str, np.ndarray], Any], None] | None = None  # None: its scorer checks ids alone
  parse_config: Callable[[Mapping[str, Any]], Any] | None = None  # None: it reads no release config.json
  spec_checks: Callable[[Any, Any, Any], list[tuple[str, bool, str]]] = lambda config, spec, ids: []
  log_probs: Callable[..., tuple[np.ndarray, np.ndarray | None]] | None = None
  planned: Callable[[Any], Any] | None = None
  planner_shapes: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
  details: Callable[[Any], tuple[str, ...]] = lambda config: ()
  details_of: str = modalities.SPEECH


def _problems(new: Architecture, registered: Mapping[str, Architecture]) -> list[str]:
  problems = [f"its config class {new.config_class.__name__} is {a.name}'s already" for a in registered.values()
              if a.config_class is new.config_class]
  problems += [f"planner shape {name!r} is {a.name}'s already" for a in registered.values() for name in
               new.planner_shapes if name in a.planner_shapes]
  if new.planner_shapes and new.parse_config is None:
    problems.append("planner shapes are read by its parse_config, which it lacks")
  return problems


ARCHITECTURES: Registry[Architecture] = Registry(
  "architecture", check=_problems, unknown=lambda name, known: f"unknown architecture {name!r}; registered: "
                                                                f"{', '.join(known)}")
register = ARCHITECTURES.register
get = ARCHITECTURES.get


def for_config(config) -> Architecture:
  """The architecture whose config class `config` is."""
  for architecture in ARCHITECTURES:
    if type(config) is architecture.config_class:
      return architecture
  raise UnknownNameError(f"no registered architecture reads a {type(config).__name__} "
                         f"(registered: {', '.join(ARCHITECTURES.names())}; your own: see ${plugins.ENV})")


def for_family(family: str | None) -> Architecture:
  """The architecture of a model_config.json's `family`: one registered under that name, else the shared decoder
  (whose families are s2sjax.model.families')."""
  return get(family) if family in ARCHITECTURES.names() and family != DECODER else get(DECODER)


def planner_shapes() -> dict[str, Any]:
  """Every planned architecture's named shapes, each parsed into its config."""
  return {name: a.parse_config(cfg) for a in ARCHITECTURES if a.planned for name, cfg in a.planner_shapes.items()}


def for_spec(spec) -> Architecture:
  """The architecture whose rows a spec's builds are: the spec's `architecture` when it names one (it must read
  the spec's row format), else the first registered that reads that format."""
  if spec.architecture is not None:
    architecture = get(spec.architecture)
    if architecture.row_format is not spec.row_format:
      raise FitError(f"spec {spec.name} names architecture {spec.architecture}, which reads "
                     f"{architecture.row_format.name} rows, not the {spec.row_format.name} rows its audio_mode "
                     f"{spec.audio_mode} lays")
    return architecture
  for architecture in ARCHITECTURES:
    if architecture.row_format is spec.row_format:
      return architecture
  raise UnknownNameError(f"no registered architecture reads {spec.row_format.name} rows (spec {spec.name})")


def detail_names(config, modality: str) -> tuple[str, ...]:
  """The per-candidate details `config`'s architecture gives for candidates of `modality` (a modality's name), or ()."""
  architecture = for_config(config)
  return architecture.details(config) if modalities.get(modality).candidate == architecture.details_of else ()
