"""The `s2sjax` lm-eval backend against lm-eval's own `hf` backend on the same SmolLM2-135M weights (the embedded
default's GGUF, loaded by transformers): per-request log-likelihoods, greedy flags, rolling windows, and a local
StoryCloze 2016 task through the command line."""

import json
import os
import pathlib
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

from s2sjax import default_model  # noqa: E402
from s2sjax.lm_eval import S2SJaxLM  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
STORYCLOZE = (ROOT.parent / "shared" / "realdata" / "storycloze"
              / "cloze_test_test__spring2016 - cloze_test_ALL_test.csv")
ROW_LENGTH = 256
TOLERANCE = 1e-4  # per request (a continuation's summed log-likelihood), fp32
TASK_YAML = """task: storycloze_2016_local
dataset_path: csv
dataset_kwargs:
  data_files:
    test: {path}
output_type: multiple_choice
test_split: test
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
  if not STORYCLOZE.exists():
    pytest.skip(f"the StoryCloze 2016 test CSV is not at {STORYCLOZE}")
  (folder / "storycloze_2016_local.yaml").write_text(TASK_YAML.format(path=json.dumps(str(STORYCLOZE))))
  return "storycloze_2016_local"


@pytest.fixture(scope="module")
def hf(smollm2_transformers):
  """lm-eval's own backend on transformers' load of the same GGUF, with the same max_length as ours. Its fp32
  log_softmax over 49,152 logits runs ~2e-5 a token above the float64 value (3e-4 on a 15-token StoryCloze
  ending); softmax_dtype=float64 (its own option) gives the reference its float64 normaliser."""
  model, tokenizer = smollm2_transformers
  return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=8, max_length=ROW_LENGTH - 1, softmax_dtype="float64")


@pytest.fixture(scope="module")
def ours():
  return S2SJaxLM(checkpoint=default_model.default_checkpoint(), batch_size=8, row_length=ROW_LENGTH)


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
  assert (ours.contexts_scored - contexts, ours.rows_scored - rows) == (3, 1)
  want = hf.loglikelihood(requests("loglikelihood", args))
  np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], atol=TOLERANCE, rtol=0)
  assert [g[1] for g in got] == [w[1] for w in want]


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


def test_storycloze_through_the_command_line_matches_the_hf_backend(tmp_path, hf):
  task = storycloze_task(tmp_path)
  out = tmp_path / "results.json"
  args = f"checkpoint={default_model.default_checkpoint()},mesh=data:-1,dtype=float32,row_length=512"
  run = subprocess.run(
    [sys.executable, "-m", "s2sjax.lm_eval", f"--model_args={args}", f"--tasks={task}", f"--include_path={tmp_path}",
     "--limit=40", f"--output_path={out}", "--log_samples"],
    cwd=ROOT, capture_output=True, text=True, timeout=600,
    env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},  # one device: 8 host devices take 4x the memory
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert "acc_norm" in run.stdout  # the results table
  ours = json.loads(out.read_text())
  theirs = lm_eval.simple_evaluate(model=hf, tasks=[task], task_manager=TaskManager(include_path=str(tmp_path)),
                                   limit=40, log_samples=True)
  (ll, greedy), (ll_hf, greedy_hf) = per_request(ours["samples"][task]), per_request(theirs["samples"][task])
  assert len(ll) == len(ll_hf) == 80
  np.testing.assert_allclose(ll, ll_hf, atol=TOLERANCE, rtol=0)
  assert greedy == greedy_hf
  for metric in ("acc,none", "acc_norm,none"):
    assert ours["results"][task][metric] == theirs["results"][task][metric]
