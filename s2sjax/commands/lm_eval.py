r"""An lm-evaluation-harness backend (`s2sjax`) on the packed, prefix-shared, sharded scorer.

  pip install -e '.[lmeval]'
  python -m s2sjax.lm_eval run --model s2sjax --model_args pretrained=DIR,mesh=data:-1,dtype=float32 \
      --tasks TASK[,TASK] [--include_path DIR] [--num_fewshot N] [--apply_chat_template] [--batch_size auto] \
      [--seed N] [--limit N] [--device cpu] [--output_path DIR --log_samples]

is lm-eval's own command line (every subcommand and flag, its `results_*.json` and `samples_*.jsonl` under
--output_path) with the `s2sjax` model registered; `--model` defaults to s2sjax. lm-eval 0.4 looks models up in its
own registry only (no entry points, no --include_path for models), so its `lm_eval` script cannot find this one.
In Python, `import s2sjax.lm_eval` registers it: `lm_eval.simple_evaluate(model="s2sjax",
model_args="pretrained=DIR,...", tasks=[...], device="cpu", batch_size="auto")`.

model_args: pretrained (or checkpoint; default: the embedded SmolLM2-135M), mesh (axes joined by '+', as lm-eval
splits model_args on commas: `data:-1+model:2`), dtype (float32 | bfloat16), row_length (the longest packed row, a
multiple of 32; a call lays its requests in rows of it, or of a half, a quarter, ... of it (at least 64) where those
take fewer positions; a request longer than max_length is fitted as the hf backend fits one, cut from the left,
with one warning a call saying how many: `S2SJaxLM._windows`; max_length is the positions the checkpoint was
trained on (its source config.json's max_position_embeddings, a MaxText run's max_target_length), at most
row_length - 1), add_bos_token (as the hf backend's), trust_remote_code (a tokenizer shipped
as code), spec (a preset or a spec YAML: the model's audio layout and tokenizer, for tasks with audio; none: a
text-only backend, which refuses them), audio_tokenizer_dir (where the spec's audio tokenizer's files are) and
protocol (s2sbench or utterance, as s2sjax.eval's --protocol: whether a recording that ends a continuation is closed
by the spec's end token, scored); any other key, or a value that makes no run, is refused by name before a model
is loaded, and lm-eval's command line here prints such a refusal as one line (`cli_evaluate`). What lm-eval passes itself (model_args may
give them too, as the hf backend's take them: model_args' value is the one used):
batch_size (the most rows a step, each holding many requests, a call's rows spread evenly over the steps they
need; `auto` or `auto:N`: the most rows, up to max_batch_size, default 64 (on CPUs two a device, where smaller
steps run faster), and no more than a call's rows, whose step fits the devices' memory, `rows_per_step`),
max_batch_size,
device (cpu, cuda, cuda:N, gpu or tpu: the JAX platform, with an index one device of it; default: JAX's).

The backend sits in `s2sjax/commands/` (the entry points, apart from the core) since its default model is
converted on first use, by `checkpoints_conversion`.

Requests are grouped by context: each context is one packed `Item` whose candidates are its continuations, so a
context is computed once however many continuations follow it; contexts whose continuations are one token each
and that open alike (a multiple-choice task's instructions and few-shot examples) lay the common opening once a
row (`shared_roots`, packing.SharedRoot). lm-eval's own `TemplateLM` splits context and
continuation (its `_encode_pair`, the rule the hf backend uses): trailing whitespace of the context moves to the
continuation, the whole string is tokenized and the continuation is the tokens past the context's own
tokenization; an empty context becomes the prefix token. Tokenization with special tokens follows the hf backend's
`tok_encode`; chat templates (`--apply_chat_template`) are the tokenizer's, applied as the hf backend applies them.
is_greedy comes from the same step: the count of a continuation's tokens that are not the argmax of the logits
that predict them. A request's log-likelihood is the same bits whatever else the call holds: items start at
multiples of 32 in their rows, are scored neighbour-free (`s2sjax.scoring.scorer.Scorer`) in steps of at least 64
positions a device (`SMALLEST_STEP`), each step's window as wide as its own rows need (`steps_by_window`), and a
continuation's NLL is summed on the host in float64. Requests whose context or continuation carries audio (lm-eval's
`doc_to_audio`, `<audio>` placeholders) are laid by `lm_eval_audio.AudioLayer` with the spec's audio tokenizer and
scored with the rest. Every lm-eval process sees every request (rank 0 of 1): the
scorer spreads rows over JAX processes.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import lm_eval.__main__
import lm_eval.evaluator
import lm_eval.models  # noqa: F401 - lm-eval's own models first: a registry with one entry skips their import
import numpy as np
from etils import epath
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from s2sjax.data.builds import PROTOCOLS
from s2sjax.data.spec import Spec, load_spec
from s2sjax.runtime import cache, cli, progress, sharding
from s2sjax.scoring import default_model, planner
from s2sjax.scoring.checkpoints import checkpoint as ckpt
from s2sjax.commands.default_checkpoint import default_checkpoint
from s2sjax.commands.lm_eval_audio import AudioLayer, Laid, named, recordings
from s2sjax.runtime.errors import UserError
from s2sjax.data.packing import NEIGHBOUR_FREE_ALIGN, Item, PackingError, PackReport, RowShape, fit, pack
from s2sjax.scoring.lm_eval_steps import (SMALLEST_STEP, by_window, even_steps, laid_whole, rows_per_step, shared_roots,
                                          step_shape, steps_by_window)
from s2sjax.scoring.scorer import Scorer, collect

log = logging.getLogger("lm_eval.s2sjax")  # lm-eval's own handler and level

# (context tokens, continuation tokens[, the context's codes: codebook tables' audio, -1 elsewhere])
Pair = tuple[list[int], list[int]] | tuple[list[int], list[int], np.ndarray]
PLATFORMS = {"cpu": "cpu", "cuda": "gpu", "gpu": "gpu", "rocm": "gpu", "tpu": "tpu"}  # lm-eval's device -> JAX's
AUTO_MAX_BATCH = 64  # the hf backend's default max_batch_size for batch_size=auto
DTYPES = ("float32", "bfloat16")
# How a request is fitted to a row (`S2SJaxLM._windows`), as each call's warning says it, with how many
FITTED = {
  "empty_context": "whitespace-only contexts scored after the prefix token, as an empty context is",
  "truncated_context": "contexts cut from the left to fit max_length={max_length} (the model's trained positions, "
                       "or row_length - 1 when fewer) with their continuation, as the hf backend cuts them",
  "split_continuation": "continuations longer than max_length={max_length} scored in pieces of max_length tokens, "
                        "each after the tokens before it, as loglikelihood_rolling scores a long text",
}
# what model_args may name (lm-eval adds batch_size, max_batch_size and device from its own flags)
MODEL_ARGS = ("pretrained", "checkpoint", "mesh", "dtype", "row_length", "add_bos_token", "trust_remote_code", "spec",
              "audio_tokenizer_dir", "protocol")
AUDIO_PROTOCOLS = ("s2sbench", "utterance")
# what lm-eval passes from its own flags, which model_args may also give (as the hf backend's model_args take them)
LM_EVAL_ARGS = ("batch_size", "max_batch_size", "device")
# the hf backend's max_length for a model whose config names no trained positions (HFLM._DEFAULT_MAX_LENGTH)
DEFAULT_MAX_LENGTH = 2048
# lm-eval's own rule for an instruct or chat model run without a chat template (lm_eval/evaluator.py, simple_evaluate)
CHAT_MODEL_WORDS = ("inst", "chat")


class BackendError(UserError, ValueError):
  """What lm-eval passed (model_args, a device, a request) does not make a run."""


class GenerationRefused(UserError, NotImplementedError):
  """A generation task asked of a backend that scores log-likelihoods only."""


class MultimodalRefused(UserError, ValueError):
  """Tasks with audio or images asked of a backend that reads text only."""


def _row_length(value) -> int:
  """model_args row_length: a positive multiple of NEIGHBOUR_FREE_ALIGN (items start at its multiples)."""
  digits = str(value).lstrip("-")
  if isinstance(value, bool) or not digits.isdigit() or int(value) <= 0 or int(value) % NEIGHBOUR_FREE_ALIGN:
    raise BackendError(f"row_length={value}: the packed row's length is a positive multiple of "
                       f"{NEIGHBOUR_FREE_ALIGN} (e.g. 1024)")
  return int(value)


def devices_for(device: str | None) -> list[jax.Device]:
  """The JAX devices lm-eval's `device` names: all of a platform's, or one local device with an index."""
  if device is None:
    return jax.devices()
  name, _, index = str(device).lower().partition(":")
  if name not in PLATFORMS:
    raise BackendError(f"device={device!r}: the s2sjax backend runs on JAX's {', '.join(PLATFORMS)} devices "
                     "(cuda:N for one of them)")
  try:
    devices = jax.devices(PLATFORMS[name])
  except RuntimeError as e:
    raise BackendError(f"device={device!r}: JAX has no {PLATFORMS[name]} backend here ({e})") from None
  if not index:
    return devices
  local = [d for d in devices if d.process_index == jax.process_index()]
  if not index.isdigit() or int(index) >= len(local) or jax.process_count() > 1:
    raise BackendError(f"device={device!r}: this process has {len(local)} {PLATFORMS[name]} devices (0.."
                     f"{len(local) - 1}); an index picks one, with one process")
  return [local[int(index)]]


@dataclasses.dataclass(frozen=True)
class BackendArguments:
  """model_args with lm-eval's batch_size, max_batch_size and device (`check_arguments`), as the backend runs."""
  checkpoint: str | None  # None: the embedded default
  mesh: jax.sharding.Mesh
  dtype: jnp.dtype
  row_length: int
  batch_size: int | None  # None: auto, each call sized for its rows
  max_batch_size: int
  add_bos_token: bool | None
  trust_remote_code: bool
  spec: Spec | None  # requests with audio are laid by it; None: text only
  audio_tokenizer_dir: str | None
  protocol: str


def check_arguments(pretrained: str | None = None, checkpoint: str | None = None, mesh: str = "data:-1",
                    dtype: str = "float32", batch_size: int | str = 8, max_batch_size: int | None = None,
                    device: str | None = None, row_length: int = 1024, add_bos_token: bool | None = None,
                    trust_remote_code: bool = False, spec: str | None = None, audio_tokenizer_dir: str | None = None,
                    protocol: str = "s2sbench", **unknown) -> BackendArguments:
  """Every argument checked, nothing loaded: an unknown key, a dtype, a row length, a batch size, a device or a
  mesh that makes no run is a BackendError naming it."""
  if unknown:
    raise BackendError(f"model_args {', '.join(f'{k}={v}' for k, v in unknown.items())}: not an argument of the "
                       f"s2sjax backend; it takes {', '.join(MODEL_ARGS + LM_EVAL_ARGS)}")
  if pretrained and checkpoint and pretrained != checkpoint:
    raise BackendError(f"pretrained={pretrained!r} and checkpoint={checkpoint!r}: give one of them")
  if max_batch_size is not None and not (str(max_batch_size).isdigit() and int(max_batch_size) > 0):
    raise BackendError(f"max_batch_size={max_batch_size!r}: the most rows a step, a positive number")
  if dtype not in DTYPES:
    raise BackendError(f"dtype={dtype}: the s2sjax backend scores in {' or '.join(DTYPES)}")
  row_length = _row_length(row_length)
  batch = str(batch_size)
  if not (batch.isdigit() and int(batch) > 0) and not (batch == "auto" or batch.startswith("auto:")):
    raise BackendError(f"batch_size must be a number of rows or auto, not {batch_size!r}")
  try:
    mesh = sharding.make_mesh(str(mesh).replace("+", ","), devices_for(device))
  except sharding.MeshError as e:
    raise BackendError(f"mesh={mesh}: {e}") from None
  if (pretrained or checkpoint) and not epath.Path(pretrained or checkpoint).exists():
    raise BackendError(f"pretrained={pretrained or checkpoint}: no such checkpoint")
  if protocol not in AUDIO_PROTOCOLS:
    raise BackendError(f"protocol={protocol}: the s2sjax backend lays recordings by {' or '.join(AUDIO_PROTOCOLS)} "
                       f"({'; '.join(f'{p}: {PROTOCOLS.get(p).summary}' for p in AUDIO_PROTOCOLS)})")
  loaded = load_spec(str(spec)) if spec else None  # an unknown preset or a bad file: a SpecError naming it
  # auto:N re-sizes each call anyway: every call is sized for its rows
  return BackendArguments(pretrained or checkpoint, mesh, jnp.dtype(dtype), row_length,
                          int(batch) if batch.isdigit() else None, int(max_batch_size or AUTO_MAX_BATCH),
                          add_bos_token, trust_remote_code, loaded, audio_tokenizer_dir, protocol)


def merged_arguments(model_args: dict, given: dict) -> dict:
  """model_args with what lm-eval passes from its own flags (`given`: batch_size, max_batch_size, device): a key
  model_args gives itself is its, as the hf backend takes `batch_size` in model_args (lm-eval always passes its
  own --batch_size, 1 by default, so both would reach the constructor)."""
  return {**{k: v for k, v in given.items() if v is not None}, **model_args}


class S2SJaxLM(TemplateLM):
  """lm-eval's `loglikelihood` and `loglikelihood_rolling` scored by `s2sjax.scoring.scorer.Scorer`."""

  # lm-eval hands a multimodal task only to a model class that says it takes one (lm_eval/evaluator.py:519-532);
  # without a spec that lays audio the backend refuses such a request itself, naming it (`_laid_audio`).
  MULTIMODAL = True

  @classmethod
  def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "S2SJaxLM":
    from lm_eval.utils import simple_parse_args_string

    return cls(**merged_arguments(simple_parse_args_string(arg_string), additional_config or {}))

  @classmethod
  def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "S2SJaxLM":
    return cls(**merged_arguments(dict(arg_dict), additional_config or {}))

  def __init__(self, **model_args):
    """`model_args` as `check_arguments` takes them, all checked before a model is loaded (or the default one
    converted)."""
    super().__init__()
    arguments = check_arguments(**model_args)
    self.dtype, self.row_length, self.mesh = arguments.dtype, arguments.row_length, arguments.mesh
    self.batch_size, self.max_batch_size = arguments.batch_size, arguments.max_batch_size
    self.add_bos_token = arguments.add_bos_token
    cache.use_compilation_cache()
    self.checkpoint = arguments.checkpoint or default_checkpoint()
    self.reader = ckpt.open(self.checkpoint)  # opened once: config, positions, parameters, tokenizer
    self.config = self.reader.config
    self.positions = self.reader.max_positions or DEFAULT_MAX_LENGTH
    self.params = self.reader.load_params(self.mesh, self.dtype)
    if arguments.spec is not None:  # as s2sjax.eval scores it: the embedded default's units, untrained rows
      self.config, self.params = default_model.fit_to_spec(self.config, self.params, arguments.spec,
                                                           self.reader.manifest())
    self.tokenizer = self.reader.load_tokenizer(arguments.trust_remote_code)
    if self.tokenizer is None:
      raise BackendError(f"{self.checkpoint} holds no tokenizer: lm-eval's requests are text")
    self.audio = (AudioLayer(arguments.spec, self, arguments.audio_tokenizer_dir, arguments.protocol)
                  if arguments.spec else None)
    self._compiled: dict[tuple[RowShape, int], Scorer] = {}
    self.batch_sizes: dict[int, int] = {}  # rows per step of each call (lm-eval reports them)
    self.contexts_scored = 0  # distinct contexts laid into rows, over this model's life
    self.rows_scored = 0
    self.fitted = collections.Counter()  # requests fitted to a row, by FITTED's case, over this model's life
    self._chat_templated = self._warned_chat = False
    # the last call's rows (`packs`: per group of like windows, the packing report, row shape, rows per step, and
    # the attention window and step count of each run of steps) and where its time went (`seconds`: tokenise, pack,
    # to_device, compile, step, from_device, host, collect)
    self.last_call: dict = {}
    self._tokens_from = 0.0  # when lm-eval's encoding ended and the backend's own part of a call began

  @property
  def eot_token_id(self) -> int:
    return self.tokenizer.eos_token_id

  @property
  def prefix_token_id(self) -> int:  # the hf backend's: BOS, else EOS
    bos = self.tokenizer.bos_token_id
    return bos if bos is not None else self.tokenizer.eos_token_id

  @property
  def max_length(self) -> int:
    """Context + continuation fed to the model, as the hf backend counts it (its last token is never an input):
    the positions the model was trained on (the checkpoint's, `checkpoint.open(...).max_positions`; the hf
    backend's 2,048 when it names none), and no more than a row holds."""
    return min(self.row_length - 1, self.positions)

  @property
  def tokenizer_name(self) -> str:
    """What lm-eval's request cache keys chat-templated requests by (the hf backend: its model's name)."""
    return str(self.checkpoint).replace("/", "__")

  def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The tokenizer's chat template over lm-eval's messages, as the hf backend applies it
    (lm_eval/models/huggingface.py, HFLM.apply_chat_template): rendered, not tokenized; a template that refuses a
    system message gets the messages without it."""
    import jinja2

    self._chat_templated = True
    render = lambda messages: self.tokenizer.apply_chat_template(
      messages, tokenize=False, add_generation_prompt=add_generation_prompt,
      continue_final_message=not add_generation_prompt)
    try:
      return render(chat_history)
    except jinja2.exceptions.TemplateError:
      log.warning("Failed to apply chat template. removing the system role in chat history.")
      return render([message for message in chat_history if message["role"] != "system"])

  def get_model_info(self) -> dict:
    """What lm-eval's results record of the model (its `config`)."""
    return {"model_checkpoint": str(self.checkpoint), "model_num_parameters": self.config.num_params(),
            "model_dtype": self.dtype.name, "row_length": self.row_length, "mesh": dict(self.mesh.shape)}

  def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
    """The hf backend's rule: add_special_tokens if given, else add_bos_token if given, else the tokenizer's
    default; never when the string already starts with the prefix token."""
    del kwargs
    chosen = add_special_tokens if add_special_tokens is not None else self.add_bos_token
    options = {} if chosen is None else {"add_special_tokens": chosen}
    if add_special_tokens is None and string.startswith(self.tokenizer.decode(self.prefix_token_id)):
      options["add_special_tokens"] = False
    return self.tokenizer.encode(string, **options)

  def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
    """lm-eval's (`TemplateLM.loglikelihood`: each request's context and continuation encoded, `_encode_pair`,
    then `_loglikelihood_tokens`), with its encoding timed into last_call's seconds["tokenise"]; the requests that
    carry audio (lm-eval's multimodal argument after context and continuation) laid by the spec
    (`_laid_audio`) and scored after them."""
    heard = [i for i, request in enumerate(requests) if len(request.args) > 2]
    spoken = self._laid_audio([requests[i] for i in heard]) if heard else []  # refused before anything is scored
    written = [i for i in range(len(requests)) if i not in set(heard)]
    results: list = [None] * len(requests)
    start = time.perf_counter()
    if written:
      scored = super().loglikelihood([requests[i] for i in written], disable_tqdm=disable_tqdm)
      for i, result in zip(written, scored):
        results[i] = result
      if self.last_call:
        self.last_call["seconds"]["tokenise"] = self._tokens_from - start
    if spoken:
      for i, result in zip(heard, self._loglikelihood_tokens(spoken, disable_tqdm=disable_tqdm)):
        results[i] = result
    return results

  def _laid_audio(self, requests) -> list[tuple]:
    """Requests with audio as `_loglikelihood_tokens` takes them, with the context's codes; refused, naming the
    first such request, by a backend given no spec that lays audio, or where one is longer than max_length + 1
    tokens (a recording is not cut)."""
    refusal = "no spec (model_args spec=NAME or FILE.yaml)" if self.audio is None else self.audio.refusal()
    if refusal:
      raise BackendError(f"{named(requests[0])} carries audio (lm-eval's doc_to_audio) and the s2sjax backend was "
                         f"given {refusal}: it scores text only")
    laid = []
    for request, heard in zip(requests, recordings(requests)):
      pair: Laid = self.audio.lay(request, heard)
      if not pair.continuation:
        raise BackendError(f"{named(request)}: its continuation lays no tokens")
      if len(pair.context) + len(pair.continuation) > self.max_length + 1:
        raise BackendError(f"{named(request)}: {len(pair.context)} + {len(pair.continuation)} tokens with its audio "
                           f"laid, past max_length={self.max_length} + 1; a recording is not cut")
      laid.append((tuple(request.args[:2]), pair.context, pair.continuation, pair.codes))
    return laid

  def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str], list[int], list[int]]],
                            disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
    del kwargs
    self._tokens_from = time.perf_counter()
    pairs, owner, fitted = [], [], {}  # fitted: how -> [first request, count]
    for index, (_, context, continuation, *codes) in enumerate(requests):
      if codes:  # laid with its audio, which is never cut (`_laid_audio`)
        pairs.append((context, continuation, codes[0]))
        owner.append(index)
        continue
      windows, cases = self._windows(context, continuation, index)
      pairs += windows
      owner += [index] * len(windows)
      for case in cases:
        self.fitted[case] += 1
        fitted.setdefault(case, [index, 0])[1] += 1
    for case, (first, count) in fitted.items():
      log.warning(f"{count} of {len(requests)} requests: {FITTED[case].format(max_length=self.max_length)} "
                  f"(the first: request {first})")
    logprobs, greedy = self.score_pairs(pairs, greedy=True, progress=not disable_tqdm)
    totals, all_greedy = np.zeros(len(requests)), [True] * len(requests)
    for index, logprob, is_greedy in zip(owner, logprobs, greedy):
      totals[index] += logprob
      all_greedy[index] = all_greedy[index] and is_greedy
    return [(float(t), bool(g)) for t, g in zip(totals, all_greedy)]

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    """The hf backend's windows: the first predicts every token from the prefix token, later ones up to
    max_length new tokens each with the tokens before them as context (lm_eval.utils.get_rolling_token_windows
    with context_len=1, made disjoint); a request's log-likelihood is the sum over its windows."""
    pairs, owner = [], []
    for index, request in enumerate(requests):
      if len(request.args) > 1:
        raise BackendError(f"{named(request)} carries audio: a log-likelihood of a whole text is scored of text only")
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
    raise GenerationRefused("the s2sjax backend scores log-likelihoods only (loglikelihood, loglikelihood_rolling, "
                            "multiple_choice tasks); generation tasks need another backend")

  def _windows(self, context: list[int], continuation: list[int], index: int) -> tuple[list[Pair], list[str]]:
    """One request as the (context, continuation) pairs that fill at most a row each, the hf backend's way
    (lm_eval/models/huggingface.py, HFLM._loglikelihood_tokens): context + continuation keep their last
    max_length + 1 tokens, the context losing its first ones. Two kinds hf stops the run at (its asserts) are
    scored instead: a continuation longer than max_length in pieces of max_length tokens, each after the tokens
    before it (lm-eval's rule for a text longer than the window, `loglikelihood_rolling`), its log-likelihood the
    pieces' sum and is_greedy all of theirs; a context that encodes to no tokens (whitespace only: lm-eval's
    `_encode_pair` moves it into the continuation) as the prefix token, as lm-eval lays an empty context.
    Returns the pairs and which of FITTED's cases the request is."""
    if not continuation:
      raise BackendError(f"request {index}: lm-eval gave an empty continuation")
    cases = []
    if not context:
      context = [self.prefix_token_id]
      cases.append("empty_context")
    if len(context) + len(continuation) > self.max_length + 1:
      cases.append("truncated_context")
    if len(continuation) > self.max_length:
      cases.append("split_continuation")
    windows, before = [], list(context)
    for start in range(0, len(continuation), self.max_length):
      piece = continuation[start:start + self.max_length]
      windows.append((before[-(self.max_length + 1 - len(piece)):], piece))
      before += piece
    return windows, cases

  def _warn_without_chat_template(self) -> None:
    """lm-eval's warning for an instruct or chat model scored without its chat template (it reads the hf
    backend's `pretrained`; here the checkpoint's path and its converted source's name), once."""
    if self._chat_templated or self._warned_chat:
      return
    self._warned_chat = True
    source = self.reader.manifest().get("source", "")
    named = f"{self.checkpoint} {os.path.basename(str(source))}".lower()
    if any(word in named for word in CHAT_MODEL_WORDS):
      log.warning(f"{self.checkpoint} (converted from {source}) appears to be an instruct or chat variant but chat "
                  "template is not applied. Recommend setting `apply_chat_template` (optionally "
                  "`fewshot_as_multiturn`).")

  def score_pairs(self, pairs: list[Pair], greedy: bool = True,
                  progress: bool = True) -> tuple[np.ndarray, list[bool | None]]:
    """Log-likelihood of each continuation after its context and (with `greedy`) whether every continuation
    token is the argmax, in the order given. Pairs sharing a context are one item: the context is laid once. Items
    are scored in groups of like windows (`by_window`), each packed and stepped on its own."""
    if not pairs:
      return np.zeros(0), []
    self._warn_without_chat_template()
    members, items = self.items_for(pairs)
    self.last_call = dict(packs=[], seconds=collections.Counter())
    logprobs = np.zeros(len(pairs))
    is_greedy: list[bool | None] = [None] * len(pairs)
    for group in by_window(items):
      nll_sum, misses = self._score_items([items[g] for g in group], greedy, progress)
      for g, item_nll, item_misses in zip(group, nll_sum, misses):
        for c, index in enumerate(members[g]):
          logprobs[index] = -item_nll[c]
          if greedy:
            is_greedy[index] = bool(item_misses[c] == 0)
    self.contexts_scored += len(items)
    return logprobs, is_greedy

  def _score_items(self, items: list[Item], greedy: bool, progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per item and candidate [items, most candidates]: the summed NLL and the count of non-argmax tokens (zeros
    without `greedy`). Adds what its rows took to last_call: their packing report, row shape, rows per step, and
    each run of steps' window and step count (`steps_by_window`) in `packs`, and where the time went in `seconds`
    (pack, to_device, compile, step, from_device, host, collect)."""
    start = time.perf_counter()
    rows, report, capacity = self._packed(items)
    # the head runs over the targets the rows hold, attention over item windows (CMMLU's long contexts and
    # one-token choices: a few targets a row, not half of it)
    rows, shape = fit(rows, capacity, report.longest_item)
    num_rows = len(rows["tokens"])
    batch = self._rows_per_step(step_shape(shape, report.longest_item), num_rows)
    runs = steps_by_window(rows, batch)
    packed = time.perf_counter()
    slots: dict[str, np.ndarray] = {}
    windows, steps = [], []
    for run, longest in runs:
      scorer = self._scorer(step_shape(shape, longest), batch)
      part = scorer.score_slots(self.params, {key: value[run] for key, value in rows.items()}, progress=progress)
      for key, value in part.items():
        slots.setdefault(key, np.zeros((num_rows, *value.shape[1:]), value.dtype))[run] = value
      self.last_call["seconds"].update(scorer.seconds)
      windows.append(scorer.window)
      steps.append(-(-len(run) // batch))
    scored = time.perf_counter()
    candidates = [len(item.candidates) for item in items]
    scores = collect(rows, slots["nll_sum"], slots["n_tokens"], candidates)
    # collect maps any per-slot value back to (item, candidate): here the count of non-argmax tokens
    misses = collect(rows, slots["greedy_misses"], slots["n_tokens"], candidates).nll_sum if greedy else None
    self.rows_scored += num_rows
    self.last_call["seconds"].update(dict(pack=packed - start, collect=time.perf_counter() - scored))
    self.last_call["packs"].append(dict(pack=report.as_dict(), shape=shape, rows_per_step=batch, windows=windows,
                                        steps=steps))
    return scores.nll_sum, np.zeros_like(scores.nll_sum) if misses is None else misses

  def items_for(self, pairs: list[Pair]) -> tuple[list[list[int]], list[Item]]:
    """The packer's items for `pairs`, one per distinct context with its continuations as candidates, and the
    pairs (indices) of each item."""
    groups: dict[tuple, list[int]] = {}
    for index, pair in enumerate(pairs):
      codes = _context_codes(pair)
      groups.setdefault((tuple(pair[0]), None if codes is None else codes.tobytes()), []).append(index)
    codebooks = len(self.config.audio_codebook_sizes)  # a model that also takes audio reads text rows too
    items = []
    for g, members in enumerate(groups.values()):
      context, codes = pairs[members[0]][0], _context_codes(pairs[members[0]])
      if codebooks and codes is None:
        codes = np.full((len(context), codebooks), -1, np.int32)
      items.append(Item(np.asarray(context, np.int32), tuple(np.asarray(pairs[i][1], np.int32) for i in members),
                        codes if codebooks else None, name=f"context {g}"))
    return list(groups.values()), items

  def _packed(self, items: list[Item]) -> tuple[dict[str, np.ndarray], PackReport, RowShape]:
    """The items packed into the rows that lay them in the fewest positions: rows of row_length, or of a half, a
    quarter, ... of it, down to SMALLEST_STEP, that still hold every item (a call of a few short requests, or a
    call's last row, need not compute a whole row of row_length; neighbour-free rows score the same bits at any
    length). Returns the rows, their report and the capacity they were packed into."""
    codebooks = len(self.config.audio_codebook_sizes)
    roots = shared_roots(items)
    longest = max(len(c) for item in items for c in item.candidates)
    best = None
    length = self.row_length
    while length % NEIGHBOUR_FREE_ALIGN == 0 and length > longest and (
        length >= SMALLEST_STEP or length == self.row_length):
      # Multiple-choice continuations are short; a rolling window's is up to a row: only then a wider target table.
      capacity = RowShape(length, max(length // 2, longest), max(length // 4, 4), codebooks)
      try:
        rows, report = pack(items, capacity, align=NEIGHBOUR_FREE_ALIGN, roots=laid_whole(roots, items, capacity))
      except PackingError:
        if best is None:  # the row_length itself: what the request is, named
          raise
        break  # an item longer than these rows: shorter ones hold it no better
      if best is None or report.rows * length < best[1].rows * best[2].length:
        best = rows, report, capacity
      length //= 2
    return best

  def _rows_per_step(self, shape: RowShape, rows: int) -> int:
    """Rows a step for a call's `rows` of `shape`: batch_size, or with auto as many as fit (`rows_per_step`), the
    rows spread evenly over the steps (`even_steps`), and enough that each data-parallel device steps at least
    SMALLEST_STEP positions."""
    most = self.batch_size or rows_per_step(self.config, shape, rows, self.mesh, self.dtype, self.max_batch_size,
                                            min(map(planner.device_memory, self.mesh.local_devices)))
    data_parallel = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    batch = max(even_steps(rows, most), -(-SMALLEST_STEP // shape.length) * data_parallel)
    self.batch_sizes[len(self.batch_sizes)] = batch
    return batch

  def _scorer(self, shape: RowShape, batch: int) -> Scorer:
    """The neighbour-free scorer for one row shape and batch, compiled once."""
    if (shape, batch) not in self._compiled:
      self._compiled[shape, batch] = Scorer(self.config, shape, mesh=self.mesh, batch_size=batch, dtype=self.dtype,
                                            neighbour_free=True)
    return self._compiled[shape, batch]


def _context_codes(pair: Pair) -> np.ndarray | None:
  """The codes a pair's context carries (codebook tables' audio), or None."""
  return pair[2] if len(pair) > 2 else None


# Registered by name (imported when first asked for): run as `python -m s2sjax.lm_eval` this file is `__main__`,
# and its class and the one `s2sjax.lm_eval` defines must not both claim the name.
if "s2sjax" not in model_registry:
  model_registry.register("s2sjax", target="s2sjax.commands.lm_eval:S2SJaxLM")


@contextlib.contextmanager
def _git_quiet():
  """lm-eval records the git commit of the working directory in its results (lm_eval/loggers/utils.py,
  get_git_commit_hash: `git describe`, then reading .git itself); outside a repository git says `fatal: not a git
  repository` on the console, which tells the user nothing. Its stderr is dropped while lm-eval asks."""
  original = lm_eval.evaluator.get_git_commit_hash

  def quiet() -> str | None:
    with open(os.devnull, "w") as devnull:
      saved = os.dup(2)
      os.dup2(devnull.fileno(), 2)  # git writes to the process's stderr, not Python's
      try:
        return original()
      finally:
        os.dup2(saved, 2)
        os.close(saved)

  lm_eval.evaluator.get_git_commit_hash = quiet
  try:
    yield
  finally:
    lm_eval.evaluator.get_git_commit_hash = original


@contextlib.contextmanager
def _arguments_checked_first():
  """lm-eval's command line indexes its ~14,000 task files (~10 s on a 2-core CPU) before it builds the backend
  (lm_eval/_cli/run.py, `_execute`: `process_tasks`, then `simple_evaluate`): the backend's arguments, as lm-eval
  parsed them, are checked before that, so that a typo is refused at once."""
  from lm_eval.config.evaluate_config import EvaluatorConfig

  original = EvaluatorConfig.process_tasks

  def checked_first(config, *args, **kwargs):
    if config.model == "s2sjax":
      given = dict(batch_size=config.batch_size, max_batch_size=config.max_batch_size, device=config.device)
      check_arguments(**merged_arguments(config.model_args or {}, given))
    return original(config, *args, **kwargs)

  EvaluatorConfig.process_tasks = checked_first
  try:
    yield
  finally:
    EvaluatorConfig.process_tasks = original


@contextlib.contextmanager
def _multimodal_refused_in_one_line():
  """lm-eval refuses a task with audio or images (`doc_to_audio` / `doc_to_image`) for a model class that does not
  say it takes them (lm_eval/evaluator.py:519-532, `MULTIMODAL`) with a ValueError, a traceback on its command
  line: the same check, made as `evaluate` starts, is a refusal of one line here (for lm-eval's own text
  backends; the s2sjax backend refuses such a request itself when it has no spec that lays audio)."""
  original = lm_eval.evaluator.evaluate

  def checked(lm, task_dict, *args, **kwargs):
    tasks = task_dict.get("tasks", {}) if isinstance(task_dict, dict) else {}
    heard = [name for name, task in tasks.items() if getattr(task, "MULTIMODAL", False)]
    if heard and not getattr(lm, "MULTIMODAL", False):
      raise MultimodalRefused(f"task {', '.join(heard)} carries audio or images (doc_to_audio / doc_to_image) and "
                              f"the {type(lm).__name__} backend reads text only; the s2sjax backend scores audio "
                              "with model_args spec=NAME")
    return original(lm, task_dict, *args, **kwargs)

  lm_eval.evaluator.evaluate = checked
  try:
    yield
  finally:
    lm_eval.evaluator.evaluate = original


def cli_evaluate(argv: list[str] | None = None) -> None:
  """lm-eval's own command line (`lm_eval.__main__.cli_evaluate`) with this backend registered and `--model`
  defaulting to s2sjax. lm-eval builds and calls the backend itself, so what every s2sjax command line does
  (s2sjax/runtime/cli.py) is done here: a refusal of the backend's (a UserError: model_args, a device, a mesh, a
  checkpoint, a generation task, an audio task given a text-only backend) is one line and exit 1; SIGINT or SIGTERM stops the run at once, even mid-step,
  and says that lm-eval writes its files only when a run ends."""
  args = list(sys.argv[1:] if argv is None else argv)
  named = any(a in ("--model", "-M", "-h", "--help") or a.startswith("--model=") for a in args)
  if args and not named and args[0] not in ("ls", "validate"):
    args += ["--model", "s2sjax"]
  sys.argv = [sys.argv[0]] + args
  cli.catch_interrupts()
  try:
    with _git_quiet(), _arguments_checked_first(), _multimodal_refused_in_one_line():
      lm_eval.__main__.cli_evaluate()
  except cli.Interrupted as e:
    progress.end_bars()
    print(f"interrupted by {signal.Signals(e.signum).name}: lm-eval writes its results when a run ends, so nothing "
          "was written; rerun the command", file=sys.stderr, flush=True)
    cli.exit_at_once(128 + e.signum)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(1)


if __name__ == "__main__":
  cli_evaluate()
