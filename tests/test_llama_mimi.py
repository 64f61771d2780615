"""Llama-Mimi (llm-jp/Llama-Mimi): a Llama whose vocabulary gains one token `<{code}_{q}>` per Mimi code and
quantizer, then `<audio>` and `</audio>` (torchtitan/train.py expand_tokenizer_with_unit_tokens, kept by
scripts/convert_dcp_to_hf.py, which also writes `num_quantizers` into config.json). A tiny release so laid (a
transformers LlamaForCausalLM with Llama-3.x's llama3 rope scaling, the tokens added as its expansion adds them)
converts with the llama rules and gives transformers' log-probs within 1e-4; built with the `llama_mimi` spec from
the official spoken StoryCloze layout, or sLM21's sWUGGY, under the utterance protocol, with codes from the project's
JAX Mimi, each recording's score is the authors' (their eval/sStoryCloze.py's compute_loss, computed here on
transformers' own Mimi and Llama; their eval/sLM21.py could not be fetched here, and is held to the same rule: one
token per frame)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch
import yaml

from checkpoints_conversion import convert
from s2sjax.scoring import log_probs
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.data.spec import SPECS_DIR, SpecError, load_spec, spec_from_dict
from tests.hf_models import save_hf, tiny_model
from tests.test_mimi_tokenizer import kyutai_release, release as mimi_release  # noqa: F401 (fixtures)
from tests.test_mimi_tokenizer import TINY_TRANSFORMERS

QUANTIZERS = 4  # config/llama3_2_1b.toml num_quantizers
CODES = TINY_TRANSFORMERS["codebook_size"]  # the tiny Mimi's (2,048 in kyutai/mimi)
# Llama-3.2-1B's config.json rope_scaling, which convert_dcp_to_hf.py's from_pretrained / save_pretrained keeps.
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
SAMPLE_RATE = 24000  # kyutai/mimi's feature extractor's, which the authors' datasets are cast to


def mimi_tokenizer():
  """A word-level stand-in for Llama-3's tokenizer (bos `<|begin_of_text|>` in front of every text), expanded as
  expand_tokenizer_with_unit_tokens expands it: `<{x}_{i}>` for x over the codes, i over the quantizers, then
  `<audio>`, `</audio>`, all ordinary added tokens."""
  from tokenizers import Tokenizer, models, pre_tokenizers, processors
  from transformers import PreTrainedTokenizerFast

  vocab = {"<unk>": 0, "<|begin_of_text|>": 1, **{f"w{i}": i for i in range(2, 48)}}
  core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  core.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                      special_tokens=[("<|begin_of_text|>", 1)])
  tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|begin_of_text|>", unk_token="<unk>")
  tokenizer.add_tokens([f"<{x}_{i}>" for x in range(CODES) for i in range(QUANTIZERS)])
  tokenizer.add_tokens(["<audio>", "</audio>"])
  return tokenizer


@pytest.fixture(scope="module")
def llama_mimi(tmp_path_factory):
  """(the tiny release folder, its transformers model, its tokenizer, the release converted)."""
  root = tmp_path_factory.mktemp("llama_mimi")
  tokenizer = mimi_tokenizer()
  model = tiny_model("llama", tied=True, vocab_size=len(tokenizer), rope_scaling=LLAMA3_ROPE)
  model.config.num_quantizers = QUANTIZERS
  source = str(root / "release")
  tokenizer.save_pretrained(source)
  save_hf(model, source)
  convert.convert(source, str(root / "ckpt"))
  return source, model.eval(), tokenizer, str(root / "ckpt")


def test_flattened_units_and_llama3_rope_give_transformers_log_probs(llama_mimi):
  source, model, tokenizer, ckpt = llama_mimi
  assert checkpoint.load_config(ckpt).rope_scaling is not None
  codes = np.random.default_rng(0).integers(0, CODES, size=(40, QUANTIZERS))  # 40 frames of Mimi codes
  text = "<audio>" + "".join(f"<{c}_{q}>" for frame in codes for q, c in enumerate(frame)) + "</audio>"
  ids = np.asarray(tokenizer(text).input_ids)[None]
  assert ids[0, 0] == tokenizer.bos_token_id and len(ids[0]) == 2 + codes.size + 1
  with torch.no_grad():
    reference = torch.log_softmax(model(torch.from_numpy(ids)).logits, -1)[0].numpy()
  assert np.abs(log_probs.compute(ckpt, ids).text - reference).max() < 1e-4


def test_the_spec_lays_every_quantizer_and_needs_a_token_of_code_and_codebook():
  spec = load_spec("llama_mimi")
  assert (spec.codebook_sizes, spec.unit_token, spec.options) == ((2048,) * 4, "<{}_{}>", {"max_audio_seconds": 20})
  fields = spec.as_dict()
  for token in ("<|audio_{}|>", "<{code}_{q}>", None):
    with pytest.raises(SpecError, match="4 codebooks in the vocabulary need a unit_token of code and codebook"):
      spec_from_dict(dict(fields, unit_token=token, unit_offset=None if token else 10))
  with pytest.raises(SpecError, match=r"extended_vocab's options are max_audio_seconds \(seconds > 0\)"):
    spec_from_dict(dict(fields, options={"max_audio_seconds": 0}))


def authors_loss(wave: np.ndarray, mimi, model, tokenizer) -> float:
  """eval/sStoryCloze.py's compute_loss (llm-jp/Llama-Mimi 95dd630, :26-43) on transformers' own Mimi and Llama:
  audio_array_to_text (torchtitan/datasets/hf_datasets.py:25-65 at 41bf994: cut at 20 s, encoded with
  num_quantizers, codes flattened frame by frame as `<{code}_{j}>`, between <audio> and </audio>), tokenized with
  bos, labels kept at 2::num_quantizers, HF's mean cross-entropy."""
  from transformers import EncodecFeatureExtractor

  extractor = EncodecFeatureExtractor(feature_size=1, sampling_rate=SAMPLE_RATE)  # kyutai/mimi's preprocessor
  if wave.shape[-1] > 20 * extractor.sampling_rate:  # hf_datasets.py:33-34
    wave = wave[: 20 * extractor.sampling_rate]
  inputs = extractor(raw_audio=wave, sampling_rate=extractor.sampling_rate, return_tensors="pt")
  with torch.no_grad():
    encoded = mimi.encode(inputs["input_values"], inputs["padding_mask"], num_quantizers=QUANTIZERS)
  flat = encoded.audio_codes.transpose(1, 2).reshape(-1)  # :50
  text = "".join(f"<{flat[i + j].item()}_{j}>" for i in range(0, flat.numel(), QUANTIZERS) for j in range(QUANTIZERS))
  inputs = tokenizer(f"<audio>{text}</audio>", return_tensors="pt")  # sStoryCloze.py:32
  labels = inputs.input_ids.clone()  # :34-38
  labels[labels == tokenizer.eos_token_id] = -100  # pad_token is eos_token when unset (:67-68); none here
  mod_mask = torch.zeros_like(labels)
  mod_mask[:, 2::QUANTIZERS] = 1
  labels[mod_mask == 0] = -100
  with torch.no_grad():
    return model(input_ids=inputs.input_ids, labels=labels).loss.item()  # :41-42


def spoken_stories(root) -> str:
  """The official spoken StoryCloze layout (sSC/<n>_<name>.wav, recordings 2i right, 2i+1 wrong), one recording
  past 20 s (the authors' cut)."""
  import soundfile

  from tasks.sample import RELEASE_DIR

  speech = os.path.join(RELEASE_DIR, "StoryCloze", "s-story-firstspeech")
  folder = root / "sSC"
  folder.mkdir(parents=True)
  for n, name in enumerate(["0.wav", "2.wav", "4.wav", "6.wav"]):
    shutil.copy(os.path.join(speech, name), folder / f"{n}_story{n // 2}.wav")
  long = np.concatenate([soundfile.read(os.path.join(speech, f"{k}.wav"), dtype="float32")[0] for k in range(0, 12, 2)])
  assert len(long) > 21 * 16000
  soundfile.write(folder / "4_story2.wav", long, 16000, subtype="FLOAT")
  shutil.copy(os.path.join(speech, "8.wav"), folder / "5_story2.wav")
  return str(root)


def spoken_words(root) -> str:
  """sLM21's sWUGGY layout (tests/slm21_fixture.py), three words in two voices spoken by espeak-ng."""
  from tests.slm21_fixture import WORDS, write_release

  return write_release(str(root), words=WORDS[:3], sentences=())


def authors_accuracy(task: str, expected: np.ndarray, n_tokens: np.ndarray, questions) -> float:
  """The accuracy from the authors' per-recording losses: their `neg_loss > pos_loss` count for spoken StoryCloze
  (sStoryCloze.py:109); for sWUGGY, the recordings' log-probabilities (their mean loss times the tokens it averages)
  compared as zrc compares them, ties half, averaged over voices per id, then over ids (tasks/lm/lexical.py:79-91)."""
  if task == "spoken_sstorycloze":
    return float((expected[:, 1] > expected[:, 0]).mean())
  summed = expected * n_tokens
  pair = (summed[:, 0] < summed[:, 1]) + 0.5 * (summed[:, 0] == summed[:, 1])
  by_id: dict[str, list[float]] = {}
  for question, value in zip(questions, pair):
    by_id.setdefault(question.labels["id"], []).append(value)
  return float(np.mean([np.mean(v) for v in by_id.values()]))


@pytest.mark.slow
@pytest.mark.parametrize("task, write_release", [("spoken_sstorycloze", spoken_stories), ("swuggy", spoken_words)])
def test_each_recording_is_scored_as_the_authors_script(tmp_path, llama_mimi, mimi_release, task, write_release):
  """A release of whole recordings (spoken StoryCloze's official layout; sLM21's sWUGGY), built with the llama_mimi
  spec (at the tiny Mimi's codebook size) under the utterance protocol and scored: each recording's mean NLL is the
  authors' first-quantizer loss within 1e-4 (one token per frame, `2::num_quantizers`), the accuracy theirs by the
  task's rule, and the Table 1 file gains the model's S->S (utterance) row."""
  from s2sjax.data.builds import Variants
  from s2sjax.commands.eval import EvalConfig, run
  from s2sjax.scoring.evaluator import ScoringOptions
  from tasks.audio.base import load_audio
  from tasks.preparation import prepare
  from tasks.release import read_questions

  source, model, tokenizer, ckpt = llama_mimi
  release = write_release(tmp_path / "release")
  fields = yaml.safe_load(open(os.path.join(SPECS_DIR, "llama_mimi.yaml")))
  spec = tmp_path / "llama_mimi_tiny.yaml"
  spec.write_text(yaml.safe_dump(dict(fields, name="llama_mimi_tiny", codebook_sizes=[CODES] * QUANTIZERS)))

  data, out = str(tmp_path / "data"), str(tmp_path / "out")
  prepare(task, str(spec), "s2s", None, data, manual_dir=release, variants=Variants(protocol="utterance"),
          tokenizer_dir=source, audio_tokenizer_dir=mimi_release["folder"])
  run(EvalConfig(tasks=(task,), modalities=("s2s",), protocols=("utterance",), checkpoints=ckpt, spec=str(spec),
                 data_dir=data, output_dir=out, ties="reference" if task == "spoken_sstorycloze" else None,
                 chunk_rows=2, scoring=ScoringOptions(batch_size=2)))
  scores_file = os.path.join(out, "ckpt", f"{task}-s2s_utterance.scores.jsonl")
  lines = [json.loads(line) for line in open(scores_file)]
  by_candidate = {(line["question"], line["candidate"]): line for line in lines}

  mimi = mimi_release["transformers"]
  questions = read_questions(task, release)
  ours, expected, n_tokens = (np.zeros((len(questions), 2)) for _ in range(3))
  for q, question in enumerate(questions):
    for c, path in enumerate(question.candidate_audio_paths):
      wave = load_audio(path, SAMPLE_RATE)
      expected[q, c] = authors_loss(wave, mimi, model, tokenizer)
      line = by_candidate[(question.id, c)]
      frames = -(-min(len(wave), 20 * SAMPLE_RATE) // 1920)
      assert line["n_tokens"] == frames + 1  # each frame's first quantizer, and </audio>
      ours[q, c], n_tokens[q, c] = line["nll_sum"] / line["n_tokens"], line["n_tokens"]
  assert np.abs(ours - expected).max() < 1e-4
  accuracy = json.load(open(os.path.join(out, "metrics.json")))["runs"][0]["tasks"][task]["s2s_utterance"]["accuracy"]
  assert accuracy == pytest.approx(authors_accuracy(task, expected, n_tokens, questions), abs=1e-6)
  assert "| ckpt | S→S (utterance) |" in open(os.path.join(out, "table.md")).read()
