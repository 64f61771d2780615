"""The evaluator: built once (data loaded, steps compiled), then `evaluate(params, step)` as often as a training
loop likes, without recompiling. `python -m s2sjax.eval` drives the same object over checkpoints.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp
import numpy as np

from s2sjax import benchmarks, families, metrics, modalities
from s2sjax.families import moshi as moshi_family
from s2sjax.spec import PARALLEL_STREAMS, SpecError, spec_from_dict
from s2sjax.model.config import ConfigError, ModelConfig
from s2sjax.model.decoder import Params
from s2sjax.model.moshi import MoshiConfig
from s2sjax.packing import RowShape, spanning
from s2sjax.questions import QuestionScores
from s2sjax.scoring import Scorer, StreamScorer, collect
from s2sjax.task_data import TaskData


class EvalError(ValueError):
  """Model and data that do not fit together; the message says what to run."""


@dataclasses.dataclass(frozen=True)
class ScoringOptions:
  """How the scoring step runs, shared by `Evaluator` and `s2sjax.eval`'s EvalConfig."""

  batch_size: int = 8  # rows per step (rounded up to the data-parallel devices)
  dtype: str = "float32"  # compute and parameter dtype
  attention: str = "xla"  # xla | dot_product | cudnn | flash | flash_shared (model/layers.attention); the CLI resolves "auto"

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)


def check_fit(config: ModelConfig | MoshiConfig, data: TaskData, tokenizer_identity: dict | None = None) -> None:
  """Refuses data that was built for another tokenizer or another audio input than the model's (a Moshi
  checkpoint reads parallel-stream rows only, laid as its config says)."""
  built_with = data.metadata["tokenizer"] or {"size": 0}  # None: a unit LM's data, no text tokenizer
  if tokenizer_identity is not None and tokenizer_identity["vocab_sha"] != built_with.get("vocab_sha"):
    raise EvalError(
      f"{data.task}/{data.modality} was built with tokenizer {built_with['name_or_path']} "
      f"({built_with['size']} tokens), not the checkpoint's ({tokenizer_identity['size']} tokens): rebuild it with "
      f"python -m tasks.prepare --task={data.task} --modality={data.modality} --spec={data.metadata['spec']['name']} "
      f"--row_length={data.shape.length} --tokenizer_dir=CHECKPOINT/tokenizer --data_dir=DATA_DIR"
    )
  text_rows = config.text_card if isinstance(config, MoshiConfig) else config.vocab_size
  if built_with["size"] > text_rows:
    raise EvalError(f"the data's tokenizer has {built_with['size']} tokens, the model's embedding {text_rows}")
  spec = data.metadata["spec"]
  modality = modalities.get(data.modality)
  try:  # data built by a version that did not refuse it: the same words as the build's
    spec_from_dict(spec).check_modality(modality)
  except SpecError as e:
    raise EvalError(f"{data.task}/{data.modality}: {e}") from None
  if isinstance(config, MoshiConfig) or data.parallel_streams:
    _check_streams_fit(config, data)
    return
  if not modality.speaks:
    return
  accepted = families.get(config.family).audio_inputs
  if spec["audio_mode"] not in accepted:
    raise EvalError(f"spec {spec['name']} feeds audio as {spec['audio_mode']}; the {config.family} family takes "
                    f"{', '.join(accepted) or 'no audio'}")
  if spec["audio_mode"] == "codebook_tables":
    sizes = tuple(spec["codebook_sizes"])
    if len(config.audio_codebook_sizes) != len(sizes) or any(m < d for m, d in zip(config.audio_codebook_sizes, sizes)):
      raise EvalError(
        f"spec {spec['name']} needs {len(sizes)} audio codebook tables of sizes {sizes}; the checkpoint has "
        f"{config.audio_codebook_sizes or 'none'} (convert it with its audio tables, or use a spec that fits)"
      )
    # Codes reach the model only at the checkpoint's placeholder id: at any other id every S->T NLL would be the
    # model reading N copies of one text token, and the run would finish normally.
    placeholder = (data.metadata.get("audio_ids") or {}).get("placeholder")
    if placeholder != config.audio_placeholder_id:
      raise EvalError(
        f"{data.task}/{data.modality}: the data lays audio at placeholder id {placeholder} (spec {spec['name']}'s "
        f"{spec.get('placeholder_token')!r} in the data's tokenizer), the checkpoint's config reads codes at "
        f"audio_placeholder_id {config.audio_placeholder_id}: rebuild the data with the checkpoint's tokenizer "
        "(--tokenizer_dir=CHECKPOINT/tokenizer) or use the spec whose placeholder is that id"
      )


def _check_streams_fit(config: ModelConfig | MoshiConfig, data: TaskData) -> None:
  """A Moshi checkpoint and parallel-stream rows go together, with the spec's streams laid as the model reads them."""
  spec = data.metadata["spec"]
  where = f"{data.task}/{data.modality} (spec {spec['name']})"
  if not isinstance(config, MoshiConfig):
    raise EvalError(f"{where} holds rows of parallel streams, which only a moshi checkpoint reads; this checkpoint "
                    f"is a {config.family} decoder: build the data with its own spec")
  if not data.parallel_streams:
    raise EvalError(f"{where} holds token rows ({spec['audio_mode']}); a moshi checkpoint reads {PARALLEL_STREAMS} "
                    "rows: build the data with --spec=moshi (or a spec of audio_mode parallel_streams)")
  streams = spec_from_dict(spec)
  try:
    moshi_family.check_spec(config, streams.codebook_sizes, streams.stream_delays, streams.stream_initial_ids)
  except ConfigError as e:
    raise EvalError(f"{where} does not fit the moshi checkpoint: {e}") from None


def check_finite(td: TaskData, rows: dict[str, np.ndarray], nll_sum: np.ndarray) -> None:
  """Refuses sums that are NaN or infinite, naming the task, modality and first candidates, before anything is
  saved or any metric computed: a NaN loss compares false both ways, so the metrics would be silently wrong (a
  broken checkpoint scored "accuracy 0.0%" with `acc` 1.0, and bare NaN reached metrics.json)."""
  laid = rows["slot_item"] >= 0
  bad = laid & ~np.isfinite(nll_sum)
  if not bad.any():
    return
  where = {(int(item), int(within)): (q, c)
           for q, row in enumerate(td.questions.slots) for c, (item, within) in enumerate(row)}
  found = sorted(where.get((int(rows["slot_item"][r, s]), int(rows["slot_candidate"][r, s])), (-1, -1))
                 for r, s in np.argwhere(bad))[:3]  # in the question table's order
  found = [(td.questions.ids[q] if q >= 0 else "?", c if c >= 0 else "?") for q, c in found]
  kinds = sorted({("nan" if np.isnan(v) else "inf") for v in nll_sum[bad][:100]})
  raise EvalError(
    f"{td.task}/{modalities.title(td.label)}: {int(bad.sum())} of {int(laid.sum())} candidates scored a non-finite "
    f"NLL ({'/'.join(kinds)}), first: {', '.join(f'question {q} candidate {c}' for q, c in found)}. The model "
    "computes NaN/Inf: a broken parameter (its checksum holds only the bits it was written with) or an overflow "
    "(try --dtype=float32); nothing was saved")


class Evaluator:
  """Scores a fixed set of tasks x modalities for any params of one model config."""

  def __init__(
    self,
    config: ModelConfig,
    data: list[TaskData],
    options: ScoringOptions = ScoringOptions(),
    mesh=None,
    params_adapter: Callable[[Params], Params] | None = None,
  ):
    """params_adapter maps another stack's params onto this decoder's tree (key renames, transposes)."""
    if not data:
      raise EvalError("no task data to evaluate")
    self.config, self.data, self.options = config, data, options
    self.params_adapter = params_adapter or (lambda p: p)
    for td in data:
      check_fit(config, td)
    # one step per row format, length and codebook count, for the widest tables of the tasks that share it
    groups: dict[tuple, list[RowShape]] = {}
    for td in data:
      groups.setdefault(self._group(td), []).append(td.shape)
    self._scorers: dict[tuple, Scorer | StreamScorer] = {}
    for key, shapes in groups.items():
      if key[0]:  # Moshi's rows: the step over streams (check_fit made sure the model reads them)
        self._scorers[key] = StreamScorer(config, spanning(shapes), mesh=mesh, batch_size=options.batch_size,
                                          dtype=options.jnp_dtype)
      else:
        self._scorers[key] = Scorer(config, spanning(shapes), mesh=mesh, batch_size=options.batch_size,
                                    dtype=options.jnp_dtype, attention=options.attention)
    self.history: list[dict] = []

  @staticmethod
  def _group(td: TaskData) -> tuple:
    return td.parallel_streams, td.shape.length, td.shape.num_codebooks

  def scorer(self, td: TaskData) -> Scorer | StreamScorer:
    return self._scorers[self._group(td)]

  def compiled_count(self) -> int:
    return sum(s.compiled_count() for s in self._scorers.values())

  def score(self, params: Params, td: TaskData, progress: bool = False) -> QuestionScores:
    nll_sum, n_tokens = self.scorer(td).score(self.params_adapter(params), td.rows, progress=progress)
    check_finite(td, td.rows, nll_sum)
    candidates = collect(td.rows, nll_sum, n_tokens, td.questions.candidates_per_item())
    return td.questions.scores(candidates.nll_sum, candidates.n_tokens)

  def evaluate(self, params: Params, step: int | None = None) -> dict:
    """{task: {modality: metrics}} plus {"degradation": {task: {"s2t_vs_t2t": report, ...}}} for the pairs of
    modalities that ran."""
    result = summarize({(td.task, td.label): self.score(params, td) for td in self.data})
    self.history.append({"step": step, **result})
    return result


def summarize(scores: dict[tuple[str, str], QuestionScores], ties: str | None = None) -> dict:
  """Metrics of every (task, modality), and the degradation matrix of every task: each pair of
  s2sjax.modalities.COMPARISONS that ran, over the questions both hold (--skip_bad may leave out different ones).
  `ties` (metrics.TIE_RULES) overrides each task's own rule for ties."""
  result: dict = {}
  rule = lambda task: ties or benchmarks.get(task).ties
  for (task, modality), s in scores.items():
    result.setdefault(task, {})[modality] = metrics.task_metrics(benchmarks.get(task).decision, s, rule(task))
  for task in dict.fromkeys(task for task, _ in scores):
    for reference, other in modalities.COMPARISONS:
      if (task, reference) in scores and (task, other) in scores:
        first, second = common_questions(scores[(task, reference)], scores[(task, other)])
        result.setdefault("degradation", {}).setdefault(task, {})[modalities.comparison_key(reference, other)] = (
          metrics.degradation(benchmarks.get(task).decision, first, second, rule(task)))
  return result


def common_questions(first: QuestionScores, second: QuestionScores) -> tuple[QuestionScores, QuestionScores]:
  """Both on the questions both hold, in the first's order."""
  in_second = set(second.ids)
  common = [i for i in first.ids if i in in_second]
  return first.select(common), second.select(common)
