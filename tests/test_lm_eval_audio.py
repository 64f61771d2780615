"""Audio through lm-eval: S2SBench's three tasks S->T as task YAMLs (docs/my_tasks/*_s2t.yaml) run by lm-eval's own
command line with the `s2sjax` backend give `s2sjax.eval`'s per-candidate log-likelihoods and its lm-eval `acc` on the
bundled sample (the tiny qwen2 of tests/eval_fixtures.py, the demo spec's mel k-means units); a request's recordings
are dealt to its placeholders as the backend's docstring says; a text-only backend, lm-eval's or ours, refuses an
audio task in one line naming it."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import lm_eval  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from s2sjax.commands import lm_eval_audio  # noqa: E402
from s2sjax.commands.lm_eval_documents import DocumentError, document, questions  # noqa: E402
from tasks.release import read_questions  # noqa: E402
from tasks.sample import RELEASE_DIR  # noqa: E402
from tests.test_lm_eval_args import lm_eval_logging_kept, signal_handlers_kept  # noqa: E402, F401 - fixtures

ROOT = pathlib.Path(__file__).resolve().parents[1]
MY_TASKS = ROOT / "docs" / "my_tasks"
TASKS = {"sstorycloze": "sstorycloze_s2t", "zh_sstorycloze": "zh_sstorycloze_s2t", "scmmlu": "scmmlu_s2t"}
TOLERANCE = 1e-5  # per candidate: its summed log-likelihood, fp32, the same model on other rows


def sample_tasks() -> TaskManager:
  """lm-eval's task manager over docs/my_tasks only (lm-eval's own ~14,000 task files are not read)."""
  return TaskManager(include_path=str(MY_TASKS), include_defaults=False)


def test_the_documents_are_the_releases_questions_read_by_s2sjaxs_reader():
  for task in TASKS:
    read = read_questions(task, RELEASE_DIR)
    docs = questions(task, RELEASE_DIR, version=1.0)["test"]
    assert [d["id"] for d in docs] == [q.id for q in read]
    assert [d["candidates"] for d in docs] == [list(q.candidates) for q in read]
    assert [d["answer"] for d in docs] == [q.correct for q in read]
    assert [d["prefix_audio"] for d in docs] == [[{"path": q.audio_paths[0]}] for q in read]


def test_a_question_whose_candidates_follow_different_recordings_is_refused():
  question = read_questions("sstorycloze", RELEASE_DIR)[0]
  other = read_questions("sstorycloze", RELEASE_DIR)[1].audio_paths[0]  # another story's spoken prefix
  with pytest.raises(DocumentError, match=f"question {question.id}: its candidates follow different prefixes"):
    document(question.__class__(**{**question.__dict__, "audio_paths": (question.audio_paths[0], other)}))


def requests(context: str, choices: list[str], audio: list, doc_id: int = 0) -> list[Instance]:
  """A multiple-choice document's requests as lm-eval makes them (api/task.py: the multimodal dict after each
  choice's context and continuation), in shuffled order."""
  made = [Instance("loglikelihood", {}, (context, choice, {"audio": audio}), c, metadata=("t", doc_id, 1))
          for c, choice in enumerate(choices)]
  return made[::-1]


def test_a_documents_recordings_fill_its_context_then_each_choice_in_order():
  a, b, c = ({"path": name} for name in ("a.wav", "b.wav", "c.wav"))
  spoken_prefix = requests("Listen: <audio>", [" yes", " no"], [a])
  assert lm_eval_audio.recordings(spoken_prefix) == [([a], []), ([a], [])]
  whole_recordings = requests("", ["<audio>", "<audio>"], [a, b])  # sWUGGY's pairs: no prefix, each choice its own
  assert lm_eval_audio.recordings(whole_recordings) == [([], [b]), ([], [a])]  # requests in reverse order
  spoken_both = requests("<audio>", ["<audio>", "<audio>"], [a, b, c])
  assert lm_eval_audio.recordings(spoken_both) == [([a], [c]), ([a], [b])]
  with pytest.raises(lm_eval_audio.AudioRequestError, match="task t document 0 choice 0: 2 recordings .* for 3 "):
    lm_eval_audio.recordings(requests("<audio>", ["<audio>", "<audio>"], [a, b]))


def test_lm_evals_own_text_only_backend_refuses_an_audio_task_naming_it():
  with pytest.raises(ValueError) as refused:
    lm_eval.simple_evaluate(model="dummy", tasks=["sstorycloze_s2t"], task_manager=sample_tasks(), limit=2)
  assert "['sstorycloze_s2t'] which require multimodal input" in str(refused.value)
  assert "\n" not in str(refused.value)


@pytest.fixture(scope="module")
def s2t_scores(tiny_sample, tmp_path_factory):
  """s2sjax.eval's S->T scores of the three tasks on the tiny sample: {task: {(question, candidate): log-likelihood}}
  and its metrics.json's tasks."""
  from s2sjax.commands import eval as s2s_eval
  from s2sjax.commands.eval import EvalConfig
  from s2sjax.scoring.evaluator import ScoringOptions

  out = str(tmp_path_factory.mktemp("s2t"))
  s2s_eval.run(EvalConfig(tuple(TASKS), ("s2t",), checkpoints=tiny_sample["ckpt"], data_dir=tiny_sample["data_dir"],
                          output_dir=out, chunk_rows=4, row_length=1024,
                          scoring=ScoringOptions(batch_size=4, attention="auto")))
  scores = {}
  for task in TASKS:
    lines = [json.loads(line) for line in open(os.path.join(out, "ckpt-100", f"{task}-s2t.scores.jsonl"))]
    scores[task] = {(line["question"], line["candidate"]): -line["nll_sum"] for line in lines}
  return scores, json.load(open(os.path.join(out, "metrics.json")))["runs"][0]["tasks"]


@pytest.mark.slow
def test_lm_evals_command_line_on_the_s2t_yamls_gives_s2sjax_evals_numbers(tiny_sample, s2t_scores, tmp_path):
  out = tmp_path / "out"
  run = subprocess.run(
    [sys.executable, "-m", "s2sjax.lm_eval", "run", "--model", "s2sjax", "--model_args",
     f"pretrained={tiny_sample['ckpt']},spec=demo,row_length=1024", "--tasks", ",".join(TASKS.values()),
     "--include_path", "docs/my_tasks", "--output_path", str(out), "--log_samples", "--batch_size", "4",
     "--device", "cpu"],
    cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert run.returncode == 0, run.stderr[-3000:]
  (folder,) = out.iterdir()
  (results_file,) = folder.glob("results_*.json")
  results = json.loads(results_file.read_text())["results"]
  scores, metrics = s2t_scores
  for task, name in TASKS.items():
    (samples_file,) = folder.glob(f"samples_{name}_*.jsonl")
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    got = {(s["doc"]["id"], c): float(resp[0][0]) for s in samples for c, resp in enumerate(s["resps"])}
    assert sorted(got) == sorted(scores[task]) and len(samples) == 24, task
    keys = sorted(got)
    np.testing.assert_allclose([got[k] for k in keys], [scores[task][k] for k in keys], atol=TOLERANCE, rtol=0,
                               err_msg=task)
    assert results[name]["acc,none"] == pytest.approx(metrics[task]["s2t"]["acc"], abs=1e-12), task


@pytest.mark.slow
@pytest.mark.parametrize("spec, why", [(None, "no spec"), ("qwen2.5", "spec qwen2.5 is text-only")])
def test_the_backend_without_a_spec_that_lays_audio_refuses_an_audio_task_in_one_line(tiny_sample, spec, why):
  from s2sjax.commands.lm_eval import BackendError, S2SJaxLM

  backend = S2SJaxLM(pretrained=tiny_sample["ckpt"], device="cpu:0", batch_size=2, **({"spec": spec} if spec else {}))
  with pytest.raises(BackendError) as refused:
    lm_eval.simple_evaluate(model=backend, tasks=["sstorycloze_s2t"], task_manager=sample_tasks(), limit=2)
  message = str(refused.value)
  assert message.startswith("task sstorycloze_s2t document 0 choice ") and f"given {why}" in message
  assert "\n" not in message


@pytest.fixture(scope="module")
def laid_as_built(qwen_tokenizer_dir):
  """(layer, encoder of a modality and protocol): the backend's audio layer and the build's encoder for one spec, the
  demo's units between two tokens Qwen2.5's vocabulary has, so that the start and end rules are seen. The layer's
  `lm` is the backend's text tokenization alone (`tok_encode`, `prefix_token_id`): no model is loaded."""
  from transformers import AutoTokenizer

  from s2sjax.commands.lm_eval import S2SJaxLM
  from s2sjax.data.spec import load_spec, spec_from_dict
  from tasks.audio import from_spec
  from tasks.encoders import QuestionEncoder

  fields = {**load_spec("demo").as_dict(), "name": "demo_marked", "start_token": "<|vision_start|>",
            "end_token": "<|vision_end|>"}
  spec = spec_from_dict(fields)
  lm = S2SJaxLM.__new__(S2SJaxLM)
  lm.tokenizer, lm.add_bos_token = AutoTokenizer.from_pretrained(qwen_tokenizer_dir), None
  audio = from_spec(spec.audio_tokenizer, spec.codebook_sizes)

  def layer(protocol="s2sbench"):
    return lm_eval_audio.AudioLayer(spec, lm, None, protocol)

  return layer, lambda modality, protocol="s2sbench": QuestionEncoder(spec, modality, lm.tokenizer, audio,
                                                                      protocol=protocol)


@pytest.mark.parametrize("modality, protocol", [("s2t", "s2sbench"), ("t2s", "s2sbench"), ("s2s", "s2sbench"),
                                                ("s2s", "utterance")])
def test_a_request_with_audio_is_laid_as_the_build_lays_its_question(laid_as_built, modality, protocol):
  """The task YAML's text (S2SBench's instruction, the written prefix) and `<audio>` where a recording goes give
  the ids the build lays for the question: the start token before a recording that follows text, the end token
  before text, both the context's at its end; under the utterance protocol a whole recording (sWUGGY's: no prefix)
  closed by the end token, scored."""
  layer, encoder = laid_as_built
  question = read_questions("sstorycloze", RELEASE_DIR)[3]
  instruction = "Below is a segment of alternating speech and text content: "
  prefix = {"path": question.audio_paths[0]}
  spoken = [{"path": path} for path in question.candidate_audio_paths]
  if protocol == "utterance":  # the candidate's recording alone, as a question without prefix audio lays it
    question = question.__class__(**{**question.__dict__, "audio_paths": ("", "")})
    context, choices, audio = "", ["<audio>", "<audio>"], spoken
  elif modality == "s2t":
    context, choices, audio = instruction + "<audio>", list(question.candidates), [prefix]
  elif modality == "t2s":
    context, choices, audio = instruction + question.prefixes[0], ["<audio>", "<audio>"], spoken
  else:
    context, choices, audio = instruction + "<audio>", ["<audio>", "<audio>"], [prefix] + spoken
  made = requests(context, choices, audio)[::-1]
  build = encoder(modality, protocol)
  for c, (request, heard) in enumerate(zip(made, lm_eval_audio.recordings(made))):
    laid = layer(protocol).lay(request, heard)
    assert laid.context == build.prefix(question, c)[0].tolist(), (modality, c)
    assert laid.continuation == build.candidate(question, c)[0].tolist(), (modality, c)
    assert laid.codes is None


def test_codebook_tables_carry_the_recordings_codes_at_the_placeholders_as_the_build_lays_them(laid_as_built):
  from s2sjax.data.spec import load_spec
  from tasks.audio import from_spec
  from tasks.encoders import QuestionEncoder

  layer, _ = laid_as_built
  spec = load_spec("demo_tables")
  lm = layer().lm
  question = read_questions("scmmlu", RELEASE_DIR)[5]
  made = requests("下面是一段语音和文本交错的内容：<audio>", list(question.candidates), [{"path": question.audio_paths[0]}])[::-1]
  build = QuestionEncoder(spec, "s2t", lm.tokenizer, from_spec(spec.audio_tokenizer, spec.codebook_sizes))
  ids, codes, _ = build.prefix(question, 0)
  for c, (request, heard) in enumerate(zip(made, lm_eval_audio.recordings(made))):
    laid = lm_eval_audio.AudioLayer(spec, lm, None, "s2sbench").lay(request, heard)
    assert laid.context == ids.tolist() and laid.continuation == build.candidate(question, c)[0].tolist()
    np.testing.assert_array_equal(laid.codes, codes)
    assert (laid.codes >= 0).any()


@pytest.mark.slow
def test_lm_evals_command_line_refuses_an_audio_task_for_its_own_text_backend_in_one_line(
    monkeypatch, capsys, signal_handlers_kept, lm_eval_logging_kept):
  """Through `python -m s2sjax.lm_eval`: one line and exit 1, not lm-eval's traceback (its task index kept to
  docs/my_tasks: lm-eval's own ~14,000 files take seconds to index)."""
  import lm_eval.tasks

  from s2sjax.commands import lm_eval as backend

  index = lm_eval.tasks.TaskManager.__init__
  monkeypatch.setattr(lm_eval.tasks.TaskManager, "__init__",
                      lambda self, *args, **kwargs: index(self, *args, **{**kwargs, "include_defaults": False}))
  monkeypatch.setattr(sys, "argv", ["s2sjax.lm_eval"])
  with pytest.raises(SystemExit) as exited:
    backend.cli_evaluate(["run", "--model", "dummy", "--tasks", "sstorycloze_s2t", "--include_path", str(MY_TASKS),
                          "--limit", "2"])
  assert exited.value.code == 1
  assert capsys.readouterr().err.splitlines()[-1] == (
    "error: task sstorycloze_s2t carries audio or images (doc_to_audio / doc_to_image) and the DummyLM backend reads "
    "text only; the s2sjax backend scores audio with model_args spec=NAME")


def test_a_decoded_recording_is_laid_as_its_file(laid_as_built):
  """lm-eval's common_voice form, {"array", "sampling_rate"}, as HF datasets decodes a wav: the same ids."""
  import soundfile

  layer, _ = laid_as_built
  path = read_questions("zh_sstorycloze", RELEASE_DIR)[2].audio_paths[0]
  wave, rate = soundfile.read(path, dtype="float32")
  laid = [layer().lay(made[0], lm_eval_audio.recordings(made)[0]).context
          for made in (requests("<audio>", ["好"], [recording])
                       for recording in ({"path": path}, {"array": wave, "sampling_rate": rate}))]
  assert laid[0] == laid[1] and len(laid[0]) > 20
  with pytest.raises(lm_eval_audio.AudioRequestError, match="task t document 0 choice 0: a recording is HF datasets"):
    made = requests("<audio>", ["好"], [{"bytes": b"RIFF"}])
    layer().lay(made[0], lm_eval_audio.recordings(made)[0])


PAIRS_YAML = """task: prosaudit_pairs
custom_dataset: !function s2sjax.commands.lm_eval_documents.questions
dataset_kwargs: {task: prosaudit_dev}
output_type: multiple_choice
test_split: test
doc_to_text: ""
doc_to_audio: candidate_audio
doc_to_choice: "{{['<audio>'] * candidates|length}}"
doc_to_target: answer
target_delimiter: ""
metric_list:
  - {metric: acc, aggregation: mean, higher_is_better: true}
metadata:
  version: 1.0
  release_dir: RELEASE
"""


@pytest.mark.slow
def test_whole_recordings_in_pairs_are_one_more_yaml_giving_s2sjax_evals_utterance_scores(tiny_sample, tmp_path):
  """A registered task of whole recordings and no prefix (ProsAudit's pairs, as sWUGGY's are), as a YAML and
  nothing else, scored with protocol=utterance: each candidate's log-likelihood is s2sjax.eval's S->S utterance
  score of the same recording on the same model, and lm-eval's acc its `acc`."""
  from s2sjax.commands.eval import EvalConfig, run
  from s2sjax.commands.lm_eval import S2SJaxLM
  from s2sjax.data.builds import Variants
  from s2sjax.scoring.evaluator import ScoringOptions
  from tasks.preparation import prepare
  from tests.neighbour_releases import Speech, write_prosaudit

  root = str(tmp_path / "prosaudit")
  write_prosaudit(root, Speech(str(tmp_path / "clips")))
  data, out = str(tmp_path / "data"), str(tmp_path / "out")
  prepare("prosaudit_dev", "demo", "s2s", 1024, data, manual_dir=root, variants=Variants(protocol="utterance"),
          tokenizer_dir=tiny_sample["tokenizer"])
  run(EvalConfig(tasks=("prosaudit_dev",), modalities=("s2s",), protocols=("utterance",),
                 checkpoints=tiny_sample["ckpt"], data_dir=data, output_dir=out, row_length=1024, chunk_rows=4,
                 scoring=ScoringOptions(batch_size=4)))
  lines = [json.loads(line) for line in open(os.path.join(out, "ckpt-100", "prosaudit_dev-s2s_utterance.scores.jsonl"))]
  want = {(line["question"], line["candidate"]): -line["nll_sum"] for line in lines}
  metrics = json.load(open(os.path.join(out, "metrics.json")))["runs"][0]["tasks"]["prosaudit_dev"]["s2s_utterance"]

  (tmp_path / "tasks").mkdir()
  (tmp_path / "tasks" / "prosaudit_pairs.yaml").write_text(PAIRS_YAML.replace("RELEASE", root))
  backend = S2SJaxLM(pretrained=tiny_sample["ckpt"], spec="demo", protocol="utterance", row_length=1024,
                     device="cpu:0", batch_size=4)
  results = lm_eval.simple_evaluate(model=backend, tasks=["prosaudit_pairs"], log_samples=True,
                                    task_manager=TaskManager(include_path=str(tmp_path / "tasks"),
                                                             include_defaults=False))
  samples = results["samples"]["prosaudit_pairs"]
  got = {(s["doc"]["id"], c): float(resp[0][0]) for s in samples for c, resp in enumerate(s["resps"])}
  assert sorted(got) == sorted(want) and len(got) == 16
  keys = sorted(got)
  np.testing.assert_allclose([got[k] for k in keys], [want[k] for k in keys], atol=TOLERANCE, rtol=0)
  assert results["results"]["prosaudit_pairs"]["acc,none"] == pytest.approx(metrics["acc"], abs=1e-12)
