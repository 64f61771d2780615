"""The official spoken StoryCloze layout (slp-rl/SpokenStoryCloze: sSC/ and tSC/ of `<n>_<...>.wav`) read into the
pairs SlamKit's ModellingMetricDataset makes: sorted by the leading number, recordings 2i (right) and 2i+1
(wrong), each a whole story."""

import os

import numpy as np
import pytest
import soundfile

from s2sjax.data.spec import spec_from_dict
from tasks.audio.mel_kmeans import MelKmeansTokenizer
from tasks.encoders import QuestionEncoder
from tasks.release import ReleaseError, read_questions
from tasks.sample import MEL_KMEANS_CODEBOOK, RELEASE_DIR

read_pairs = read_questions  # the official layout is a release format like the others: spoken_pairs

# As upstream names them: each recording's own number (2i the right telling, 2i+1 the wrong), then any text.
NAMES = ["10_b41c.wav", "2_a17f.wav", "11_b41c.wav", "3_a17f.wav", "0_99e0.wav", "1_99e0.wav"]


def write_release(root, names=NAMES, folder="tSC"):
  (root / folder).mkdir(parents=True)
  rng = np.random.default_rng(0)
  for n, name in enumerate(names):
    soundfile.write(root / folder / name, rng.normal(0, 0.1, 8000 + 800 * n).astype(np.float32), 16000)
  return str(root)


def test_pairs_are_slamkits_sorted_by_number_then_two_by_two(tmp_path):
  questions = read_pairs("spoken_tstorycloze", write_release(tmp_path))
  # numbers 0, 1, 2, 3, 10, 11: not the text order (0, 1, 10, 11, 2, 3)
  assert [q.uttids for q in questions] == [("0_99e0", "1_99e0"), ("2_a17f", "3_a17f"), ("10_b41c", "11_b41c")]
  assert all(q.correct == 0 and q.audio_paths == ("", "") for q in questions)
  assert questions[0].candidate_audio_paths[0].endswith("tSC/0_99e0.wav")


def test_an_odd_count_or_a_name_without_its_number_is_refused_naming_it(tmp_path):
  with pytest.raises(ReleaseError, match=r"tSC holds 5 recordings: an odd count leaves 11_b41c.wav without"):
    read_pairs("spoken_tstorycloze", write_release(tmp_path / "odd", NAMES[1:]))
  with pytest.raises(ReleaseError, match=r"2_a\.wav and 2_b\.wav share the number 2"):
    read_pairs("spoken_tstorycloze", write_release(tmp_path / "twice", ["2_a.wav", "2_b.wav"]))
  with pytest.raises(ReleaseError, match=r"story_1\.wav: a SpokenStoryCloze recording is named <n>_<\.\.\.>\.wav"):
    read_pairs("spoken_tstorycloze", write_release(tmp_path / "bad", ["story_1.wav", "2_x.wav"]))
  with pytest.raises(ReleaseError, match="sSC does not exist: a SpokenStoryCloze task reads that folder"):
    read_pairs("spoken_sstorycloze", write_release(tmp_path / "topic"))


def test_each_recording_is_scored_whole_under_the_utterance_protocol(tmp_path):
  """bos, then the whole recording's units and eos: nothing of it is prefix, as SlamKit scores it."""
  question = read_pairs("spoken_tstorycloze", write_release(tmp_path))[0]
  spec = spec_from_dict({"name": "units", "audio_mode": "extended_vocab", "audio_tokenizer": {"type": "mel_kmeans"},
                         "codebook_sizes": [256], "unit_offset": 2, "text_vocabulary": False, "bos_id": 1})
  tokenizer = MelKmeansTokenizer(MEL_KMEANS_CODEBOOK)
  encoder = QuestionEncoder(spec, "s2s", None, tokenizer, protocol="utterance")
  prefix, _, _ = encoder.prefix(question, 0)
  candidate, seconds = encoder.candidate(question, 0)
  wave, _ = soundfile.read(question.candidate_audio_paths[0], dtype="float32")
  assert prefix.tolist() == [1] and seconds == pytest.approx(len(wave) / 16000)
  np.testing.assert_array_equal(candidate, np.concatenate([2 + tokenizer.encode(wave, "x")[:, 0], [1]]))


def unit_lm(root):
  """(a unit LM spec's YAML, a tiny qwen2 of its 258 ids as transformers runs it, that model converted): SlamKit's
  layout of the mel k-means units, bos = eos = 1, unit k at 2 + k."""
  import yaml

  from checkpoints_conversion.convert import convert
  from tests.hf_models import save_hf, tiny_model

  spec = root / "units.yaml"
  spec.write_text(yaml.safe_dump({"name": "units", "audio_mode": "extended_vocab", "codebook_sizes": [256],
                                  "audio_tokenizer": {"type": "mel_kmeans"}, "unit_offset": 2,
                                  "text_vocabulary": False, "bos_id": 1}))
  model = tiny_model("qwen2", vocab_size=258)
  ckpt = str(root / "unit_lm")
  convert(save_hf(model, str(root / "hf")), ckpt)
  return spec, model, ckpt


@pytest.mark.slow
def test_a_spoken_storycloze_folder_builds_scores_and_counts_ties_as_slamkit(tmp_path):
  """Built and scored as TWIST's and Moshi's numbers are: each recording whole, by a unit LM, SlamKit's mean NLL
  per recording (checked against a naive forward). Ties: SlamKit scores each recording alone, so a pair of
  identical recordings ties exactly there; the build lays identical candidates once, so they tie exactly here
  too: wrong under S2SBench's strict rule, half right under SlamKit's, and only that pair moves."""
  import shutil

  import torch

  from s2sjax.data import task_registry, metrics
  from s2sjax.scoring.checkpoints import checkpoint
  from s2sjax.data.builds import Variants
  from s2sjax.scoring.evaluator import Evaluator, ScoringOptions
  from s2sjax.data.metrics import summarize
  from s2sjax.data.task_data import load_task_data
  from tasks.preparation import prepare

  speech = os.path.join(RELEASE_DIR, "StoryCloze", "s-story-firstspeech")
  folder = tmp_path / "release" / "tSC"
  folder.mkdir(parents=True)
  for n, source in enumerate(["0.wav", "2.wav", "4.wav", "4.wav", "6.wav", "8.wav"]):  # the second pair: a tie
    shutil.copy(os.path.join(speech, source), folder / f"{n}_story{n // 2}.wav")
  spec, model, ckpt = unit_lm(tmp_path)
  utterance = Variants(protocol="utterance")
  with pytest.raises(ReleaseError, match="holds whole spoken stories.*--modality=s2s --protocol=utterance"):
    prepare("spoken_tstorycloze", str(spec), "s2t", 1024, str(tmp_path / "data"), manual_dir=str(tmp_path / "release"))
  prepare("spoken_tstorycloze", str(spec), "s2s", 1024, str(tmp_path / "data"), manual_dir=str(tmp_path / "release"),
          variants=utterance)
  td = load_task_data(str(tmp_path / "data"), "spoken_tstorycloze", "s2s", str(spec), 1024, utterance)
  scores = Evaluator(checkpoint.load_config(ckpt), [td], ScoringOptions(batch_size=2)).score(
      checkpoint.load_params(ckpt), td)

  tokenizer = MelKmeansTokenizer(MEL_KMEANS_CODEBOOK)
  for q, question in enumerate(read_questions("spoken_tstorycloze", str(tmp_path / "release"))):
    for c, path in enumerate(question.candidate_audio_paths):
      wave, _ = soundfile.read(path, dtype="float32")
      ids = [1] + (2 + tokenizer.encode(wave, "x")[:, 0]).tolist() + [1]
      with torch.no_grad():
        log_probs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
      naive = -float(sum(log_probs[j, ids[j + 1]] for j in range(len(ids) - 1))) / (len(ids) - 1)
      assert abs(scores.loss[q, c] - naive) < 1e-4

  assert scores.loss[1, 0] == scores.loss[1, 1]  # the same recording twice
  half = summarize({("spoken_tstorycloze", "s2s"): scores})["spoken_tstorycloze"]["s2s"]
  strict = metrics.task_metrics(task_registry.get("spoken_tstorycloze"), scores, "reference")
  assert task_registry.get("spoken_tstorycloze").ties == "half" and half["tie_rule"] == "half"
  assert half["ties"] == strict["ties"] == 1 and strict["tie_rule"] == "reference"
  assert half["accuracy"] - strict["accuracy"] == pytest.approx(0.5 / 3)
