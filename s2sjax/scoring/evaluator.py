"""The evaluator: built once (data loaded, steps compiled), then `evaluate(params, step)` as often as a training
loop likes, without recompiling. `python -m s2sjax.eval` drives the same object over checkpoints.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp
import numpy as np

from s2sjax.scoring import architectures
from s2sjax.data import metrics, modalities
from s2sjax.runtime.errors import UserError
from s2sjax.model.decoder import Params
from s2sjax.data.packing import RowShape, spanning
from s2sjax.data.rows import STREAM_ROWS
from s2sjax.data.questions import QuestionScores
from s2sjax.scoring.scorer import collect
from s2sjax.data.spec import SpecError
from s2sjax.data.task_data import TaskData


class EvalError(UserError, ValueError):
  """Model and data that do not fit together; the message says what to run."""


@dataclasses.dataclass(frozen=True)
class ScoringOptions:
  """How the scoring step runs, shared by `Evaluator` and `s2sjax.eval`'s EvalConfig."""

  batch_size: int = 8  # rows per step (rounded up to the data-parallel devices)
  dtype: str = "float32"  # compute and parameter dtype
  attention: str = "xla"  # xla | dot_product | cudnn | flash | flash_shared (model/attention); the CLI resolves "auto"

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)


def check_fit(config, data: TaskData, tokenizer_identity: dict | None = None) -> None:
  """Refuses data that was built for another tokenizer, another row format or another audio input than the
  model's (its architecture's `check_fit`: s2sjax/scoring/architectures)."""
  built_with = data.metadata.tokenizer or {"size": 0}  # None: a unit LM's data, no text tokenizer
  if tokenizer_identity is not None and tokenizer_identity["vocab_sha"] != built_with.get("vocab_sha"):
    raise EvalError(
      f"{data.task}/{data.modality} was built with tokenizer {built_with['name_or_path']} "
      f"({built_with['size']} tokens), not the checkpoint's ({tokenizer_identity['size']} tokens): rebuild it with "
      f"python -m tasks.prepare --task={data.task} --modality={data.modality} --spec={data.metadata.spec.name} "
      f"--row_length={data.shape.length} --tokenizer_dir=CHECKPOINT/tokenizer --data_dir=DATA_DIR"
    )
  architecture = architectures.for_config(config)
  text_rows = architecture.text_rows(config)
  if built_with["size"] > text_rows:
    raise EvalError(f"the data's tokenizer has {built_with['size']} tokens, the model's embedding {text_rows}")
  spec = data.metadata.spec
  modality = modalities.get(data.modality)
  try:  # data built by a version that did not refuse it: the same words as the build's
    spec.check_modality(modality)
  except SpecError as e:
    raise EvalError(f"{data.task}/{data.modality}: {e}") from None
  _check_rows_fit(architecture, config, data)
  try:
    architecture.check_fit(config, data)
  except architectures.FitError as e:
    raise EvalError(str(e)) from None


def _check_rows_fit(architecture: architectures.Architecture, config, data: TaskData) -> None:
  """The data's rows are the format the checkpoint's architecture scores, laid by that architecture's protocol."""
  spec = data.metadata.spec
  where = f"{data.task}/{data.modality} (spec {spec.name})"
  kind = lambda a: f"a {a.name} checkpoint" if a.name != architectures.DECODER else f"a {config.family} decoder"
  if data.row_format is not architecture.row_format:
    readers = [a.name for a in architectures.ARCHITECTURES if a.row_format is data.row_format]
    raise EvalError(f"{where} holds {data.row_format.name} rows, which {' or '.join(readers)} checkpoints read; this "
                    f"checkpoint is {kind(architecture)}, which reads {architecture.row_format.name} rows: build the "
                    f"data with a spec whose audio_mode lays those (its own spec)")
  if architecture.row_format is STREAM_ROWS and architectures.for_spec(spec) is not architecture:
    raise EvalError(f"{where} is laid by the {architectures.for_spec(spec).name} protocol; this checkpoint is "
                    f"{kind(architecture)}: build the data with a spec of architecture {architecture.name}")


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
    config,
    data: list[TaskData],
    options: ScoringOptions = ScoringOptions(),
    mesh=None,
    params_adapter: Callable[[Params], Params] | None = None,
  ):
    """config: any registered architecture's (s2sjax/scoring/architectures), whose scorer scores the data's rows.
    params_adapter maps another stack's params onto the model's tree (key renames, transposes)."""
    if not data:
      raise EvalError("no task data to evaluate")
    self.config, self.data, self.options = config, data, options
    self.params_adapter = params_adapter or (lambda p: p)
    for td in data:
      check_fit(config, td)
    # one step per length and codebook count (check_fit made sure every row format is the architecture's), for
    # the widest tables of the tasks that share it
    groups: dict[tuple, list[RowShape]] = {}
    for td in data:
      groups.setdefault(self._group(td), []).append(td.shape)
    make = architectures.for_config(config).scorer
    self._scorers = {key: make(config, spanning(shapes), mesh=mesh, batch_size=options.batch_size,
                               dtype=options.jnp_dtype, attention=options.attention) for key, shapes in groups.items()}
    self.history: list[dict] = []

  @staticmethod
  def _group(td: TaskData) -> tuple:
    return td.shape.length, td.shape.num_codebooks

  def scorer(self, td: TaskData):
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
    result = metrics.summarize({(td.task, td.label): self.score(params, td) for td in self.data})
    self.history.append({"step": step, **result})
    return result
