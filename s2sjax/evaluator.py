"""The evaluator: built once (data loaded, steps compiled), then `evaluate(params, step)` as often as a training
loop likes, without recompiling. `python -m s2sjax.eval` is a thin command line around the same object.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from s2sjax import metrics
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import Params
from s2sjax.packing import RowShape
from s2sjax.scoring import CandidateScores, Scorer, collect

TASK_KINDS = {"sstorycloze": "story", "zh_sstorycloze": "story", "scmmlu": "cmmlu"}


class EvalError(ValueError):
  """Model and data that do not fit together; the message says what to run."""


@dataclasses.dataclass
class TaskData:
  task: str
  modality: str
  rows: dict[str, np.ndarray]
  metadata: dict

  @property
  def kind(self) -> str:
    return TASK_KINDS[self.task]

  @property
  def shape(self) -> RowShape:
    return RowShape(**self.metadata["row_shape"])

  @property
  def questions(self) -> list[dict]:
    return self.metadata["questions"]

  @functools.cached_property
  def candidates_per_item(self) -> list[int]:
    """How many candidates each packed item holds, from the questions' slots: what the rows must hold."""
    counts = collections.Counter(item for question in self.questions for item, _ in question["slots"])
    return [counts[i] for i in range(max(counts) + 1)] if counts else []

  @functools.cached_property
  def fingerprint(self) -> str:
    """A hash of what is scored (tokens, audio codes, targets): results saved for other rows are not these."""
    digest = hashlib.sha256()
    for name in ("tokens", "audio_codes", "target_pos", "target_ids", "target_slot", "slot_item", "slot_candidate"):
      digest.update(np.ascontiguousarray(self.rows[name]).tobytes())
    return digest.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Variants:
  """The build options that change the rows, and so name another built config (see tasks.tfds_builder)."""

  share_prefix: bool = True
  reference_language_quirk: bool = False
  overlong: str = "error"


def load_task_data(data_dir: str, task: str, modality: str, spec: str, row_length: int,
                   variants: Variants = Variants()) -> TaskData:
  from tasks.tfds_builder import config_name, load_rows

  rows, metadata = load_rows(data_dir, task, config_name(spec, modality, row_length, **dataclasses.asdict(variants)))
  return TaskData(task, modality, rows, metadata)


def check_fit(config: ModelConfig, data: TaskData, tokenizer_identity: dict | None = None) -> None:
  """Refuses data that was built for another tokenizer or another audio input than the model's."""
  built_with = data.metadata["tokenizer"]
  if tokenizer_identity is not None and tokenizer_identity["vocab_sha"] != built_with["vocab_sha"]:
    raise EvalError(
      f"{data.task}/{data.modality} was built with tokenizer {built_with['name_or_path']} "
      f"({built_with['size']} tokens), not the checkpoint's ({tokenizer_identity['size']} tokens): rebuild it with "
      f"python -m tasks.prepare --task={data.task} --modality={data.modality} --tokenizer_dir=CHECKPOINT/tokenizer"
    )
  if built_with["size"] > config.vocab_size:
    raise EvalError(f"the data's tokenizer has {built_with['size']} tokens, the model's embedding {config.vocab_size}")
  spec = data.metadata["spec"]
  if data.modality == "speech" and spec["audio_mode"] == "codebook_tables":
    sizes = tuple(spec["codebook_sizes"])
    if len(config.audio_codebook_sizes) != len(sizes) or any(m < d for m, d in zip(config.audio_codebook_sizes, sizes)):
      raise EvalError(
        f"spec {spec['name']} needs {len(sizes)} audio codebook tables of sizes {sizes}; the checkpoint has "
        f"{config.audio_codebook_sizes or 'none'} (convert it with its audio tables, or use a spec that fits)"
      )


def with_untrained_audio_tables(config: ModelConfig, params: Params, sizes: tuple[int, ...], placeholder: int,
                                seed: int = 0) -> tuple[ModelConfig, Params]:
  """Adds random codebook tables (std of the text embedding, fixed seed): what a text LM that never learned audio
  sees. Used by the embedded default, never silently for a user's checkpoint."""
  config = dataclasses.replace(config, audio_codebook_sizes=tuple(sizes), audio_placeholder_id=placeholder)
  embedding = params["embed"]["embedding"]
  std = jnp.std(embedding.astype(jnp.float32))
  keys = jax.random.split(jax.random.PRNGKey(seed), len(sizes))
  params = dict(params)
  for k, (size, key) in enumerate(zip(sizes, keys)):
    params[f"audio_embed_{k}"] = {"embedding": (jax.random.normal(key, (size, config.hidden_size)) * std).astype(embedding.dtype)}
  return config, params


class Evaluator:
  """Scores a fixed set of tasks x modalities for any params of one model config."""

  def __init__(
    self,
    config: ModelConfig,
    data: list[TaskData],
    mesh=None,
    batch_size: int = 8,
    dtype=jnp.float32,
    params_adapter: Callable[[Params], Params] | None = None,
    attention: str = "xla",
  ):
    """params_adapter maps another stack's params onto this decoder's tree (key renames, transposes);
    attention: xla | dot_product | flash (model/layers.attention)."""
    if not data:
      raise EvalError("no task data to evaluate")
    self.config, self.data = config, data
    self.params_adapter = params_adapter or (lambda p: p)
    self._scorers: dict[RowShape, Scorer] = {}
    for td in data:
      check_fit(config, td)
      if td.shape not in self._scorers:
        self._scorers[td.shape] = Scorer(config, td.shape, mesh=mesh, batch_size=batch_size, dtype=dtype,
                                         attention=attention)
    self.history: list[dict] = []

  def scorer(self, td: TaskData) -> Scorer:
    return self._scorers[td.shape]

  def compiled_count(self) -> int:
    return sum(s.compiled_count() for s in self._scorers.values())

  def score(self, params: Params, td: TaskData, progress: bool = False) -> CandidateScores:
    nll_sum, n_tokens = self.scorer(td).score(self.params_adapter(params), td.rows, progress=progress)
    return collect(td.rows, nll_sum, n_tokens, td.candidates_per_item)

  def evaluate(self, params: Params, step: int | None = None) -> dict:
    """{task: {modality: metrics}} plus {"degradation": {task: report}} where both modalities ran."""
    arrays = {}
    for td in self.data:
      scores = self.score(params, td)
      arrays[(td.task, td.modality)] = metrics.question_arrays(td.questions, scores.nll_sum, scores.n_tokens)
    result = summarize(self.data, arrays)
    self.history.append({"step": step, **result})
    return result


def summarize(data: list[TaskData], arrays: dict[tuple[str, str], dict]) -> dict:
  result: dict = {}
  kinds = {td.task: td.kind for td in data}
  for (task, modality), a in arrays.items():
    result.setdefault(task, {})[modality] = metrics.task_metrics(kinds[task], a)
  for task in kinds:
    if (task, "text") in arrays and (task, "speech") in arrays:
      text, speech = _paired(data, task, arrays)
      result.setdefault("degradation", {})[task] = metrics.degradation(kinds[task], text, speech)
  return result


def _paired(data: list[TaskData], task: str, arrays: dict) -> tuple[dict, dict]:
  """Both modalities restricted to the questions they share (--skip_bad may have left out different ones)."""
  ids = {td.modality: {q["id"]: n for n, q in enumerate(td.questions)} for td in data if td.task == task}
  common = [i for i in ids["text"] if i in ids["speech"]]
  pick = lambda m: [ids[m][i] for i in common]
  take = lambda a, idx: {k: v[idx] for k, v in a.items()}
  return take(arrays[(task, "text")], pick("text")), take(arrays[(task, "speech")], pick("speech"))
