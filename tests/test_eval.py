"""s2sjax.eval end to end on the bundled sample: every task x modality, curves over three checkpoints, resume
after a kill, one compilation across evaluate() calls, and clear errors for data and models that do not fit."""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from s2sjax.data import task_registry
from s2sjax.scoring.checkpoints import paths as checkpoint_paths
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.commands import eval as s2s_eval
from s2sjax.commands.eval import EvalConfig
from s2sjax.scoring.evaluator import EvalError, Evaluator, ScoringOptions
from s2sjax.data.packing import RowShape
from s2sjax.data.builds import DataError, Variants
from s2sjax.data.task_data import load_task_data
from tasks.preparation import prepare
from tasks.sample import RELEASE_DIR
from tests.eval_fixtures import later_steps, same_tree

pytestmark = pytest.mark.slow  # builds every task of the sample and runs whole evaluations, some as subprocesses

ALL_TASKS = ["sstorycloze", "zh_sstorycloze", "scmmlu"]


def _run(setup, out, checkpoints=None, tasks=ALL_TASKS, modalities=("t2t", "s2t"), chunk_rows=4, **config):
  config = {"checkpoints": checkpoints or setup["ckpt"], "data_dir": setup["data_dir"], "output_dir": out,
            "chunk_rows": chunk_rows, "row_length": 1024, "scoring": ScoringOptions(batch_size=4, attention="auto"),
            **config}
  return s2s_eval.run(EvalConfig(tuple(tasks), tuple(modalities), **config))


def test_every_task_and_modality_end_to_end(tiny_sample, tmp_path, qwen_tokenizer_dir):
  out = str(tmp_path / "out")
  _run(tiny_sample, out)
  saved = json.load(open(os.path.join(out, "metrics.json")))["runs"][0]
  for task in ALL_TASKS:
    for modality in ("t2t", "s2t"):
      path = os.path.join(out, "ckpt-100", f"{task}-{modality}.scores.jsonl")
      lines = [json.loads(line) for line in open(path)]
      assert len(lines) == 24 * (4 if task == "scmmlu" else 2) and sum(line["is_answer"] for line in lines) == 24
      comparisons = [c for q in _comparisons(path, strict=task != "scmmlu").values() for c in q]
      m = saved["tasks"][task][modality]  # metrics.json against S2SBench's arithmetic over the scores file
      assert m["questions"] == 24 and m["accuracy"] == pytest.approx(sum(comparisons) / len(comparisons))
    text, speech = (saved["tasks"][task][m]["accuracy"] for m in ("t2t", "s2t"))
    assert saved["degradation"][task]["s2t_vs_t2t"]["degradation"] == pytest.approx(text - speech)
  # the scored NLLs against transformers on the same weights, prefix + " " + ending as S2SBench's T->T
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  model = AutoModelForCausalLM.from_pretrained(tiny_sample["hf"], dtype=torch.float32).eval()
  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  release = {str(line["uttid"]): line for line in map(json.loads, open(os.path.join(
    RELEASE_DIR, "StoryCloze", "sStory_s2t.jsonl")))}
  for line in [json.loads(line) for line in open(os.path.join(out, "ckpt-100", "sstorycloze-t2t.scores.jsonl"))][:4]:
    prefix = tokenizer(release[line["uttid"]]["first"])["input_ids"]
    ending = tokenizer(" " + release[line["uttid"]]["last"], add_special_tokens=False)["input_ids"]
    with torch.no_grad():
      log_probs = torch.log_softmax(model(torch.tensor([prefix + ending])).logits[0], -1)
    reference = -sum(float(log_probs[len(prefix) - 1 + j, t]) for j, t in enumerate(ending))
    assert line["n_tokens"] == len(ending) and abs(line["nll_sum"] - reference) / len(ending) <= 1e-4
  table = open(os.path.join(out, "table.md")).read().splitlines()
  assert table[0] == "| model | modality | sStoryCloze | zh-sStoryCloze | sCMMLU |" and table[4] == ""
  assert [row.split(" | ")[1] for row in table[2:4]] == ["T→T", "S→T"] and "T→T − S→T" in table[-1]
  for task in ALL_TASKS:  # flips.md lists exactly the questions the two modalities decide differently
    right = {m: {q: all(c) for q, c in _comparisons(os.path.join(out, "ckpt-100", f"{task}-{m}.scores.jsonl"),
                                                       strict=task != "scmmlu").items()}
             for m in ("t2t", "s2t")}
    expected = {q for q in right["t2t"] if right["t2t"][q] != right["s2t"][q]}
    listed = [line.split(" | ")[0][2:] for line in open(os.path.join(out, "ckpt-100", f"{task}.s2t_vs_t2t.flips.md"))
              if line.startswith("| ") and not line.startswith("| question")]
    assert sorted(listed) == sorted(expected) and len(listed) == len(set(listed))


def test_all_four_modalities_and_both_protocols_give_the_degradation_matrix(bytes_sample, tmp_path):
  """--modality=all --protocol=s2sbench,utterance: every modality's scores file holds S2SBench's arithmetic, and
  metrics.json and table.md hold the matrix (each of s2t, t2s, s2s against t2t, and s2s against s2t). A 256-id
  model (text as bytes, units as ids): the matrix is the same arithmetic whatever the vocabulary, and scoring the
  speech candidates' units over the Qwen2.5 tokenizer's 151,680 ids took most of a minute."""
  from transformers import AutoTokenizer

  from checkpoints_conversion.convert import convert
  from s2sjax.data import metrics, modalities
  from s2sjax.data.questions import QuestionScores
  from tests.hf_models import save_hf, tiny_model

  hf = save_hf(tiny_model("qwen2", vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2),
               str(tmp_path / "hf"))
  ckpt = str(tmp_path / "ckpt-100")
  convert(hf, ckpt)  # no tokenizer of its own: the byte tokenizer is named, as for the MaxText checkpoints
  # the utterance protocol opens a recording with the tokenizer's eos (lm-eval's prefix token): byte 0's symbol
  tokenizer = AutoTokenizer.from_pretrained(bytes_sample["tokenizer"])
  tokenizer.eos_token = tokenizer.convert_ids_to_tokens(0)
  tokenizer_dir = str(tmp_path / "tokenizer")
  tokenizer.save_pretrained(tokenizer_dir)
  tasks = ["tstorycloze"]  # the task only s2sjax has, and the one TWIST scores S->S on
  data_dir, spec = str(tmp_path / "data"), bytes_sample["spec"]
  for task in tasks:
    for modality in ("t2t", "s2t", "t2s", "s2s"):
      prepare(task, spec, modality, None, data_dir, tokenizer_dir=tokenizer_dir)
    prepare(task, spec, "s2s", None, data_dir, tokenizer_dir=tokenizer_dir, variants=Variants(protocol="utterance"))
  out = str(tmp_path / "out")
  _run({"ckpt": ckpt, "data_dir": data_dir}, out, tasks=tasks, modalities=modalities.parse("all"),
       protocols=("s2sbench", "utterance"), spec=spec, row_length=None, tokenizer_dir=tokenizer_dir)
  saved = json.load(open(os.path.join(out, "metrics.json")))["runs"][0]
  labels = ["t2t", "s2t", "t2s", "s2s", "s2s_utterance"]
  for task in tasks:
    assert sorted(saved["tasks"][task]) == sorted(labels)
    scores = {}
    for label in labels:
      path = os.path.join(out, "ckpt-100", f"{task}-{label}.scores.jsonl")
      comparisons = [c for q in _comparisons(path, strict=True).values() for c in q]
      assert saved["tasks"][task][label]["accuracy"] == pytest.approx(sum(comparisons) / len(comparisons))
      scores[label] = QuestionScores.from_lines([json.loads(line) for line in open(path)])
    matrix = saved["degradation"][task]
    assert sorted(matrix) == ["s2s_vs_s2t", "s2s_vs_t2t", "s2t_vs_t2t", "t2s_vs_t2t"]
    for reference, other in modalities.COMPARISONS:
      report = matrix[modalities.comparison_key(reference, other)]
      accuracy = lambda label: saved["tasks"][task][label]["accuracy"]
      assert report["degradation"] == pytest.approx(accuracy(reference) - accuracy(other))
      b, c, p = metrics.mcnemar_p(*(metrics.question_decisions(task_registry.get(task), scores[m])
                                         for m in (reference, other)))
      assert (report["mcnemar"]["reference_only_right"], report["mcnemar"]["other_only_right"]) == (b, c)
    # the utterance protocol scores the whole story: more tokens per candidate than the ending alone
    assert (scores["s2s_utterance"].n_tokens > scores["s2s"].n_tokens).all()
  table = open(os.path.join(out, "table.md")).read()
  assert "| ckpt-100 | S→S (utterance) |" in table and "| ckpt-100 | S→T − S→S |" in table
  assert os.path.exists(os.path.join(out, "ckpt-100", "tstorycloze.t2s_vs_t2t.flips.md"))


def _comparisons(path, strict):
  """S2SBench's comparisons per question from a scores file: the right candidate's mean NLL against every other
  one's, strictly lower for stories, <= for sCMMLU (eval_story.py, eval_cmmlu4.py)."""
  by_question = {}
  for line in map(json.loads, open(path)):
    by_question.setdefault(line["question"], []).append(line)
  beats = (lambda a, b: a < b) if strict else (lambda a, b: a <= b)
  out = {}
  for q, candidates in by_question.items():
    right = next(c["nll_sum"] / c["n_tokens"] for c in candidates if c["is_answer"])
    out[q] = [beats(right, c["nll_sum"] / c["n_tokens"]) for c in candidates if not c["is_answer"]]
  return out


def _tensorboard_scalars(directory):
  """(tag, value, step) from tensorboardX event files: TFRecord frames of Event protos."""
  import glob
  import struct

  from tensorboardX.proto import event_pb2

  scalars = []
  for path in sorted(glob.glob(os.path.join(directory, "*"))):
    data, i = open(path, "rb").read(), 0
    while i < len(data):
      (size,) = struct.unpack("<Q", data[i : i + 8])
      event = event_pb2.Event()
      event.ParseFromString(data[i + 12 : i + 12 + size])
      scalars += [(v.tag, v.simple_value, event.step) for v in event.summary.value]
      i += 12 + size + 4
  return scalars


def test_three_checkpoints_give_curves(tiny_sample, tmp_path):
  first = shutil.copytree(tiny_sample["ckpt"], str(tmp_path / "run" / "ckpt-100"))  # the later steps go beside it
  paths = [first] + later_steps(first, (200, 300))
  out = str(tmp_path / "out")
  pattern = os.path.join(os.path.dirname(first), "ckpt-*")
  runs = _run(tiny_sample, out, checkpoints=pattern, tasks=["sstorycloze"], modalities=["t2t"], tensorboard=True)
  assert [r["step"] for r in runs] == [100, 200, 300] and [r["path"] for r in runs] == [os.path.abspath(p) for p in paths]
  for name in ("curves_accuracy.png", "curves_loss.png"):
    assert os.path.getsize(os.path.join(out, name)) > 10_000
  accuracies = {r["tasks"]["sstorycloze"]["t2t"]["positive_loss"] for r in runs}
  assert len(accuracies) == 3  # three different models were scored
  logged = [(step, value) for tag, value, step in _tensorboard_scalars(os.path.join(out, "tensorboard"))
            if tag == "sstorycloze/t2t/accuracy"]
  assert logged == [(r["step"], pytest.approx(r["tasks"]["sstorycloze"]["t2t"]["accuracy"])) for r in runs]


def test_killed_run_resumes_to_identical_files(tiny_sample, tmp_path):
  """Killed (SIGKILL, as a preempted VM) right after its third chunk is saved; the rerun scores only the rest."""
  from s2sjax.results.chunk_store import KILL_AFTER_CHUNKS

  reference, resumed = str(tmp_path / "reference"), str(tmp_path / "resumed")
  _run(tiny_sample, reference, tasks=["scmmlu"], modalities=["s2t"], chunk_rows=1,
       scoring=ScoringOptions(batch_size=1, attention="auto"))
  command = [sys.executable, "-m", "s2sjax.eval", "--task=scmmlu", "--modality=speech",
             f"--checkpoint={tiny_sample['ckpt']}", f"--data_dir={tiny_sample['data_dir']}", f"--output_dir={resumed}",
             "--batch_size=1", "--chunk_rows=1", "--row_length=1024"]
  killed = subprocess.run(command, env={**os.environ, KILL_AFTER_CHUNKS: "3"}, capture_output=True, timeout=300)
  assert killed.returncode == -signal.SIGKILL
  chunk_dir = os.path.join(resumed, "chunks", "ckpt-100", "scmmlu-s2t")
  total = len(load_task_data(tiny_sample["data_dir"], "scmmlu", "s2t", "demo", 1024).rows["tokens"])
  assert sorted(f for f in os.listdir(chunk_dir) if f.startswith("chunk-")) == [f"chunk-0000{i}.npz" for i in range(3)]
  assert total > 3 and not os.path.exists(os.path.join(resumed, "metrics.json"))
  finished = subprocess.run(command + ["--verbosity=0"], capture_output=True, text=True, timeout=300)
  assert finished.returncode == 0, finished.stdout + finished.stderr
  assert f"resuming, 3 of {total} chunks done, scoring {total - 3} rows" in finished.stderr
  assert same_tree(reference, resumed) == []


def test_evaluate_three_times_compiles_once(tiny_sample):
  config, params = checkpoint.load_config(tiny_sample["ckpt"]), checkpoint.load_params(tiny_sample["ckpt"])
  data = [load_task_data(tiny_sample["data_dir"], t, "s2t", "demo", 1024) for t in ("sstorycloze", "scmmlu")]
  evaluator = Evaluator(config, data, ScoringOptions(batch_size=4))
  first = evaluator.evaluate(params, step=0)
  for step in (1, 2):
    evaluator.evaluate({**params, "final_norm": {"scale": params["final_norm"]["scale"] * (1 + 0.1 * step)}}, step)
  assert evaluator.compiled_count() == 1  # both tasks share one row shape
  assert len(evaluator.history) == 3 and evaluator.history[0]["sstorycloze"] == first["sstorycloze"]
  assert evaluator.history[1]["sstorycloze"] != first["sstorycloze"]
  # params from another stack: its own nesting and names, mapped by a hook
  foreign = {"model": {"decoder": params["layers"], "tok": params["embed"], "rest": {
    k: v for k, v in params.items() if k not in ("layers", "embed")}}}
  adapter = lambda p: {"layers": p["model"]["decoder"], "embed": p["model"]["tok"], **p["model"]["rest"]}
  mapped = Evaluator(config, data, ScoringOptions(batch_size=4), params_adapter=adapter).evaluate(foreign, step=0)
  assert mapped["sstorycloze"] == first["sstorycloze"] and mapped["scmmlu"] == first["scmmlu"]


def test_data_and_models_that_do_not_fit(tiny_sample, tmp_path, qwen_tokenizer_dir):
  with pytest.raises(checkpoint_paths.CheckpointListError, match=r"--checkpoint pattern .* matches nothing"):
    _run(tiny_sample, str(tmp_path / "o"), checkpoints=str(tmp_path / "nothing-*"))
  with pytest.raises(DataError, match=r"no built data at .*: build it with python -m tasks.prepare --task=sstorycloze"):
    _run(tiny_sample, str(tmp_path / "o"), tasks=["sstorycloze"], modalities=["t2t"], data_dir=str(tmp_path / "empty"))
  config = checkpoint.load_config(tiny_sample["ckpt"])
  prepare("scmmlu", "demo_tables", "s2t", 1024, str(tmp_path / "data"), tokenizer_dir=qwen_tokenizer_dir)
  tables = load_task_data(str(tmp_path / "data"), "scmmlu", "s2t", "demo_tables", 1024)
  with pytest.raises(EvalError, match=r"spec demo_tables needs 1 audio codebook tables of sizes \(256,\); the checkpoint "
                                      "has none"):
    Evaluator(config, [tables])
  other = load_task_data(tiny_sample["data_dir"], "scmmlu", "t2t", "demo", 1024)
  other.metadata = dataclasses.replace(other.metadata, tokenizer=dict(other.metadata.tokenizer, vocab_sha="0" * 16))
  from s2sjax.scoring.evaluator import check_fit
  from s2sjax.data.text_tokenizer import identity
  from transformers import AutoTokenizer

  with pytest.raises(EvalError, match=r"was built with tokenizer .* rebuild it with python -m tasks.prepare"):
    check_fit(config, other, identity(AutoTokenizer.from_pretrained(qwen_tokenizer_dir)))


def test_two_processes_write_what_one_process_writes(tiny_sample, tmp_path):
  """The CLI across two processes of four CPU devices (gloo on loopback) ends with one process's files."""
  import socket

  def command(out, *extra):
    return [sys.executable, "-m", "s2sjax.eval", "--task=scmmlu", "--modality=both",
            f"--checkpoint={tiny_sample['ckpt']}", f"--data_dir={tiny_sample['data_dir']}", f"--output_dir={out}",
            "--batch_size=8", "--chunk_rows=2", "--row_length=1024", *extra]

  env = lambda devices: {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},
                         "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
  one = str(tmp_path / "one")
  subprocess.run(command(one), env=env(8), check=True, capture_output=True, timeout=300)
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  two = str(tmp_path / "two")

  def two_processes(out_of):
    logs = [tmp_path / f"process-{p}.log" for p in range(2)]
    procs = [subprocess.Popen(command(out_of(p), "--distributed", f"--coordinator_address=127.0.0.1:{port}",
                                      "--num_processes=2", f"--process_id={p}", "--cpu_collectives=gloo"),
                              env=env(4), stdout=open(logs[p], "w"), stderr=subprocess.STDOUT)
             for p in range(2)]
    deadline = time.time() + 300
    while time.time() < deadline and any(p.poll() is None for p in procs):
      if any(p.poll() not in (None, 0) for p in procs):  # one failed: the other would wait on it until timeout
        break
      time.sleep(0.2)
    for p in procs:
      p.kill()
      p.wait()
    outputs = [log.read_text() for log in logs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    return outputs

  two_processes(lambda p: two)
  assert same_tree(one, two) == [] and same_tree(two, one) == []
  # a rerun resumes every chunk; process 1's output folder is its own and empty (a worker-local --output_dir):
  # only process 0 reads the chunks and hands their numbers to process 1
  os.remove(os.path.join(two, "metrics.json"))
  outputs = two_processes(lambda p: two if p == 0 else str(tmp_path / "worker-1"))
  for output in outputs:  # both modalities, on both processes: every chunk was done
    assert len(re.findall(r"resuming, (\d+) of \1 chunks done, scoring 0 rows", output)) == 2, output[-3000:]
  assert same_tree(one, two) == [] and not os.path.exists(tmp_path / "worker-1" / "chunks")


def test_a_rerun_never_resumes_from_another_runs_chunks(tiny_sample, tmp_path):
  out = str(tmp_path / "out")
  _run(tiny_sample, out, tasks=["sstorycloze"], modalities=["t2t"])
  with pytest.raises(EvalError, match=r"holds results of another run \(dtype: 'float32' there, 'bfloat16' now\)"):
    _run(tiny_sample, out, tasks=["sstorycloze"], modalities=["t2t"],
         scoring=ScoringOptions(batch_size=4, dtype="bfloat16"))
  with pytest.raises(EvalError, match=r"\(chunk_rows: 4 there, 8 now\)"):
    _run(tiny_sample, out, tasks=["sstorycloze"], modalities=["t2t"], chunk_rows=8)
  # same folder name, another run's checkpoint: named apart, so it does not land in ckpt-100's chunks either
  assert checkpoint_paths.run_names(["/r/a/ckpt-100", "/r/b/ckpt-100", "/r/b/ckpt-200"]) == [
    "a/ckpt-100", "b/ckpt-100", "b/ckpt-200"]
  other = later_steps(tiny_sample["ckpt"], (100,), root=str(tmp_path / "runB"))[0]
  with pytest.raises(EvalError, match=r"checkpoint: '.*ckpt-100' there, '.*runB.*ckpt-100' now"):
    _run(tiny_sample, out, checkpoints=other, tasks=["sstorycloze"], modalities=["t2t"])


def test_the_rows_built_without_sharing_score_the_same(tiny_sample, tmp_path, qwen_tokenizer_dir):
  data_dir = str(tmp_path / "data")  # the shared build beside the one without sharing
  shutil.copytree(os.path.join(tiny_sample["data_dir"], "sstorycloze"), os.path.join(data_dir, "sstorycloze"))
  prepare("sstorycloze", "demo", "t2t", 1024, data_dir, variants=Variants(share_prefix=False),
          tokenizer_dir=qwen_tokenizer_dir)
  shared = _run(tiny_sample, str(tmp_path / "shared"), tasks=["sstorycloze"], modalities=["t2t"], data_dir=data_dir)
  separate = _run(tiny_sample, str(tmp_path / "sep"), tasks=["sstorycloze"], modalities=["t2t"], data_dir=data_dir,
                  variants=Variants(share_prefix=False))
  unshared_data = load_task_data(data_dir, "sstorycloze", "t2t", "demo", 1024, Variants(share_prefix=False))
  shared_data = load_task_data(data_dir, "sstorycloze", "t2t", "demo", 1024)
  assert unshared_data.metadata.variants.share_prefix is False and unshared_data.fingerprint != shared_data.fingerprint
  identity = json.load(open(os.path.join(tmp_path, "sep", "chunks", "ckpt-100", "sstorycloze-t2t", "identity.json")))
  assert identity["data"] == unshared_data.fingerprint  # the run scored the -noshare rows
  for key in ("positive_loss", "negative_loss", "accuracy"):
    assert separate[0]["tasks"]["sstorycloze"]["t2t"][key] == pytest.approx(
      shared[0]["tasks"]["sstorycloze"]["t2t"][key], abs=1e-5)


def test_auto_attention_on_cpu_is_the_einsums_for_windows_and_the_fused_call_for_whole_rows():
  windowed, whole = (SimpleNamespace(shape=RowShape(1024, 512, 64, max_item=item),
                                     metadata=SimpleNamespace(variants=Variants(share_prefix=True)))
                     for item in (128, 0))
  assert s2s_eval.pick_attention("auto", [windowed], "float32") == "xla"
  assert s2s_eval.pick_attention("auto", [windowed, whole], "float32") == "dot_product"  # one step may be dense
  assert s2s_eval.pick_attention("dot_product", [windowed], "float32") == "dot_product"  # a choice stands


def test_bad_flags_fail_before_anything_loads():
  for flag in ("--batch_size=0", "--chunk_rows=-1", "--row_length=0"):
    failed = subprocess.run([sys.executable, "-m", "s2sjax.eval", flag], capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0 and f"flag {flag}" in failed.stderr, failed.stderr[-2000:]


def test_a_chunk_that_lost_candidates_is_never_saved(tiny_sample, tmp_path, monkeypatch):
  from s2sjax.scoring.scorer import Scorer

  real = Scorer.score_slots

  def losing_a_candidate(self, params, rows, progress=True):
    slots = real(self, params, rows, progress)
    slots["n_tokens"][0, 0] = 0
    return slots

  monkeypatch.setattr(Scorer, "score_slots", losing_a_candidate)
  out = tmp_path / "out"
  with pytest.raises(EvalError, match=r"sstorycloze/t2t rows 0-\d+: 1 laid candidates scored no tokens; nothing was"):
    _run(tiny_sample, str(out), tasks=["sstorycloze"], modalities=["t2t"])
  assert not list(out.rglob("chunk-*.npz"))


def test_chunk_stores_refuse_other_rows_and_rescore_replaced_checkpoints_and_chunks_of_unknown_origin(tmp_path):
  import numpy as np

  from s2sjax.results.chunk_store import ChunkStore

  identity = {"checkpoint": "/ckpt/step_1", "checkpoint_content": "aaaa", "dtype": "float32", "chunk_rows": 4,
              "data": "0123"}
  store = ChunkStore(tmp_path / "c", identity)
  store.open()
  store.save(0, np.zeros((4, 2)), np.ones((4, 2), np.int64))
  with pytest.raises(EvalError, match=r"\(data: '0123' there, '4567' now\)"):
    ChunkStore(tmp_path / "c", {**identity, "data": "4567"}).open()
  ChunkStore(tmp_path / "c", identity).open()
  assert store.done(0)  # the same run resumes
  replaced = ChunkStore(tmp_path / "c", {**identity, "checkpoint_content": "bbbb"})
  replaced.open()  # the same path now holds other weights: its chunks are scored again
  assert not replaced.done(0)
  replaced.save(0, np.zeros((4, 2)), np.ones((4, 2), np.int64))
  os.remove(tmp_path / "c" / "identity.json")  # what versions before identities left behind: unverifiable
  replaced.open()
  assert not replaced.done(0)
