r"""An lm-evaluation-harness backend (`s2sjax`) on the packed, prefix-shared, sharded scorer.

  pip install -e '.[lmeval]'
  python -m s2sjax.lm_eval --model_args=checkpoint=DIR,mesh=data:-1,dtype=float32 --tasks=TASK[,TASK] \
      [--include_path=DIR] [--limit=N] [--output_path=FILE.json]

or, in Python, `import s2sjax.lm_eval` (it registers the model) and
`lm_eval.simple_evaluate(model="s2sjax", model_args="checkpoint=DIR,...", tasks=[...])`.

model_args: checkpoint (default: the embedded SmolLM2-135M), mesh (axes joined by '+', as lm-eval splits
model_args on commas: `data:-1+model:2`), dtype (float32 | bfloat16), batch_size (rows per step), row_length (the
packed row; contexts are left-truncated to fit it, as lm-eval's hf backend truncates to its max_length, which here
is row_length - 1), add_bos_token (as the hf backend's). is_greedy (read by multiple-choice tasks too, as their
exact_match) takes a second pass over the same rows: the scorer returns NLL sums only.

Requests are grouped by context: each context is one packed `Item` whose candidates are its continuations, so a
context is computed once however many continuations follow it. lm-eval's own `TemplateLM` splits context and
continuation (its `_encode_pair`, the rule the hf backend uses): trailing whitespace of the context moves to the
continuation, the whole string is tokenized and the continuation is the tokens past the context's own
tokenization; an empty context becomes the prefix token. Tokenization with special tokens follows the hf backend's
`tok_encode`. Every lm-eval process sees every request (rank 0 of 1): the scorer spreads rows over JAX processes.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from s2sjax import checkpoint as ckpt
from s2sjax import default_model, sharding
from s2sjax.packing import Item, RowShape, pack
from s2sjax.scoring import Scorer, collect

Pair = tuple[list[int], list[int]]  # (context tokens, continuation tokens)
@register_model("s2sjax")
class S2SJaxLM(TemplateLM):
  """lm-eval's `loglikelihood` and `loglikelihood_rolling` scored by `s2sjax.scoring.Scorer`."""

  def __init__(self, checkpoint: str | None = None, mesh: str = "data:-1", dtype: str = "float32",
               batch_size: int | str = 8, row_length: int = 1024, add_bos_token: bool | None = None):
    super().__init__()
    if not isinstance(batch_size, int):
      raise ValueError(f"batch_size must be a number of rows, not {batch_size!r}")
    self.checkpoint = checkpoint or default_model.default_checkpoint()
    self.mesh = sharding.make_mesh(str(mesh).replace("+", ","))
    self.dtype = jnp.dtype(dtype)
    self.batch_size, self.row_length, self.add_bos_token = batch_size, row_length, add_bos_token
    self.config = ckpt.load_config(self.checkpoint)
    self.params = ckpt.load_params(self.checkpoint, mesh=self.mesh, dtype=self.dtype)
    self.tokenizer = ckpt.load_tokenizer(self.checkpoint)
    if self.tokenizer is None:
      raise ValueError(f"{self.checkpoint} holds no tokenizer: lm-eval's requests are text")
    self._compiled: dict[RowShape, Scorer] = {}
    self.contexts_scored = 0  # distinct contexts laid into rows, over this model's life
    self.rows_scored = 0

  @property
  def eot_token_id(self) -> int:
    return self.tokenizer.eos_token_id

  @property
  def prefix_token_id(self) -> int:  # the hf backend's: BOS, else EOS
    bos = self.tokenizer.bos_token_id
    return bos if bos is not None else self.tokenizer.eos_token_id

  @property
  def max_length(self) -> int:
    """Context + continuation fed to the model, as the hf backend counts it (its last token is never an input)."""
    return self.row_length - 1

  def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
    """The hf backend's rule: add_special_tokens if given, else add_bos_token if given, else the tokenizer's
    default; never when the string already starts with the prefix token."""
    del kwargs
    chosen = add_special_tokens if add_special_tokens is not None else self.add_bos_token
    options = {} if chosen is None else {"add_special_tokens": chosen}
    if add_special_tokens is None and string.startswith(self.tokenizer.decode(self.prefix_token_id)):
      options["add_special_tokens"] = False
    return self.tokenizer.encode(string, **options)

  def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str], list[int], list[int]]],
                            disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
    del kwargs
    pairs = [self._fit(context, continuation) for _, context, continuation in requests]
    logprobs, greedy = self.score_pairs(pairs, greedy=True, progress=not disable_tqdm)
    return [(float(lp), bool(g)) for lp, g in zip(logprobs, greedy)]

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    """The hf backend's windows: the first predicts every token from the prefix token, later ones up to
    max_length new tokens each with the tokens before them as context (lm_eval.utils.get_rolling_token_windows
    with context_len=1, made disjoint); a request's log-likelihood is the sum over its windows."""
    pairs, owner = [], []
    for index, request in enumerate(requests):
      (string,) = request.args
      windows = get_rolling_token_windows(self.tok_encode(string), self.prefix_token_id, self.max_length, 1)
      for context, continuation in map(make_disjoint_window, windows):
        pairs.append((context, continuation))
        owner.append(index)
    logprobs, _ = self.score_pairs(pairs, greedy=False, progress=not disable_tqdm)
    totals = np.zeros(len(requests))
    np.add.at(totals, np.asarray(owner, np.int64), logprobs)
    for request, total in zip(requests, totals):
      self.cache_hook.add_partial("loglikelihood_rolling", request.args, float(total))
    return [float(t) for t in totals]

  def generate_until(self, requests, disable_tqdm: bool = False):
    raise NotImplementedError("the s2sjax backend scores log-likelihoods only (loglikelihood, "
                              "loglikelihood_rolling, multiple_choice tasks); generation tasks need another backend")

  def _fit(self, context: list[int], continuation: list[int]) -> Pair:
    """Left-truncates the context as the hf backend does: context + continuation keep their last max_length + 1
    tokens, so the pair fills at most one row."""
    if not context or not continuation:
      raise ValueError("lm-eval gave an empty context or continuation")
    if len(continuation) > self.max_length:
      raise ValueError(f"a continuation of {len(continuation)} tokens does not fit row_length={self.row_length}")
    return context[-(self.max_length + 1 - len(continuation)):], continuation

  def score_pairs(self, pairs: list[Pair], greedy: bool = True,
                  progress: bool = True) -> tuple[np.ndarray, list[bool | None]]:
    """Log-likelihood of each continuation after its context and (with `greedy`) whether every continuation
    token is the argmax, in the order given. Pairs sharing a context are one item: the context is laid once."""
    if not pairs:
      return np.zeros(0), []
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, (context, _) in enumerate(pairs):
      groups.setdefault(tuple(context), []).append(index)
    codebooks = len(self.config.audio_codebook_sizes)  # a model that also takes audio reads text rows too
    items = [Item(np.asarray(context, np.int32), tuple(np.asarray(pairs[i][1], np.int32) for i in members),
                  np.full((len(context), codebooks), -1, np.int32) if codebooks else None, name=f"context {g}")
             for g, (context, members) in enumerate(groups.items())]
    longest = max((len(c) for _, c in pairs), default=1)
    # Multiple-choice continuations are short; a rolling window's is up to a row: only then a wider target table.
    shape = RowShape(self.row_length, max(self.row_length // 2, longest), max(self.row_length // 4, 4), codebooks)
    scorer = self._scorer(shape)
    rows, _ = pack(items, shape)
    candidates = [len(item.candidates) for item in items]
    slots = scorer.score_slots(self.params, rows, progress=progress)
    scores = collect(rows, slots["nll_sum"], slots["n_tokens"], candidates)
    self.contexts_scored += len(items)
    self.rows_scored += len(rows["tokens"])
    # collect maps any per-slot value back to (item, candidate): here the count of non-argmax tokens
    misses = collect(rows, slots["greedy_misses"], slots["n_tokens"], candidates).nll_sum if greedy else None
    logprobs = np.zeros(len(pairs))
    is_greedy: list[bool | None] = [None] * len(pairs)
    for g, members in enumerate(groups.values()):
      for c, index in enumerate(members):
        logprobs[index] = -scores.nll_sum[g, c]
        if misses is not None:
          is_greedy[index] = bool(misses[g, c] == 0)
    return logprobs, is_greedy

  def _scorer(self, shape: RowShape) -> Scorer:
    """The scorer for one row shape, compiled once."""
    if shape not in self._compiled:
      self._compiled[shape] = Scorer(self.config, shape, mesh=self.mesh, batch_size=self.batch_size, dtype=self.dtype)
    return self._compiled[shape]


def main(argv) -> None:
  del argv
  import lm_eval
  from absl import flags
  from lm_eval.tasks import TaskManager

  FLAGS = flags.FLAGS
  tasks = [t for t in FLAGS.tasks.split(",") if t]
  results = lm_eval.simple_evaluate(
    model="s2sjax", model_args=FLAGS.model_args, tasks=tasks, limit=FLAGS.limit,
    task_manager=TaskManager(include_path=FLAGS.include_path), log_samples=FLAGS.log_samples,
  )
  if jax.process_index() != 0 or results is None:
    return
  print(lm_eval.utils.make_table(results))
  if FLAGS.output_path:
    with open(FLAGS.output_path, "w") as f:
      json.dump(results, f, indent=2, default=str)
    print(f"results: {FLAGS.output_path}", file=sys.stderr)


if __name__ == "__main__":
  from absl import flags

  from s2sjax import cli

  flags.DEFINE_string("model_args", "", "checkpoint=DIR,mesh=data:-1,dtype=float32,batch_size=8,row_length=1024")
  flags.DEFINE_string("tasks", None, "Comma-separated lm-eval task names.", required=True)
  flags.DEFINE_string("include_path", None, "A folder of local task YAMLs.")
  flags.DEFINE_integer("limit", None, "Documents per task (for a quick look).")
  flags.DEFINE_string("output_path", None, "Write lm-eval's results here (JSON).")
  flags.DEFINE_bool("log_samples", False, "Keep per-document requests and responses in the results.")
  cli.run(main)
