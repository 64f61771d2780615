"""The `s2sjax` lm-eval backend against lm-eval's own `hf` backend on the same SmolLM2-135M weights (the embedded
default's GGUF, loaded by transformers): per-request log-likelihoods, greedy flags, rolling windows, few-shot and
chat-templated requests, requests longer than a row, the same bits whatever shares a request's row, a local
StoryCloze 2016 task through lm-eval's own command line and `simple_evaluate`, the README's command as printed, and
the backend's refusals and Ctrl-C through lm-eval's command line, each one line."""

import json
import logging
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # tasks run from local files only
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import lm_eval  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from s2sjax.commands.default_checkpoint import default_checkpoint  # noqa: E402
from s2sjax.commands.lm_eval import S2SJaxLM  # noqa: E402
from tests.interrupting import interrupt_mid_step  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
REALDATA = ROOT.parent / "shared" / "realdata" / "storycloze"
STORYCLOZE = REALDATA / "cloze_test_test__spring2016 - cloze_test_ALL_test.csv"
STORYCLOZE_VAL = REALDATA / "cloze_test_val__spring2016 - cloze_test_ALL_val.csv"  # the few-shot examples
SAMPLE_STORIES = ROOT / "tasks" / "sample" / "source" / "en_stories.json"  # the README's lm-eval task reads it
ROW_LENGTH = 256
TOLERANCE = 1e-4  # per request (a continuation's summed log-likelihood), fp32
TASK_YAML = """task: storycloze_2016_local
dataset_path: csv
dataset_kwargs:
  data_files:
    test: {path}
    validation: {val_path}
output_type: multiple_choice
test_split: test
fewshot_split: validation
doc_to_text: "{{{{[InputSentence1, InputSentence2, InputSentence3, InputSentence4]|join(' ')}}}}"
doc_to_target: "{{{{AnswerRightEnding - 1}}}}"
doc_to_choice: "{{{{[RandomFifthSentenceQuiz1, RandomFifthSentenceQuiz2]}}}}"
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
  - {{metric: acc_norm, aggregation: mean, higher_is_better: true}}
metadata:
  version: 1.0
"""


def storycloze_task(folder: pathlib.Path) -> str:
  """Writes the local task YAML (StoryCloze 2016 test, read from the shared real data) and returns its name."""
  if not (STORYCLOZE.exists() and STORYCLOZE_VAL.exists()):
    pytest.skip(f"the StoryCloze 2016 test and validation CSVs are not in {REALDATA}")
  (folder / "storycloze_2016_local.yaml").write_text(
    TASK_YAML.format(path=json.dumps(str(STORYCLOZE)), val_path=json.dumps(str(STORYCLOZE_VAL))))
  return "storycloze_2016_local"


def local_tasks(folder: pathlib.Path) -> TaskManager:
  """lm-eval's task manager over the tasks in `folder` only: indexing the ~14,000 YAML files of lm-eval's own tasks
  takes ~17 s a manager on this machine, and these tests read none of them. (lm-eval's command line indexes them.)"""
  return TaskManager(include_path=str(folder), include_defaults=False)


@pytest.fixture(scope="module")
def hf(smollm2_transformers):
  """lm-eval's own backend on transformers' load of the same GGUF, with the same max_length as ours. Its fp32
  log_softmax over 49,152 logits runs ~2e-5 a token above the float64 value (3e-4 on a 15-token StoryCloze
  ending); softmax_dtype=float64 (its own option) gives the reference its float64 normaliser."""
  model, tokenizer = smollm2_transformers
  return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=8, max_length=ROW_LENGTH - 1, softmax_dtype="float64")


@pytest.fixture(scope="module")
def ours():
  # One of the 8 host devices: the 8 share this machine's memory, and data-parallel over them would hold 8 copies
  # of the 135M fp32 parameters (4.3 GB) for the module's whole life.
  return S2SJaxLM(checkpoint=default_checkpoint(), batch_size=8, row_length=ROW_LENGTH, device="cpu:0")


def requests(kind: str, args: list[tuple]) -> list[Instance]:
  return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def test_requests_come_back_in_order_with_each_context_computed_once(ours, hf):
  # Three contexts in shuffled order; the trailing space of the second moves into the continuation, which makes
  # its context the first one's; the empty context is the prefix token.
  args = [("The cat sat on the", " mat."), ("Paris is the capital of", " France."), ("The cat sat on the ", "sofa"),
          ("", "Once upon a time"), ("Paris is the capital of", " Germany, said nobody."),
          ("The cat sat on the", " dog")]
  contexts, rows = ours.contexts_scored, ours.rows_scored
  got = ours.loglikelihood(requests("loglikelihood", args))
  # 3 contexts, each at a multiple of 32: 128 positions (the fewest that hold them), not a row of 256
  assert ours.contexts_scored - contexts == 3
  assert (ours.rows_scored - rows) * ours.last_call["packs"][0]["shape"].length == 128
  want = hf.loglikelihood(requests("loglikelihood", args))
  np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], atol=TOLERANCE, rtol=0)
  assert [g[1] for g in got] == [w[1] for w in want]


def test_a_small_call_runs_shorter_rows_and_scores_the_same_bits(ours):
  # Two short requests need not compute a row of 256: the call lays them in the fewest positions (one row of 64,
  # the shortest step: SMALLEST_STEP). Amid 24 more requests, in other rows and steps, they score the same bits.
  few = [("The cat sat on the", " mat."), ("Paris is the capital of", " France.")]
  alone = ours.loglikelihood(requests("loglikelihood", few))
  short = ours.last_call["packs"][0]["shape"].length
  more = [(f"Story {i}: the weather on day {i} of the long voyage across the sea was", f" calm, {i}.")
          for i in range(24)]
  amid = ours.loglikelihood(requests("loglikelihood", more[:12] + few + more[12:]))
  assert short == 64 and ours.last_call["packs"][0]["rows_per_step"] > 1
  assert alone == amid[12:14]


def test_is_greedy_matches_the_hf_backend(ours, hf):
  context = hf.tok_encode("The capital of France is")
  generated = hf.model.generate(torch.tensor([context]), max_new_tokens=4, do_sample=False)[0, len(context):]
  greedy = generated.tolist()
  other = greedy[:-1] + [greedy[-1] + 1]  # the last token not the argmax
  pairs = [(("", ""), context, greedy), (("", ""), context, other), (("", ""), context, greedy[:2])]
  got, want = ours._loglikelihood_tokens(pairs), hf._loglikelihood_tokens(pairs)
  assert [g[1] for g in got] == [w[1] for w in want] == [True, False, True]
  np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], atol=TOLERANCE, rtol=0)


def test_rolling_windows_match_the_hf_backend(ours, hf):
  # Texts of several windows (max_length = 255 tokens) and shorter than one.
  if not STORYCLOZE.exists():
    pytest.skip(f"the StoryCloze 2016 test CSV is not at {STORYCLOZE}")
  lines = STORYCLOZE.read_text(encoding="utf-8").splitlines()[1:17]
  texts = [" ".join(lines[:10]), " ".join(lines[10:15]), lines[15]]
  tokens = np.array([len(ours.tok_encode(t)) for t in texts])
  assert tokens[0] > 3 * ours.max_length and tokens[2] < ours.max_length
  args = [(t,) for t in texts]
  got = ours.loglikelihood_rolling(requests("loglikelihood_rolling", args))
  want = hf.loglikelihood_rolling(requests("loglikelihood_rolling", args))
  # a sum of ~1,000 fp32 log-probs carries the rounding of its own magnitude (~1e-4 at 3,600 nats)
  np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=1e-6)


def per_request(samples: list[dict]) -> tuple[np.ndarray, list[str]]:
  """(log-likelihood, is_greedy) of every request, by document and choice."""
  resps = [r[0] for s in sorted(samples, key=lambda s: s["doc_id"]) for r in s["resps"]]
  return np.array([float(r[0]) for r in resps]), [str(r[1]) for r in resps]


def test_storycloze_through_lm_evals_own_command_line_matches_the_hf_backend(tmp_path, hf):
  # lm-eval's CLI as its users drive it (subcommand, flags, --output_path's layout), with s2sjax registered
  task = storycloze_task(tmp_path)
  out = tmp_path / "out"
  args = f"pretrained={default_checkpoint()},mesh=data:-1,dtype=float32,row_length=512"
  run = subprocess.run(
    [sys.executable, "-m", "s2sjax.lm_eval", "run", "--model", "s2sjax", "--model_args", args, "--tasks", task,
     "--include_path", str(tmp_path), "--limit", "12", "--output_path", str(out), "--log_samples", "--seed", "1234",
     "--batch_size", "4", "--device", "cpu"],
    cwd=ROOT, capture_output=True, text=True, timeout=600,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert "acc_norm" in run.stdout  # lm-eval's results table
  (folder,) = out.iterdir()  # lm-eval's folder per model, named from `pretrained`
  assert folder.name == str(default_checkpoint()).replace("/", "__")
  (results_file,) = folder.glob("results_*.json")
  (samples_file,) = folder.glob(f"samples_{task}_*.jsonl")
  ours = json.loads(results_file.read_text())
  assert ours["config"]["model"] == "s2sjax" and ours["config"]["row_length"] == 512
  samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
  assert {"doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "doc_hash", "acc"} <= set(samples[0])
  theirs = lm_eval.simple_evaluate(model=hf, tasks=[task], task_manager=local_tasks(tmp_path),
                                   limit=12, log_samples=True)
  (ll, greedy), (ll_hf, greedy_hf) = per_request(samples), per_request(theirs["samples"][task])
  assert len(ll) == len(ll_hf) == 24
  np.testing.assert_allclose(ll, ll_hf, atol=TOLERANCE, rtol=0)
  assert greedy == greedy_hf
  for metric in ("acc,none", "acc_norm,none"):
    assert ours["results"][task][metric] == theirs["results"][task][metric]


def test_simple_evaluate_builds_the_backend_by_name_with_lm_evals_own_arguments(tmp_path, hf):
  # what simple_evaluate and create_from_arg_string pass: device (one of the 8 host devices), batch_size (auto),
  # max_batch_size
  task = storycloze_task(tmp_path)
  manager = local_tasks(tmp_path)
  results = lm_eval.simple_evaluate(
    model="s2sjax", model_args=f"checkpoint={default_checkpoint()},row_length={ROW_LENGTH}",
    device="cpu:0", batch_size="auto", max_batch_size=4, tasks=[task], task_manager=manager, limit=6,
    log_samples=True)
  theirs = lm_eval.simple_evaluate(model=hf, tasks=[task], task_manager=manager, limit=6, log_samples=True)
  (ll, greedy), (ll_hf, greedy_hf) = per_request(results["samples"][task]), per_request(theirs["samples"][task])
  np.testing.assert_allclose(ll, ll_hf, atol=TOLERANCE, rtol=0)
  assert greedy == greedy_hf
  # 6 stories (12 requests, 6 contexts) fill 2 rows of 256 at 32-aligned starts: auto takes both in one step
  assert results["config"]["batch_sizes"] == [2] and results["config"]["device"] == "cpu:0"


def test_few_shot_and_chat_templated_requests_match_the_hf_backend(tmp_path, ours, hf):
  task = storycloze_task(tmp_path)
  manager = local_tasks(tmp_path)
  for options in (dict(num_fewshot=2), dict(num_fewshot=1, apply_chat_template=True, fewshot_as_multiturn=True)):
    got, want = (lm_eval.simple_evaluate(model=model, tasks=[task], task_manager=manager, limit=5, log_samples=True,
                                         **options)["samples"][task] for model in (ours, hf))
    arguments = lambda samples: [s["arguments"] for s in sorted(samples, key=lambda s: s["doc_id"])]
    assert arguments(got) == arguments(want)  # the same requests: contexts with the same shots, rendered alike
    context = arguments(got)[0][0][0]  # the first story's first request: (context, continuation)
    if options.get("apply_chat_template"):  # SmolLM2-Instruct's template, the shot as a turn of its own
      assert context.count("<|im_start|>user") == 2 and context.endswith("<|im_start|>assistant\n")
    else:
      assert context.count("\n\n") == 2  # two shots before the story
    (ll, greedy), (ll_hf, greedy_hf) = per_request(got), per_request(want)
    np.testing.assert_allclose(ll, ll_hf, atol=TOLERANCE, rtol=0, err_msg=str(options))
    assert greedy == greedy_hf


def test_an_instruct_model_scored_without_its_chat_template_is_warned_about_once(ours, caplog):
  ours._chat_templated = ours._warned_chat = False
  with caplog.at_level(logging.WARNING, logger="lm_eval.s2sjax"):
    ours.loglikelihood(requests("loglikelihood", [("The cat sat on the", " mat.")]))
    ours.loglikelihood(requests("loglikelihood", [("The dog sat on the", " mat.")]))
  warned = [r for r in caplog.records if "appears to be an instruct or chat variant" in r.getMessage()]
  assert len(warned) == 1 and "SmolLM2-135M-Instruct" in warned[0].getMessage()
  caplog.clear()
  ours._warned_chat = False
  chat = ours.apply_chat_template([{"role": "user", "content": "The cat sat on the"}])
  assert chat.endswith("<|im_start|>assistant\n")
  with caplog.at_level(logging.WARNING, logger="lm_eval.s2sjax"):
    ours.loglikelihood(requests("loglikelihood", [(chat, "mat.")]))
  assert not [r for r in caplog.records if "instruct" in r.getMessage()]


def test_a_requests_log_likelihood_is_the_same_bits_whatever_else_the_call_holds(ours):
  # the same stories among other stories, in rows packed otherwise, with a longer item widening the windows
  import csv

  if not STORYCLOZE.exists():
    pytest.skip(f"the StoryCloze 2016 test CSV is not at {STORYCLOZE}")
  with open(STORYCLOZE, encoding="utf-8") as f:
    stories = list(csv.DictReader(f))[:24]
  context = lambda s: ours.tok_encode(" ".join(s[f"InputSentence{k}"] for k in range(1, 5)))
  pair = lambda s: (context(s), ours.tok_encode(" " + s["RandomFifthSentenceQuiz1"], add_special_tokens=False))
  shared = [pair(s) for s in stories[:4]]
  first = ours.score_pairs(shared + [pair(s) for s in stories[4:10]], progress=False)[0]
  widest = lambda: max(window.reach for window in ours.last_call["packs"][0]["windows"])
  reach = widest()
  long_context = sum((context(s) for s in stories[20:24]), [])  # four stories: an item of about 180 tokens
  second = ours.score_pairs([pair(s) for s in stories[10:16]] + [(long_context, shared[0][1])] + shared[::-1],
                            progress=False)[0]
  assert widest() > reach
  np.testing.assert_array_equal(second[-4:][::-1], first[:4])


def test_a_long_context_widens_only_its_own_steps_window_and_every_request_keeps_its_bits(ours, monkeypatch):
  stories = json.loads(SAMPLE_STORIES.read_text())
  pair = lambda text, ending: (ours.tok_encode(text), ours.tok_encode(" " + ending, add_special_tokens=False))
  pairs = [pair(story["first"], story["right"]) for story in stories[:12]]
  pairs.insert(5, pair(" ".join(story["first"] for story in stories[12:16]), stories[16]["right"]))  # ~180 tokens
  monkeypatch.setattr(ours, "batch_size", 1)  # a step a row
  together = ours.score_pairs(pairs, progress=False)
  (group,) = ours.last_call["packs"]
  reaches = [window.reach for window in group["windows"]]
  assert reaches == sorted(set(reaches), reverse=True) and len(reaches) > 1  # the widest steps first, then narrower
  assert group["steps"][0] == 1 and sum(group["steps"]) == group["pack"]["rows"]  # only the long context's row
  alone = [ours.score_pairs([one], progress=False) for one in pairs]
  np.testing.assert_array_equal(together[0], [logprobs[0] for logprobs, _ in alone])
  assert together[1] == [greedy[0] for _, greedy in alone]


def test_questions_after_the_same_prompt_lay_it_once_and_score_the_same_bits_as_alone(ours, hf):
  # CMMLU's shape: a few-shot prompt, then a question, answered by one letter of four
  stories = json.loads(SAMPLE_STORIES.read_text())
  prompt = "".join(f"{story['first']}\nAnswer: {story['right']}\n\n" for story in stories[:3])
  args = [(prompt + story["first"][:60] + "\nAnswer:", f" {letter}") for story in stories[3:9] for letter in "ABCD"]
  together = ours.loglikelihood(requests("loglikelihood", args), disable_tqdm=True)
  (pack,) = [group["pack"] for group in ours.last_call["packs"]]
  assert pack["shared_roots"] >= 1 and pack["rows"] < len(args) // 4  # the prompt laid once a row, not a question
  alone = [result for k in range(0, len(args), 4)
           for result in ours.loglikelihood(requests("loglikelihood", args[k:k + 4]), disable_tqdm=True)]
  assert together == alone  # every log-likelihood the same bits, every is_greedy the same
  theirs = hf.loglikelihood(requests("loglikelihood", args), disable_tqdm=True)
  np.testing.assert_allclose([ll for ll, _ in together], [ll for ll, _ in theirs], atol=TOLERANCE, rtol=0)
  assert [g for _, g in together] == [g for _, g in theirs]


def _sample_text() -> str:
  """The bundled sample's 24 English stories with their right endings, as one text (about 800 tokens)."""
  return " ".join(f"{story['first']} {story['right']}" for story in json.loads(SAMPLE_STORIES.read_text()))


def test_a_context_too_long_for_the_row_loses_its_first_tokens_as_in_the_hf_backend(ours, hf, caplog):
  context, short = ours.tok_encode(_sample_text()), ours.tok_encode("The cat sat on the")
  continuation = ours.tok_encode(" mat and slept.", add_special_tokens=False)
  assert len(context) > 2 * ours.max_length
  pairs = [(("", ""), context, continuation), (("", ""), short, continuation)]
  before = ours.fitted["truncated_context"]
  with caplog.at_level(logging.WARNING, logger="lm_eval.s2sjax"):
    got = ours._loglikelihood_tokens(pairs)
  want = hf._loglikelihood_tokens(pairs)  # hf cuts the context from the left itself (and warns per request)
  np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], atol=TOLERANCE, rtol=0)
  assert [g[1] for g in got] == [w[1] for w in want]
  assert ours.fitted["truncated_context"] - before == 1
  assert ("1 of 2 requests: contexts cut from the left to fit max_length=255 (the model's trained positions, or "
          "row_length - 1 when fewer) with their continuation, as the hf backend cuts them (the first: request 0)"
          ) in caplog.text


def test_a_continuation_longer_than_the_row_is_scored_in_pieces_each_after_the_tokens_before_it(ours, hf, caplog):
  # hf stops the run at such a request (it asserts the continuation fits its window); the reference is hf's own
  # log-likelihood of each piece of max_length tokens after every token before it, which hf cuts from the left
  context = ours.tok_encode("Here are some stories.")
  continuation = ours.tok_encode(" " + _sample_text(), add_special_tokens=False)
  assert len(continuation) > 2 * ours.max_length  # three pieces
  with caplog.at_level(logging.WARNING, logger="lm_eval.s2sjax"):
    (got,) = ours._loglikelihood_tokens([(("", ""), context, continuation)])
  starts = range(0, len(continuation), ours.max_length)
  pieces = hf._loglikelihood_tokens([(("", ""), context + continuation[:start],
                                      continuation[start:start + ours.max_length]) for start in starts])
  # a sum of ~800 fp32 log-probs carries the rounding of its own magnitude
  np.testing.assert_allclose(got[0], sum(p[0] for p in pieces), atol=TOLERANCE, rtol=1e-6)
  assert got[1] == all(p[1] for p in pieces)
  assert "1 of 1 requests: continuations longer than max_length=255 scored in pieces" in caplog.text
  assert "1 of 1 requests: contexts cut from the left" in caplog.text


def test_a_whitespace_only_context_is_scored_as_lm_eval_lays_an_empty_one(ours, hf):
  # lm-eval moves a context's trailing whitespace into the continuation (TemplateLM._encode_pair), leaving no
  # context tokens, at which hf's own scoring stops (it asserts a context); an empty context is the prefix token
  before = ours.fitted["empty_context"]
  got = ours.loglikelihood(requests("loglikelihood", [("  ", "The cat sat."), ("\n", "Paris"), ("Hi", " there")]))
  want = hf.loglikelihood(requests("loglikelihood", [("", "  The cat sat."), ("", "\nParis"), ("Hi", " there")]))
  np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], atol=TOLERANCE, rtol=0)
  assert [g[1] for g in got] == [w[1] for w in want]
  assert ours.fitted["empty_context"] - before == 2


def readme_command() -> tuple[dict[str, str], list[str]]:
  """The README's lm-eval command line as printed: its environment assignments and its words."""
  readme = (ROOT / "README.md").read_text()
  found = re.search(r"^((?:\w+=\S+ )*python -m s2sjax\.lm_eval (?:[^\n]*\\\n)*[^\n]*)$", readme, re.M)
  assert found, "the README shows no lm-eval command"
  words = shlex.split(found.group(1).replace("\\\n", " "))
  assignments = {}
  while "=" in words[0] and not words[0].startswith("-"):
    name, _, value = words.pop(0).partition("=")
    assignments[name] = value
  return assignments, words


def test_the_readmes_command_runs_on_a_cpu_as_printed(tmp_path, hf, monkeypatch):
  assignments, words = readme_command()
  out = tmp_path / "out"
  words[words.index("--output_path") + 1] = str(out)  # the one word changed: where the files go
  env = dict(os.environ, **assignments, HF_DATASETS_CACHE=str(tmp_path / "datasets"))
  run = subprocess.run([sys.executable if w == "python" else w for w in words], cwd=ROOT, capture_output=True,
                       text=True, timeout=900, env=env)
  assert run.returncode == 0, run.stderr[-3000:]
  assert "Traceback" not in run.stderr and "fatal:" not in run.stderr, run.stderr
  task = words[words.index("--tasks") + 1]
  (samples_file,) = out.glob(f"*/samples_{task}_*.jsonl")
  samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
  assert len(samples) == 24  # the bundled sample's stories, each with its two endings
  monkeypatch.chdir(ROOT)  # the task's data_files is read from the working directory, as the README says
  theirs = lm_eval.simple_evaluate(model=hf, tasks=[task], log_samples=True,
                                   task_manager=local_tasks(ROOT / "docs" / "my_tasks"))
  (ll, greedy), (ll_hf, greedy_hf) = per_request(samples), per_request(theirs["samples"][task])
  np.testing.assert_allclose(ll, ll_hf, atol=TOLERANCE, rtol=0)
  assert greedy == greedy_hf


@pytest.mark.parametrize("model_args, refusal", [
  ("dtype=foo", "error: dtype=foo: the s2sjax backend scores in float32 or bfloat16"),
  ("mesh=data:-1+model:2", "error: mesh=data:-1+model:2: mesh 'data:-1,model:2': 1 devices are not divisible by 2"),
  # batch_size in model_args, as the hf backend takes it, beside lm-eval's own --batch_size (1 by default)
  ("batch_size=0", "error: batch_size must be a number of rows or auto, not 0"),
  ("pretrained=no/such/folder", "error: pretrained=no/such/folder: no such checkpoint"),
])
def test_a_backend_refusal_through_lm_evals_command_line_is_one_line(model_args, refusal):
  # lm-eval's command line builds the backend itself: its refusal is printed by s2sjax.lm_eval, as one line
  run = subprocess.run(
    [sys.executable, "-m", "s2sjax.lm_eval", "run", "--model_args", model_args, "--tasks", "sample_storycloze",
     "--include_path", "docs/my_tasks", "--device", "cpu"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert run.returncode == 1, run.stderr[-3000:]
  assert run.stderr.splitlines()[-1] == refusal and "Traceback" not in run.stderr, run.stderr


def test_ctrl_c_mid_step_stops_lm_evals_command_line_with_one_line(tmp_path):
  # the first step held until the command stops waiting for it (tests/interrupting.py)
  assignments, words = readme_command()
  env = dict(os.environ, **assignments, HF_DATASETS_CACHE=str(tmp_path / "datasets"))
  words[words.index("--output_path") + 1] = str(tmp_path / "out")
  returncode, stderr, _ = interrupt_mid_step([sys.executable if w == "python" else w for w in words], 1,
                                             signal.SIGINT, cwd=ROOT, env=env)
  assert returncode == 130, stderr[-3000:]
  assert stderr.splitlines()[-1] == ("interrupted by SIGINT: lm-eval writes its results when a run ends, so nothing "
                                     "was written; rerun the command")
  assert "Traceback" not in stderr and not (tmp_path / "out").exists()
