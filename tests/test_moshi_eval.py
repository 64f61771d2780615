"""Moshi end to end: a tiny random `LMModel` in Kyutai's release layout (with a sentencepiece text tokenizer trained
here) is converted, the bundled sample's sStoryCloze is built for a parallel_streams spec from precomputed codes,
and `s2sjax.eval.run` scores T->T, S->T and S->S (both protocols). Every candidate's score is held against
`LMModel.forward` on that candidate's own sequence, laid and weighed by the protocol rule below (written out here
from the Moshi paper, arXiv 2410.00037 §5.4, not taken from the builder):

  time-aligned codes [1 + n_q, P + n]; stream 0 text, streams 1..dep_q Moshi's own codebooks, the rest (the user's
  speech) -1 throughout. A spoken prefix's P frames: its codes on the own codebooks, text -1.
  s2t: the candidate's n steps: its text ids (sentencepiece, no special tokens) on the text stream, audio -1;
       scored: the text stream at times P..P+n-1.
  s2s: the candidate's n frames: its codes on the own codebooks, text -1; scored: "all tokens of a timestep with
       the same weights used during training, i.e. 100 for the semantic tokens and 1 for the acoustic ones" (the
       first codebook 100, the others 1), text "not include[d]", at times P..P+n-1.
  s2s_utterance: the story and its ending heard as one recording (P = 0, n = both lengths), scored as s2s.
  t2t: the prefix's text ids, then the candidate's (" " + ending: the English separator), on the text stream, audio
       -1 throughout; scored: the text stream at the candidate's times.
  A candidate's score is its weighted NLL "normalized by the sequence length": divided by n.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import numpy as np
import pytest
import yaml

import moshi.models.lm as lm
import sentencepiece as spm
import torch

from checkpoints_conversion import convert  # noqa: E402
from s2sjax.scoring.checkpoints import checkpoint  # noqa: E402
from s2sjax.commands.eval import EvalConfig, run  # noqa: E402
from s2sjax.scoring.evaluator import EvalError, ScoringOptions, check_fit  # noqa: E402
from s2sjax.data.spec import SpecError, load_spec  # noqa: E402
from s2sjax.data.builds import Variants  # noqa: E402
from s2sjax.data.task_data import load_task_data  # noqa: E402
from tasks.preparation import prepare  # noqa: E402
from tasks.release import read_questions  # noqa: E402
from tasks.sample import RELEASE_DIR  # noqa: E402
from tests.test_moshi import LOADER, TINY, release_state_dict, step_tolerance, write_release  # noqa: E402

TASK = "sstorycloze"
TEXT_CARD = 128  # the tiny tokenizer's pieces fit below it
CONFIG = {**TINY, "text_card": TEXT_CARD}  # n_q 4, dep_q 3, card 32, delays [0, 0, 1, 1, 2]
OWN = CONFIG["dep_q"]
ROW = 256


def _spec(path: str, codebooks: int = OWN, delays=None) -> str:
  with open(path, "w") as f:
    yaml.safe_dump({"name": "tiny_moshi", "audio_mode": "parallel_streams", "architecture": "moshi",
                    "audio_tokenizer": {"type": "precomputed"},
                    "codebook_sizes": [CONFIG["card"]] * codebooks,
                    "stream_delays": delays or CONFIG["delays"][: 1 + codebooks], "text_initial_id": TEXT_CARD}, f)
  return path


def _codes(directory: str, codebooks: int, seed: int = 0) -> str:
  """`<uttid>.npy` per spoken prefix (a story's two lines share it) and `candidates/<name>.npy` per spoken ending."""
  rng = np.random.default_rng(seed)
  os.makedirs(os.path.join(directory, "candidates"))
  for question in read_questions(TASK, RELEASE_DIR):
    prefix = rng.integers(0, CONFIG["card"], (int(rng.integers(8, 40)), codebooks))
    for c, uttid in enumerate(question.uttids):
      np.save(os.path.join(directory, f"{uttid}.npy"), prefix)
      name = os.path.splitext(os.path.basename(question.candidate_audio_paths[c]))[0]
      np.save(os.path.join(directory, "candidates", f"{name}.npy"),
              rng.integers(0, CONFIG["card"], (int(rng.integers(4, 20)), codebooks)))
  return directory


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("moshi_eval")
  torch.manual_seed(0)
  model = lm.LMModel(**CONFIG, dtype=torch.float32).eval()
  with torch.no_grad():  # norms and attention perturbed so that each matters
    for name, p in model.named_parameters():
      if name.endswith("alpha"):
        p.copy_(1 + 0.2 * torch.randn_like(p))
      elif name.startswith("depformer.") or ".self_attn." in name:
        p.add_(0.05 * torch.randn_like(p))
  release = write_release(root / "release", release_state_dict(model), {**CONFIG, **LOADER})
  texts = [t for q in read_questions(TASK, RELEASE_DIR) for t in q.prefixes[:1] + q.candidates]
  spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_prefix=str(root / "spm"), vocab_size=100,
                                 character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
  os.rename(root / "spm.model", os.path.join(release, LOADER["tokenizer_name"]))
  ckpt = str(root / "ckpt")
  convert.convert(release, ckpt, family="moshi")
  return {"root": root, "model": model, "ckpt": ckpt, "spec": _spec(str(root / "tiny_moshi.yaml")),
          "codes": _codes(str(root / "codes"), OWN), "text": spm.SentencePieceProcessor(
            model_file=os.path.join(release, LOADER["tokenizer_name"]))}


def _build(setup, modality, spec=None, codes=None, variants=Variants(), data_dir=None):
  data_dir = data_dir or str(setup["root"] / "data")
  prepare(TASK, spec or setup["spec"], modality, ROW, data_dir, manual_dir=RELEASE_DIR, variants=variants,
          tokenizer_dir=os.path.join(setup["ckpt"], "tokenizer"), audio_tokenizer_dir=codes or setup["codes"])
  return data_dir


MODALITIES = ("t2t", "s2t", "s2s")
SCORED = MODALITIES + ("s2s_utterance",)  # S->S by the s2sbench protocol and by the utterance one


def _run(setup, output, variants=Variants()):
  """`s2sjax.eval.run` on T->T, S->T and S->S by both protocols; the per-candidate lines of its scores files."""
  for modality in MODALITIES:
    data_dir = _build(setup, modality, variants=variants)
  _build(setup, "s2s", variants=dataclasses.replace(variants, protocol="utterance"))
  run(EvalConfig(tasks=(TASK,), modalities=MODALITIES, protocols=("s2sbench", "utterance"), checkpoints=setup["ckpt"],
                 spec=setup["spec"], data_dir=data_dir, output_dir=str(setup["root"] / output), row_length=ROW,
                 chunk_rows=2, variants=variants, scoring=ScoringOptions(batch_size=4, attention="auto")))
  out = {}
  for scored in SCORED:
    (path,) = glob.glob(str(setup["root"] / output / "*" / f"{TASK}-{scored}.scores.jsonl"))
    with open(path) as f:
      out[scored] = {(line["question"], line["candidate"]): line for line in map(json.loads, f)}
  return out


PAPER_WEIGHTS = (100,) + (1,) * (OWN - 1)  # per own codebook: "100 for the semantic tokens and 1 for the acoustic"


def _step_tolerance(scored: str) -> float:
  return step_tolerance(PAPER_WEIGHTS if scored.startswith("s2s") else (1,))


def _naive(setup, question, c, scored) -> tuple[float, int]:
  """(weighted NLL sum, steps) of candidate c by LMModel.forward on its own sequence (the module docstring's rule)."""
  load = lambda name: np.load(os.path.join(setup["codes"], f"{name}.npy"))
  text = lambda s: np.asarray(setup["text"].encode(s))
  story = text(question.prefixes[c]) if scored == "t2t" else load(question.uttids[c])
  spoken = load("candidates/" + os.path.splitext(os.path.basename(question.candidate_audio_paths[c]))[0])
  if scored == "s2s_utterance":
    prefix, ending = story[:0], np.concatenate([story, spoken])
  else:
    prefix, ending = story, {"s2s": spoken, "s2t": text(question.candidates[c]),
                             "t2t": text(" " + question.candidates[c])}[scored]
  P, n = len(prefix), len(ending)
  codes = np.full((1 + CONFIG["n_q"], P + n), -1, np.int64)
  if scored == "t2t":
    codes[0, :P] = prefix
  else:
    codes[1 : 1 + OWN, :P] = prefix.T
  if scored.startswith("s2s"):
    codes[1 : 1 + OWN, P:] = ending.T
  else:
    codes[0, P:] = ending
  with torch.no_grad():
    out = setup["model"](torch.from_numpy(codes)[None])
  if scored.startswith("s2s"):  # codebook k is stream 1 + k
    streams = [(w, out.logits[0, k], out.mask[0, k], codes[1 + k]) for k, w in enumerate(PAPER_WEIGHTS)]
  else:
    streams = [(1, out.text_logits[0, 0], out.text_mask[0, 0], codes[0])]
  total = 0.0
  for weight, logits, mask, ids in streams:
    log_probs = torch.log_softmax(logits.double(), -1)
    total -= weight * sum(float(log_probs[t, ids[t]]) for t in range(P, P + n) if mask[t])
  return total, n


@pytest.mark.slow
def test_every_modality_matches_lmmodel_forward_per_candidate_and_sharing_changes_nothing(setup):
  shared = _run(setup, "out")
  questions = read_questions(TASK, RELEASE_DIR)
  for scored in SCORED:
    assert len(shared[scored]) == 2 * len(questions)
    worst_sum = worst_mean = 0.0
    for question in questions:
      for c in range(len(question.candidates)):
        line = shared[scored][(question.id, c)]
        total, steps = _naive(setup, question, c, scored)
        assert line["n_tokens"] == steps, (scored, question.id, c)
        worst_sum = max(worst_sum, abs(line["nll_sum"] - total))
        worst_mean = max(worst_mean, abs(line["nll_sum"] / line["n_tokens"] - total / steps))
    print(f"{scored}: {len(questions)} questions, largest |score - LMModel.forward| {worst_sum:.1e} (weighted sum), "
          f"{worst_mean:.1e} (per step)")
    assert worst_mean <= _step_tolerance(scored), (scored, worst_mean)
  unshared = _run(setup, "out_noshare", Variants(share_prefix=False))
  for scored in SCORED:
    for key, line in shared[scored].items():
      assert unshared[scored][key]["n_tokens"] == line["n_tokens"]
      assert abs(unshared[scored][key]["nll_sum"] - line["nll_sum"]) / line["n_tokens"] <= _step_tolerance(scored), (
        scored, key)
  again = _run(setup, "out")  # every chunk resumed: the same lines
  assert again == shared


@pytest.mark.parametrize("codebooks, delays, named", [
  (2, None, r"the spec's audio tokenizer gives 2 codebooks per frame, but the model predicts dep_q=3"),
  (OWN, [0, 1, 1, 1], r"the spec's stream_delays \[0, 1, 1, 1\] are not the model's \[0, 0, 1, 1\]"),
])
def test_a_spec_that_does_not_fit_the_checkpoint_is_refused_at_check_fit(setup, codebooks, delays, named):
  spec = _spec(str(setup["root"] / f"misfit_{codebooks}_{delays is not None}.yaml"), codebooks, delays)
  codes = _codes(str(setup["root"] / f"codes_{codebooks}_{delays is not None}"), codebooks)
  data_dir = _build(setup, "s2s", spec=spec, codes=codes, data_dir=str(setup["root"] / "misfit"))
  td = load_task_data(data_dir, TASK, "s2s", spec, ROW)
  with pytest.raises(EvalError, match=rf"{TASK}/s2s \(spec tiny_moshi\) does not fit the moshi checkpoint: {named}"):
    check_fit(checkpoint.load_config(setup["ckpt"]), td)


def test_stream_specs_are_checked_and_t2s_cannot_be_asked_of_them(setup, tmp_path):
  for fields, named in [({"stream_delays": [0, 0, 1]}, r"stream_delays \[0, 0, 1\] must give the text stream and each "
                         r"of the 3 codebooks"), ({"text_initial_id": None}, "are set exactly when audio_mode is"),
                        ({"start_token": "<s>"}, "lays audio on streams of its own: it takes no start_token")]:
    path = _spec(str(tmp_path / "bad.yaml"))
    with open(path) as f:
      spec = yaml.safe_load(f)
    with open(path, "w") as f:
      yaml.safe_dump({**spec, **fields}, f)
    with pytest.raises(SpecError, match=named):
      load_spec(path)
  with pytest.raises(SpecError, match=r"spec tiny_moshi reads parallel streams.* t2s \(T→S\) cannot be asked"):
    _build(setup, "t2s", data_dir=str(setup["root"] / "t2s"))


def test_a_tokenizer_with_more_pieces_than_the_text_stream_is_refused_at_conversion(setup, tmp_path):
  model = lm.LMModel(**TINY, dtype=torch.float32)  # text_card 48: the tiny tokenizer's pieces do not fit
  release = write_release(tmp_path / "release", release_state_dict(model), {**TINY, **LOADER})
  with open(os.path.join(release, LOADER["tokenizer_name"]), "wb") as f:
    f.write(setup["text"].serialized_model_proto())
  with pytest.raises(convert.ConversionError, match=r"tokenizer_spm_32k_3.model has \d+ pieces, but the text stream "
                                                    r"takes ids below text_card=48"):
    convert.convert(release, str(tmp_path / "ckpt"), family="moshi")


@pytest.mark.slow
@pytest.mark.parametrize("modality", ["s2s", "s2t"])
def test_the_pre_flight_passes_on_a_converted_moshi_checkpoint_with_its_data(setup, modality):
  """`python -m s2sjax.check` through Moshi's architecture: its release config parsed again, its text stream's
  embedding, the spec's streams, every id of the rows within its tables, a row scored, and the audio blanked on
  the codebook streams moving that score."""
  import subprocess
  import sys

  data_dir = _build(setup, modality)
  done = subprocess.run(
    [sys.executable, "-m", "s2sjax.check", f"--checkpoint={setup['ckpt']}", f"--spec={setup['spec']}",
     f"--data_dir={data_dir}", f"--task={TASK}", f"--modality={modality}", f"--row_length={ROW}"],
    capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stdout + done.stderr[-3000:]
  verdicts = {line.split()[1]: line.split()[0] for line in done.stdout.splitlines() if line[:4] in ("ok  ", "FAIL")}
  assert verdicts["config"] == verdicts["spec"] == verdicts["check_fit"] == verdicts["smoke"] == "ok"
  assert "audio reaches the model" in done.stdout and "moshi, model_type moshi" in done.stdout
  assert done.stdout.strip().endswith("checks passed")
