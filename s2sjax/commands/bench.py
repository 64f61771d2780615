r"""Benchmark: the PyTorch reference protocol against s2sjax without and with prefix sharing, in one run.

  python -m s2sjax.bench [--checkpoint=DIR] [--workload=stories,speech] [--items=48] [--row_length=auto,L,...]
  python -m s2sjax.bench --workload=storycloze --storycloze_csv="cloze_test_test__spring2016 - cloze_test_ALL_test.csv" \
      --items=1871 --protocols=shared,local --row_length=auto,1024   (the real StoryCloze test stories, T->T)
  python -m s2sjax.bench --mode=accelerator --row_length=2048 --dtype=bfloat16   (see s2sjax/benchmarks/accelerator.py)

For the same model and items it prints, side by side: tokens computed and wall time of
  * reference: S2SBench's `generate_batch_response` protocol in transformers — every prefix + candidate its own
    sequence, batched with padding, full logits, mean cross-entropy over the candidate;
  * s2sjax, no sharing: packed rows, every prefix + candidate its own segment;
  * s2sjax, shared: packed rows, each prefix laid once and every candidate branching from it (dense attention);
  * s2sjax, shared, item-local: the same rows, each query block attending over its item's keys only (the default);
with the attention each ran (`--attention=auto`, the default: what `s2sjax.eval` picks for such rows), packing
efficiency, tokens/s and achieved FLOP/s (both over the tokens computed, padding included) and the
largest disagreement in mean NLL. Each s2sjax protocol runs at each row length given (`auto`, the default: the
length a build chooses for the items), against the one reference run. On a CPU a last line names the processor
and how fast one 2048^2 matmul in the run's dtype goes on each side (torch's BLAS, XLA): per token, the two
sides' ratio is that of the FLOPs each executes times that of the FLOP/s each reaches (the GFLOP/s column), and
the probe shows how much of the second is the libraries' and the processor's rather than the protocols'.
Workloads: `stories` (text prefix of about 60 tokens, two endings) and `speech` (about 200 audio-unit tokens, four
options), on the model's own vocabulary; `storycloze`: the real StoryCloze test
stories from `--storycloze_csv`, tokenized by the checkpoint's tokenizer as `tasks.build` tokenizes T->T items.
The default model is the embedded SmolLM2-135M.

  python -m s2sjax.bench --mode=lm_eval --workloads=cmmlu:0,cmmlu:3,xcopa_zh,xstorycloze_en,xstorycloze_zh,storycloze \
      --cmmlu_dir=CMMLU/data --xcopa_dir=XCOPA --xstorycloze_dir=XSTORYCLOZE --storycloze_dir=STORYCLOZE \
      [--subjects=agronomy,anatomy,ancient_chinese] [--items=40] [--row_length=1024] [--lm_eval_batch_size=auto] \
      [--float64_requests=40] [--output=results.json]

runs lm-eval's own task definitions (its templates, choices, splits and first-n shots; `lm_eval_tasks`) of each
workload (NAME:SHOTS) over local copies of the data (CMMLU's data/ folder, the XCOPA repo, the XStoryCloze and
StoryCloze 2016 releases) through both lm-eval backends on the same weights, one run each: lm-eval's `hf`
(transformers, its logits cache computing a context once for one-token choices) and `s2sjax` (s2sjax.lm_eval).
A line a workload: both wall times and their ratio, where s2sjax's time went (tokenising, packing, host batches,
transfers, compiles, steps), each backend's largest and mean distance to a float64 transformers forward of the first
`--float64_requests` requests, and whether the decisions agree; `--output` keeps every figure as JSON.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from checkpoints_conversion.verify import load_torch_model
from s2sjax.scoring import planner
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.benchmarks import accelerator as bench_accelerator
from s2sjax.runtime import cli
from s2sjax.benchmarks.machine import cpu_machine, machine_line, torch_dtype
from s2sjax.benchmarks.workloads import (PROTOCOLS, WORKLOADS, BenchError, make_items, row_shape,
                                        storycloze_items)
from s2sjax.commands.default_checkpoint import default_checkpoint
from s2sjax.model.attention import auto_implementation
from s2sjax.model.config import ModelConfig
from s2sjax.data.packing import Item, RowShape, fit, pack
from s2sjax.scoring.scorer import Scorer, collect

FLAGS = flags.FLAGS
STORYCLOZE = "storycloze"  # the real StoryCloze test stories (--storycloze_csv), beside the synthetic WORKLOADS


def reference_model(source: str, dtype):
  """The checkpoint's source in transformers, in the s2sjax side's dtype, on the GPU when there is one: both
  protocols run on the same device at the same precision."""
  import torch  # the reference side's: an accelerator image may run --mode=accelerator without it

  device = "cuda" if torch.cuda.is_available() else "cpu"
  return load_torch_model(source).to(device=device, dtype=torch_dtype(dtype))


def reference_protocol(torch_model, config: ModelConfig, items: list[Item], batch_size: int) -> tuple[np.ndarray, int, float]:
  """(mean NLL [N, C], tokens computed, FLOPs) the S2SBench way."""
  import torch

  sequences = [(i, c, np.concatenate([it.prefix, cand]), len(it.prefix)) for i, it in enumerate(items)
               for c, cand in enumerate(it.candidates)]
  out = np.full((len(items), max(len(it.candidates) for it in items)), np.nan)
  computed, flops = 0, 0.0
  for start in range(0, len(sequences), batch_size):
    batch = sequences[start : start + batch_size]
    width = max(len(s[2]) for s in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), -100)
    for b, (_, _, tokens, prefix_len) in enumerate(batch):
      ids[b, : len(tokens)] = torch.from_numpy(tokens)
      mask[b, : len(tokens)] = 1
      labels[b, prefix_len : len(tokens)] = torch.from_numpy(tokens[prefix_len:])
    with torch.no_grad():
      logits = torch_model(input_ids=ids.to(torch_model.device), attention_mask=mask.to(torch_model.device)).logits
      # the vocabulary last: over a [B, vocab, T] transpose, torch's CPU log-softmax adds the 49,152 exp terms one
      # after another in fp32, rounding most of them away, and read every token 1.5-2.4e-4 nats low on the real
      # StoryCloze stories (max 2.0e-4 per candidate against s2sjax; 3e-5 this way, s2sjax 1e-5 from float64)
      losses = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                                 labels[:, 1:].reshape(-1).to(torch_model.device), reduction="none",
                                                 ignore_index=-100).view(len(batch), -1).cpu()
    for b, (i, c, tokens, prefix_len) in enumerate(batch):
      out[i, c] = float(losses[b, prefix_len - 1 : len(tokens) - 1].mean())
    computed += len(batch) * width
    # executed FLOPs: every padded position, attention over the whole width, full logits everywhere
    flops += planner.forward_flops(config, len(batch) * width, width, len(batch) * width)
  return out, computed, flops


def s2sjax_protocol(config: ModelConfig, params, items: list[Item], shape: RowShape, share: bool, batch_size: int,
                    dtype, attention: str = "auto", local: bool = False) -> dict:
  rows, report = pack(items, shape, share_prefix=share)
  rows, shape = fit(rows, shape, report.longest_item)  # as the builder records them
  if attention == "auto":  # what `s2sjax.eval --attention=auto` runs on rows laid this way
    attention = auto_implementation(share, local, dtype)
  scorer = Scorer(config, shape, batch_size=batch_size, dtype=dtype, attention=attention, local_attention=local)
  start = time.time()
  scorer.score(params, {k: v[: scorer.batch_size] for k, v in rows.items()}, progress=False)  # compile + warm up
  compile_s = time.time() - start
  start = time.time()
  nll_sum, n_tokens = scorer.score(params, rows, progress=False)
  seconds = time.time() - start
  scores = collect(rows, nll_sum, n_tokens, [len(it.candidates) for it in items])
  computed = math.ceil(report.rows / scorer.batch_size) * scorer.batch_size * shape.length
  targets = int(n_tokens.sum())
  # executed: every row position, attending over the row or its item window
  flops = planner.forward_flops(config, computed, scorer.window.span if scorer.window else shape.length, targets)
  return dict(mean_nll=scores.mean_nll, computed=computed, seconds=seconds, compile_s=compile_s, flops=flops,
              efficiency=report.efficiency, rows=report.rows, row_length=shape.length, attention=attention)


def run_workload(workload: str, ckpt: str, count: int, row_lengths: Sequence[int | None], batch_size: int,
                 ref_batch_size: int, dtype, attention: str = "auto", protocols=tuple(PROTOCOLS),
                 storycloze_csv: str | None = None) -> dict:
  """The reference and every s2sjax protocol at every row length (None: the items' auto length) on one item set;
  results keyed by protocol, and by length too when there are several ("s2sjax, shared @ 1024")."""
  config = checkpoint.load_config(ckpt)
  params = checkpoint.load_params(ckpt, dtype=dtype)
  if workload == STORYCLOZE:
    if not storycloze_csv:
      raise BenchError("--workload=storycloze needs --storycloze_csv (StoryCloze Spring 2016 test CSV)")
    items = storycloze_items(storycloze_csv, count, ckpt)
  else:
    items = make_items(workload, count, config.vocab_size)
  torch_model = reference_model(checkpoint.load_manifest(ckpt)["source"], dtype)
  # one batch first, untimed (CUDA's context and kernel choices on a GPU), as s2sjax's compile is kept out of its time
  reference_protocol(torch_model, config, items[:ref_batch_size], ref_batch_size)
  start = time.time()
  ref_nll, ref_computed, ref_flops = reference_protocol(torch_model, config, items, ref_batch_size)
  ref_seconds = time.time() - start
  results = {"reference": dict(mean_nll=ref_nll, computed=ref_computed, seconds=ref_seconds, flops=ref_flops)}
  for row_length in row_lengths:
    for protocol in protocols:
      name, share, local = PROTOCOLS[protocol]
      key = name if len(row_lengths) == 1 else f"{name} @ {row_length or 'auto'}"
      results[key] = s2sjax_protocol(config, params, items, row_shape(items, row_length, share), share, batch_size,
                                     dtype, attention, local)
      results[key]["max_nll_diff"] = float(np.nanmax(np.abs(results[key]["mean_nll"] - ref_nll)))
  return {"workload": workload, "items": len(items), "candidates": sum(len(it.candidates) for it in items),
          "real_tokens": sum(len(it.prefix) * len(it.candidates) + sum(map(len, it.candidates)) for it in items),
          "results": results}


def cmmlu_tasks(cmmlu_dir: str, subjects: Sequence[str], folder: str) -> list[str]:
  """lm-eval's own CMMLU task of each subject (its `_default_template_yaml` and the subject's description), read
  from a local copy of the CMMLU data (`dev/` and `test/` CSVs) instead of the hub: YAMLs written to `folder`,
  their task names returned."""
  import lm_eval
  import yaml

  own = os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "cmmlu")
  names = []
  for subject in subjects:
    subject_yaml = os.path.join(own, f"cmmlu_{subject}.yaml")
    if not os.path.exists(subject_yaml):
      raise BenchError(f"lm-eval has no CMMLU subject {subject!r} ({subject_yaml})")
    with open(subject_yaml, encoding="utf-8") as f:
      description = yaml.safe_load(f)["description"]
    files = {split: os.path.join(cmmlu_dir, split, f"{subject}.csv") for split in ("dev", "test")}
    missing = [path for path in files.values() if not os.path.exists(path)]
    if missing:
      raise BenchError(f"--cmmlu_dir={cmmlu_dir} has no {missing[0]} (the CMMLU repo's data/ folder)")
    name = f"cmmlu_local_{subject}"
    config = {"include": os.path.join(own, "_default_template_yaml"), "task": name, "description": description,
              "dataset_path": "csv", "dataset_kwargs": {"data_files": files}}
    with open(os.path.join(folder, f"{name}.yaml"), "w", encoding="utf-8") as f:
      yaml.safe_dump(config, f, allow_unicode=True)
    names.append(name)
  return names


# The hub's names of the StoryCloze release's columns (InputStoryid, InputSentence1..4, RandomFifthSentenceQuiz1/2,
# AnswerRightEnding; XStoryCloze's TSVs keep them), which lm-eval's storycloze and xstorycloze templates read
STORYCLOZE_COLUMNS = ["story_id", "input_sentence_1", "input_sentence_2", "input_sentence_3", "input_sentence_4",
                      "sentence_quiz1", "sentence_quiz2", "answer_right_ending"]
# lm-eval's workloads the bench runs: its own task (lm_eval/tasks/...), the local files of each split and how to read
# them ({dir}: the workload's --*_dir; cmmlu: `cmmlu_tasks`, a task per subject)
LM_EVAL_WORKLOADS = {
  "cmmlu": None,
  "xcopa_zh": ("xcopa/default_zh.yaml", "json", {"validation": "data/zh/val.zh.jsonl",
                                                 "test": "data/zh/test.zh.jsonl"}, {}),
  **{f"xstorycloze_{lang}": (f"xstorycloze/default_{lang}.yaml", "csv",
                             {split: f"spring2016.val.{lang}.tsv.split_20_80_{split}.tsv" for split in ("train", "eval")},
                             {"delimiter": "\t", "quoting": 3, "header": 0, "column_names": STORYCLOZE_COLUMNS})
     for lang in ("en", "zh")},
  "storycloze": ("storycloze/storycloze_2016.yaml", "csv",
                 {"validation": "cloze_test_val__spring2016 - cloze_test_ALL_val.csv",
                  "test": "cloze_test_test__spring2016 - cloze_test_ALL_test.csv"},
                 {"header": 0, "column_names": STORYCLOZE_COLUMNS}),
}
# --workloads' default: every one, CMMLU 0- and 3-shot (NAME:SHOTS; no suffix: 0)
DEFAULT_LM_EVAL_WORKLOADS = ["cmmlu:0", "cmmlu:3", "xcopa_zh", "xstorycloze_en", "xstorycloze_zh", "storycloze"]


def lm_eval_tasks(workload: str, data_dir: str, subjects: Sequence[str], folder: str) -> list[str]:
  """lm-eval's own task(s) of a workload (LM_EVAL_WORKLOADS) read from local files instead of the hub: a YAML
  written to `folder` that includes lm-eval's own (its template, choices, splits, metrics) and names the files;
  the task names returned."""
  import lm_eval
  import yaml

  if workload not in LM_EVAL_WORKLOADS:
    raise BenchError(f"no lm-eval workload {workload!r}: the bench runs {', '.join(LM_EVAL_WORKLOADS)}")
  if workload == "cmmlu":
    return cmmlu_tasks(data_dir, subjects, folder)
  own, reader, files, options = LM_EVAL_WORKLOADS[workload]
  files = {split: os.path.join(data_dir, name) for split, name in files.items()}
  missing = [path for path in files.values() if not os.path.exists(path)]
  if missing:
    raise BenchError(f"{workload}: {data_dir} has no {os.path.relpath(missing[0], data_dir)} (the release's files)")
  name = f"{workload}_local"
  config = {"include": os.path.join(os.path.dirname(lm_eval.__file__), "tasks", own), "task": name,
            "dataset_path": reader, "dataset_name": None, "dataset_kwargs": {"data_files": files, **options}}
  with open(os.path.join(folder, f"{name}.yaml"), "w", encoding="utf-8") as f:
    yaml.safe_dump(config, f, allow_unicode=True)
  return [name]


def lm_eval_requests(task_names: Sequence[str], folder: str, limit: int, num_fewshot: int, seed: int = 1234):
  """The tasks' loglikelihood requests (lm-eval `Instance`s) for their first `limit` documents, with
  `num_fewshot` shots chosen under lm-eval's default few-shot seed, as `simple_evaluate` builds them."""
  from lm_eval.tasks import TaskManager

  requests = []
  for task in TaskManager(include_path=folder, include_defaults=False).load(list(task_names))["tasks"].values():
    task.set_config(key="num_fewshot", value=num_fewshot)
    task.set_fewshot_seed(seed=seed)
    task.build_all_requests(limit=limit, rank=0, world_size=1)
    requests += task.instances
  return requests


def encoded_pairs(lm, requests) -> list[tuple[list[int], list[int]]]:
  """The (context, continuation) tokens lm-eval's `TemplateLM.loglikelihood` makes of the requests for the s2sjax
  backend `lm`, truncated as it scores them (`S2SJaxLM._windows`): one pair a request, as the float64 reference
  forwards each request once; a request whose continuation needs several windows at the row length is refused."""
  from lm_eval.api.model import TemplateLM

  captured = []
  lm._loglikelihood_tokens = lambda encoded, **kwargs: captured.extend(encoded) or [(0.0, False)] * len(encoded)
  try:
    TemplateLM.loglikelihood(lm, requests, disable_tqdm=True)
  finally:
    del lm._loglikelihood_tokens  # the class's method again
  pairs = []
  for index, ((context_text, _), context, continuation) in enumerate(captured):
    windows, _ = lm._windows(context, continuation, index)
    if len(windows) > 1:
      raise BenchError(f"request {index} (context {context_text[:40]!r}...): its continuation of {len(continuation)} "
                       f"tokens needs {len(windows)} windows at row_length={lm.row_length}; the bench compares one "
                       "window a request: give a longer --row_length")
    pairs += windows
  return pairs


def float64_loglikelihoods(model64, pairs) -> np.ndarray:
  """Each continuation's log-likelihood from a float64 transformers forward (float64 log-softmax too); pairs with
  the same inputs (one-token continuations of one context) share one forward."""
  import torch

  forwards: dict[tuple[int, ...], np.ndarray] = {}
  out = np.zeros(len(pairs))
  for i, (context, continuation) in enumerate(pairs):
    tokens = context + continuation
    inputs = tuple(tokens[:-1])
    if inputs not in forwards:
      with torch.no_grad():
        logits = model64(torch.tensor([inputs])).logits[0].double()
      forwards = {inputs: torch.log_softmax(logits, -1).numpy()}  # one context's rows at a time
    n = len(continuation)
    out[i] = forwards[inputs][np.arange(len(inputs) - n, len(inputs)), continuation].sum()
  return out


def trie_tokens(contexts: Sequence[Sequence[int]]) -> int:
  """Tokens the distinct contexts hold once each common leading run is laid once (a prefix tree's nodes): what
  sharing prefixes across contexts (CMMLU's subject description and shots) would leave to compute."""
  root: dict = {}
  nodes = 0
  for context in contexts:
    node = root
    for token in context:
      if token not in node:
        node[token] = {}
        nodes += 1
      node = node[token]
  return nodes


def run_lm_eval(ckpt: str, workload: str, data_dir: str, subjects: Sequence[str], limit: int, num_fewshot: int,
                row_length: int, batch_size: int | str, ref_batch_size: int, float64_requests: int) -> dict:
  """lm-eval's requests of a workload (LM_EVAL_WORKLOADS; cmmlu: the subjects' tasks) for the first `limit`
  documents of each task through its `hf` backend and the `s2sjax` one on the same weights: wall times (s2sjax's
  second call, after the first compiled its steps, and where its time went), distances to float64, agreement."""
  import copy
  import tempfile

  from lm_eval.models.huggingface import HFLM

  from s2sjax.commands.lm_eval import S2SJaxLM  # lm-eval is the `lmeval` extra, as HFLM above

  ours = S2SJaxLM(pretrained=ckpt, row_length=row_length, batch_size=batch_size)
  with tempfile.TemporaryDirectory() as folder:
    tasks = lm_eval_tasks(workload, data_dir, subjects, folder)
    requests = lm_eval_requests(tasks, folder, limit, num_fewshot)
  pairs = encoded_pairs(ours, requests)
  start = time.perf_counter()
  ours.loglikelihood(requests, disable_tqdm=True)  # compiles the steps for these rows (or loads them from the cache)
  first_s, first_call = time.perf_counter() - start, ours.last_call
  start = time.perf_counter()
  got = ours.loglikelihood(requests, disable_tqdm=True)
  seconds = time.perf_counter() - start
  packs = ours.last_call["packs"]  # one per group of like item windows
  each = lambda key: [pack[key] for pack in packs]
  real, capacity = sum(p["pack"]["real_tokens"] for p in packs), sum(p["pack"]["capacity"] for p in packs)
  s2sjax_side = dict(seconds=seconds, first_call_s=first_s, first_call_compile_s=first_call["seconds"]["compile"],
                     rows=[p["pack"]["rows"] for p in packs], length=[s.length for s in each("shape")],
                     rows_per_step=each("rows_per_step"), steps=each("steps"), efficiency=real / capacity,
                     shared_roots=sum(p["pack"]["shared_roots"] for p in packs),
                     targets=[s.max_targets for s in each("shape")],
                     window=[[w.span for w in p["windows"]] for p in packs],
                     where=dict(ours.last_call["seconds"]))
  config = checkpoint.load_config(ckpt)
  # executed: every row position through the layers, attending over its item window, the head at the target table
  # (padding rows included: a step runs them whole)
  run = [(steps * p["rows_per_step"] * p["shape"].length, window.span,
          steps * p["rows_per_step"] * p["shape"].max_targets) for p in packs
         for window, steps in zip(p["windows"], p["steps"])]
  s2sjax_side.update(positions=sum(positions for positions, _, _ in run),
                     gflop=sum(planner.forward_flops(config, *group) for group in run) / 1e9)
  torch_model = reference_model(checkpoint.load_manifest(ckpt)["source"], jnp.float32)
  hf = HFLM(pretrained=torch_model, tokenizer=ours.tokenizer, batch_size=ref_batch_size, max_length=row_length - 1)
  hf.loglikelihood(requests[:ref_batch_size], disable_tqdm=True)  # warm-up, untimed
  hf_batches = []  # (batch, padded length) of each forward the timed call makes: it computes logits at every one
  counting = torch_model.register_forward_pre_hook(lambda module, args: hf_batches.append(tuple(args[0].shape)))
  start = time.perf_counter()
  want = hf.loglikelihood(requests, disable_tqdm=True)
  hf_seconds = time.perf_counter() - start
  counting.remove()  # before the float64 copy below, which would carry the hook
  hf_positions = sum(b * t for b, t in hf_batches)
  hf_gflop = sum(planner.forward_flops(config, b * t, t, b * t) for b, t in hf_batches) / 1e9
  ll, ll_hf = np.array([g[0] for g in got]), np.array([w[0] for w in want])
  exact = float64_loglikelihoods(copy.deepcopy(torch_model).double().cpu(), pairs[:float64_requests])
  n64 = len(exact)
  documents = [(r.task_name, r.doc_id) for r in requests]
  decisions = lambda values: [int(np.argmax([v for v, d in zip(values, documents) if d == doc]))
                              for doc in dict.fromkeys(documents)]
  error = lambda values: dict(max_abs_err_float64=float(np.abs(values[:n64] - exact).max()),
                              mean_abs_err_float64=float(np.abs(values[:n64] - exact).mean()))
  contexts = list(dict.fromkeys(tuple(c) for c, _ in pairs))
  return {
    "workload": workload, "tasks": tasks, "documents": len(set(documents)), "requests": len(requests),
    "num_fewshot": num_fewshot,
    "context_tokens": dict(mean=float(np.mean([len(c) for c, _ in pairs])), max=max(len(c) for c, _ in pairs),
                           distinct=sum(map(len, contexts)), prefix_tree=trie_tokens(contexts)),
    "hf": dict(seconds=hf_seconds, batch_size=ref_batch_size, window=torch_model.config._attn_implementation,
               forwards=len(hf_batches), positions=hf_positions, gflop=hf_gflop, **error(ll_hf)),
    "s2sjax": dict(s2sjax_side, **error(ll)),
    "hf_over_s2sjax": hf_seconds / seconds,
    "hf_over_s2sjax_flops": hf_gflop / s2sjax_side["gflop"],
    "float64_requests": n64, "max_abs_diff_s2sjax_hf": float(np.abs(ll - ll_hf).max()),
    "decisions_identical": decisions(ll) == decisions(ll_hf),
    "is_greedy_identical": [g[1] for g in got] == [w[1] for w in want],
  }


# s2sjax's phases as the table names them (S2SJaxLM.last_call's seconds)
PHASES = {"tokenise": "tokenise", "pack": "pack", "host": "host batches", "to_device": "to device",
          "compile": "compile", "step": "steps", "from_device": "from device", "collect": "collect"}


def format_lm_eval(runs: Sequence[dict]) -> str:
  """One line a workload: both backends' wall time, the speed-up, the positions and FLOPs each executed (hf: the
  padded batches its forwards took, logits at every position; s2sjax: its steps' rows), s2sjax's phases, distances
  to float64."""
  lines = [
    "| workload | docs | requests | ctx tokens (mean) | hf s | s2sjax s | hf / s2sjax | positions hf / s2sjax "
    "| GFLOP hf / s2sjax (ratio) | GFLOP/s hf / s2sjax | s2sjax rows x L: steps x keys a window "
    "| s2sjax: " + ", ".join(PHASES.values()) + " (s) | s2sjax first call s (compile) | max / mean abs err vs "
    "float64, hf | s2sjax | decisions identical |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for run in runs:
    ours, hf = run["s2sjax"], run["hf"]
    where = " / ".join(f"{ours['where'].get(key, 0.0):.1f}" for key in PHASES)
    # a group of like item windows each (S2SJaxLM.score_pairs), its steps by window (steps_by_window)
    rows = " + ".join(f"{n} x {length}: " + ", ".join(f"{s} x {k}" for s, k in zip(steps, keys))
                      for n, length, steps, keys in zip(ours["rows"], ours["length"], ours["steps"], ours["window"]))
    lines.append(
      f"| {run['workload']} {run['num_fewshot']}-shot | {run['documents']} | {run['requests']} "
      f"| {run['context_tokens']['mean']:.0f} | {hf['seconds']:.1f} | {ours['seconds']:.1f} "
      f"| {run['hf_over_s2sjax']:.2f}x | {hf['positions']:,} / {ours['positions']:,} "
      f"| {hf['gflop']:,.0f} / {ours['gflop']:,.0f} ({run['hf_over_s2sjax_flops']:.2f}x) "
      f"| {hf['gflop'] / hf['seconds']:.0f} / {ours['gflop'] / ours['seconds']:.0f} "
      f"| {rows} | {where} "
      f"| {ours['first_call_s']:.1f} ({ours['first_call_compile_s']:.1f}) "
      f"| {hf['max_abs_err_float64']:.1e} / {hf['mean_abs_err_float64']:.1e} "
      f"| {ours['max_abs_err_float64']:.1e} / {ours['mean_abs_err_float64']:.1e} "
      f"| {run['decisions_identical']} (is_greedy {run['is_greedy_identical']}) |")
  return "\n".join(lines)


def format_table(run: dict) -> str:
  reference = run["results"]["reference"]
  lines = [
    f"### {run['workload']}: {run['items']} items, {run['candidates']} candidates",
    "",
    "| protocol | L | attention | tokens computed | vs reference | wall s | vs reference | tokens/s | packing eff. "
    "| GFLOP/s | max abs diff of mean NLL vs ref |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for name, r in run["results"].items():
    diff = r.get("max_nll_diff", 0.0)
    eff = f"{r['efficiency']:.1%}" if "efficiency" in r else "-"
    lines.append(
      f"| {name} | {r.get('row_length', '-')} | {r.get('attention', '-')} | {r['computed']:,} | "
      f"{r['computed'] / reference['computed']:.2f}x | "
      f"{r['seconds']:.1f} | {r['seconds'] / reference['seconds']:.2f}x | {r['computed'] / r['seconds']:,.0f} | {eff} | "
      f"{r['flops'] / r['seconds'] / 1e9:.1f} | {diff:.1e} |"
    )
  return "\n".join(lines)


def define_flags() -> None:
  flags.DEFINE_enum("mode", "reference", ["reference", "accelerator", "lm_eval"],
                    "reference: PyTorch protocol vs s2sjax; accelerator: Qwen2.5-shaped throughput and MFU; lm_eval: "
                    "lm-eval's CMMLU tasks through its hf backend and s2sjax's.")
  flags.DEFINE_list("workloads", DEFAULT_LM_EVAL_WORKLOADS,
                    f"lm_eval mode: NAME[:SHOTS] of {', '.join(LM_EVAL_WORKLOADS)}, one run each.")
  flags.DEFINE_string("cmmlu_dir", None, "lm_eval mode: the CMMLU repo's data/ folder (dev/ and test/ CSVs).")
  flags.DEFINE_string("xcopa_dir", None, "lm_eval mode: the XCOPA repo's folder (data/zh/*.zh.jsonl).")
  flags.DEFINE_string("xstorycloze_dir", None, "lm_eval mode: the XStoryCloze release's folder (its TSVs).")
  flags.DEFINE_string("storycloze_dir", None, "lm_eval mode: the StoryCloze 2016 folder (its val and test CSVs).")
  flags.DEFINE_list("subjects", ["agronomy", "anatomy", "ancient_chinese"], "lm_eval mode: CMMLU subjects.")
  flags.DEFINE_integer("float64_requests", 40, "lm_eval mode: requests also scored by a float64 transformers forward.")
  flags.DEFINE_list("sizes", ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"], "accelerator mode: model shapes.")
  flags.DEFINE_list("attention", ["auto"],
                    "Attention implementation(s), or auto: what s2sjax.eval's auto runs on each protocol's rows "
                    "(model/attention.auto_implementation). Reference mode uses the first; accelerator mode measures "
                    "each.")
  flags.DEFINE_integer("rows", 8, "accelerator mode: rows per step.")
  flags.DEFINE_string("mesh", "data:-1", "accelerator mode: mesh axes, e.g. data:-1,model:2 for a 7B on v5e.")
  flags.DEFINE_bool("compile_only", False,
                    "accelerator mode: print XLA's per-device memory analysis of each configuration, run nothing.")
  flags.DEFINE_float("peak_tflops", None, "accelerator mode: peak bf16 TFLOP/s per device (default: by device kind).")
  flags.DEFINE_string("checkpoint", None, "s2sjax checkpoint (default: the embedded SmolLM2-135M).")
  flags.DEFINE_list("workload", ["stories", "speech"], f"Any of {sorted(WORKLOADS) + [STORYCLOZE]}.")
  flags.DEFINE_integer("items", 48, "Items per workload (storycloze: the first this many stories).")
  flags.DEFINE_string("storycloze_csv", None, "StoryCloze Spring 2016 test CSV, for --workload=storycloze.")
  flags.DEFINE_list("protocols", list(PROTOCOLS),
                    f"s2sjax protocols (next to the reference; in accelerator mode, the rows laid): any of {list(PROTOCOLS)}.")
  flags.DEFINE_list("row_length", ["auto"], "Packed row length(s) L, each run against the one reference, or auto: the "
                    "length a build without --row_length chooses for the items (accelerator mode: one L, default 2048).")
  flags.DEFINE_integer("batch_size", 2, "Rows per s2sjax step.")
  flags.DEFINE_string("lm_eval_batch_size", "auto", "lm_eval mode: the s2sjax backend's batch_size (rows, or auto).")
  flags.DEFINE_integer("ref_batch_size", 8, "Sequences per reference batch.")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype of s2sjax.")
  flags.DEFINE_string("output", None, "Also write the figures as JSON here.")


def lm_eval_workloads() -> list[tuple[str, int, str]]:
  """--workloads as (workload, shots, its data folder), every name, shot count and folder checked before a run."""
  chosen = []
  for value in FLAGS.workloads:
    name, _, shots = value.partition(":")
    if name not in LM_EVAL_WORKLOADS or (shots and not shots.isdigit()):
      raise BenchError(f"--workloads={value}: NAME[:SHOTS], NAME one of {', '.join(LM_EVAL_WORKLOADS)}")
    flag = f"{name.split('_')[0]}_dir"
    if not FLAGS[flag].value:
      raise BenchError(f"--workloads={value} needs --{flag}")
    chosen.append((name, int(shots or 0), FLAGS[flag].value))
  return chosen


def run_lm_eval_workloads(ckpt: str) -> list[dict]:
  """--mode=lm_eval: each workload in turn, its line printed and --output rewritten as it ends."""
  chosen = lm_eval_workloads()
  machine = cpu_machine(FLAGS.dtype) if jax.default_backend() == "cpu" else {}
  runs = []
  for name, shots, data_dir in chosen:
    runs.append(run_lm_eval(ckpt, name, data_dir, FLAGS.subjects, FLAGS.items, shots, row_lengths()[0] or 1024,
                            FLAGS.lm_eval_batch_size, FLAGS.ref_batch_size, FLAGS.float64_requests))
    print(format_lm_eval(runs[-1:]).splitlines()[-1] if len(runs) > 1 else format_lm_eval(runs), flush=True)
    if FLAGS.output:
      with open(FLAGS.output, "w") as f:
        json.dump({"runs": runs, "machine": machine}, f, indent=2)
  if machine:
    print(machine_line(machine))
  return runs


def row_lengths() -> list[int | None]:
  """--row_length's values: None for auto, else a positive length."""
  def parse(value: str) -> int | None:
    if value == "auto":
      return None
    if not value.isdigit() or int(value) < 1:
      raise BenchError(f"--row_length takes positive lengths or auto, not {value!r}")
    return int(value)
  return [parse(v) for v in FLAGS.row_length] or [None]


def main(argv):
  del argv
  if FLAGS.mode == "accelerator":
    bench_accelerator.run(FLAGS.sizes, FLAGS.attention, row_lengths()[0] or 2048, FLAGS.rows, jnp.dtype(FLAGS.dtype),
                          FLAGS.mesh, FLAGS.peak_tflops, FLAGS.compile_only, FLAGS.output, FLAGS.protocols)
    return
  ckpt = FLAGS.checkpoint or default_checkpoint()
  if FLAGS.mode == "lm_eval":
    run_lm_eval_workloads(ckpt)
    return
  runs = []
  for workload in FLAGS.workload:
    run = run_workload(workload, ckpt, FLAGS.items, row_lengths(), FLAGS.batch_size, FLAGS.ref_batch_size,
                       jnp.dtype(FLAGS.dtype), FLAGS.attention[0], FLAGS.protocols, FLAGS.storycloze_csv)
    print(format_table(run), "\n", flush=True)
    runs.append(run)
  named = FLAGS.checkpoint or "the embedded SmolLM2-135M (default)"  # not the cache path: logs get published
  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, checkpoint: {named}")
  machine = {}
  if jax.default_backend() == "cpu":
    machine = cpu_machine(FLAGS.dtype)
    print(machine_line(machine))
  if FLAGS.output:
    strip = lambda r: {k: v for k, v in r.items() if k != "mean_nll"}
    with open(FLAGS.output, "w") as f:
      json.dump([dict(run, results={n: strip(r) for n, r in run["results"].items()}, machine=machine) for run in runs],
                f, indent=2)


def command_line() -> None:
  """`python -m s2sjax.bench`."""
  define_flags()
  cli.run(main, __doc__, flag_modules=(__name__,))


if __name__ == "__main__":
  command_line()
