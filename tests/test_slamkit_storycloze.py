"""SlamKit's StoryCloze layouts and arithmetic (slp-rl/slamkit 388b402): the multi-speaker folders of whole stories
(config/metric/ms_tsc.yaml, `subfolder: true`), the cross-modal stories (slamkit/metric/cross_modal_metric.py:
`<base>_{mutual,correct,incorrect}.{wav,txt}` in a speaker's folder), each read, built in every modality and scored
on tiny models; and the per-pair file in SlamKit's terms against its arithmetic on hand-set log-probs."""

import json
import os
import shutil

import numpy as np
import pytest
import soundfile

from s2sjax.data import metrics
from s2sjax.data.questions import QuestionScores
from s2sjax.data.spec import load_spec
from s2sjax.results.pair_items import pair_lines, slamkit_accuracy
from tasks.audio.mel_kmeans import MelKmeansTokenizer
from tasks.encoders import QuestionEncoder
from tasks.release import ReleaseError, read_questions
from tasks.sample import MEL_KMEANS_CODEBOOK, RELEASE_DIR
from tests.test_spoken_storycloze import write_release

STORIES = os.path.join(RELEASE_DIR, "StoryCloze")


def sample_lines() -> list[dict]:
  with open(os.path.join(STORIES, "sStory_s2t.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def write_cross_modal(root, speakers=("spk_a", "spk_b"), stories=2, folder="cross_ms_tSC") -> str:
  """SlamKit's cross-modal layout, `<folder>/<speaker>/<base>_{mutual,correct,incorrect}.{wav,txt}`, from the
  bundled sample's stories: story k's first half (its spoken prefix and text), its right ending (line 2k) and its
  wrong one (line 2k+1), each spoken by the sample's espeak-ng. Texts end in a newline, as a file written by
  `print` does: SlamKit strips it."""
  lines = sample_lines()
  k = 0
  for speaker in speakers:
    os.makedirs(os.path.join(root, folder, speaker))
    for _ in range(stories):
      right, wrong = lines[2 * k], lines[2 * k + 1]
      parts = {"mutual": (f"s-story-firstspeech/{2 * k}.wav", right["first"]),
               "correct": (f"s-story-lastspeech/{2 * k}.wav", right["last"]),
               "incorrect": (f"s-story-lastspeech/{2 * k + 1}.wav", wrong["last"])}
      for part, (wav, text) in parts.items():
        base = os.path.join(root, folder, speaker, f"{k}_{part}")
        shutil.copy(os.path.join(STORIES, wav), base + ".wav")
        with open(base + ".txt", "w", encoding="utf-8") as f:
          f.write(text + "\n")
      k += 1
  return str(root)


def write_multi_speaker(root, folder="ms_tSC") -> str:
  """SlamKit's multi-speaker layout (ms_tsc.yaml: `subfolder: true`): a folder per speaker of whole stories
  `<n>_<...>.wav`, numbered within it, 2i right and 2i+1 wrong."""
  speech = os.path.join(STORIES, "s-story-firstspeech")
  for speaker, names in (("spk_b", ["1_x.wav", "0_x.wav", "10_y.wav", "11_y.wav"]), ("spk_a", ["0_z.wav", "1_z.wav"])):
    os.makedirs(os.path.join(root, folder, speaker))
    for n, name in enumerate(names):
      shutil.copy(os.path.join(speech, f"{2 * n}.wav"), os.path.join(root, folder, speaker, name))
  return str(root)


def test_cross_modal_stories_are_read_as_slamkits_dataset_gives_them(tmp_path):
  """Each `<base>_correct.wav` a story (cross_modal_metric.py:18-23), its prompt `_mutual`, the endings `_correct`
  (the positive) and `_incorrect`, the text of each .txt stripped (:33-35); speakers' folders in name order."""
  release = write_cross_modal(tmp_path)
  questions = read_questions("cm_tstorycloze", release)
  lines = sample_lines()
  assert [q.id for q in questions] == ["spk_a/0", "spk_a/1", "spk_b/2", "spk_b/3"]
  assert [q.labels for q in questions] == [{"folder": "spk_a"}] * 2 + [{"folder": "spk_b"}] * 2
  for k, q in enumerate(questions):
    assert q.prefixes == (lines[2 * k]["first"],) * 2 and q.correct == 0
    assert q.candidates == (lines[2 * k]["last"], lines[2 * k + 1]["last"])
    assert q.uttids == (f"{q.id}_correct", f"{q.id}_incorrect")
    assert q.audio_paths[0].endswith(f"cross_ms_tSC/{q.id}_mutual.wav") and q.audio_paths[0] == q.audio_paths[1]
    assert [p[len(release):] for p in q.candidate_audio_paths] == [f"/cross_ms_tSC/{q.id}_correct.wav",
                                                                  f"/cross_ms_tSC/{q.id}_incorrect.wav"]


def test_multi_speaker_folders_pair_within_each_speaker_by_number(tmp_path):
  """modelling_metric.py:16-19: each subfolder's recordings sorted by their number, pairs 2i / 2i+1."""
  questions = read_questions("spoken_ms_tstorycloze", write_multi_speaker(tmp_path))
  assert [q.uttids for q in questions] == [("spk_a/0_z", "spk_a/1_z"), ("spk_b/0_x", "spk_b/1_x"),
                                           ("spk_b/10_y", "spk_b/11_y")]
  assert [q.id for q in questions] == ["0", "1", "2"]
  assert [q.labels for q in questions] == [{"folder": "spk_a"}, {"folder": "spk_b"}, {"folder": "spk_b"}]
  flat = read_questions("spoken_tstorycloze", write_release(tmp_path / "flat"))  # tSC/<n>_<...>.wav
  assert {q.labels["folder"] for q in flat} == {"tSC"}


@pytest.mark.parametrize("damage, message", [
  (lambda d: os.remove(d / "spk_b" / "3_incorrect.txt"), r"spk_b/3_incorrect\.txt is missing: every story"),
  (lambda d: shutil.copy(d / "spk_a" / "0_mutual.wav", d / "spk_a" / "9_incorrect.wav"),
   r"spk_a/9_incorrect\.wav: not one of a story's files"),
  (lambda d: shutil.copy(d / "spk_a" / "0_mutual.wav", d / "0_correct.wav"),
   r"cross_ms_tSC/0_correct\.wav: a story's file beside the folders \['spk_a', 'spk_b'\]"),
  (lambda d: (d / "spk_a" / "1_correct.txt").write_text(" \n"), r"spk_a/1_correct\.txt: empty text"),
])
def test_a_wrong_cross_modal_layout_is_one_line_naming_the_file(tmp_path, damage, message):
  folder = tmp_path / "cross_ms_tSC"
  write_cross_modal(tmp_path)
  damage(folder)
  with pytest.raises(ReleaseError, match=message) as error:
    read_questions("cm_tstorycloze", str(tmp_path))
  assert len(str(error.value).splitlines()) <= 2  # the file's line, and for a bad text the problem under it


def test_the_builds_fingerprint_holds_every_speakers_recordings_and_texts(tmp_path):
  """A build is reused only for the release it read: a speaker's recording or a story's text changed is another."""
  from tasks.release import source_fingerprint

  release = write_cross_modal(tmp_path)
  first = source_fingerprint("cm_tstorycloze", release)
  (tmp_path / "cross_ms_tSC" / "spk_b" / "2_correct.txt").write_text("Another ending.\n")
  second = source_fingerprint("cm_tstorycloze", release)
  folder = tmp_path / "cross_ms_tSC"
  shutil.copy(folder / "spk_a" / "0_mutual.wav", folder / "spk_b" / "3_correct.wav")
  assert len({first, second, source_fingerprint("cm_tstorycloze", release)}) == 3


def test_an_odd_speaker_folder_is_refused_naming_it(tmp_path):
  """SlamKit concatenates the speakers' recordings before pairing (modelling_metric.py:17-19), so an odd folder
  would pair one speaker's ending with another's story: refused."""
  write_multi_speaker(tmp_path)
  os.remove(tmp_path / "ms_tSC" / "spk_a" / "1_z.wav")
  with pytest.raises(ReleaseError, match=r"ms_tSC/spk_a holds 1 recordings: an odd count leaves 0_z\.wav"):
    read_questions("spoken_ms_tstorycloze", str(tmp_path))


def hand_scores(log_probs: list[tuple[list[float], list[float]]]) -> QuestionScores:
  """Scores of pairs whose tokens' log-probs are given (positive, negative): what the scorer sums."""
  nll = np.array([[-sum(p), -sum(n)] for p, n in log_probs])
  tokens = np.array([[len(p), len(n)] for p, n in log_probs])
  n = len(log_probs)
  names = tuple((f"{2 * q}_s", f"{2 * q + 1}_s") for q in range(n))  # a spoken_pairs question's: its stems
  return QuestionScores(tuple(map(str, range(n))), names, names, np.zeros(n, np.int64), nll, tokens)


def test_pair_lines_are_slamkits_arithmetic_on_the_same_log_probs():
  """SlamKit's log_likelihood is minus calc_nll (unit_lm.py:184-194): the mean of the scored tokens' NLL with
  mean_nll (its default), the sum without; res is 1 / 0.5 / 0 by `>`, `==`, `<` (modelling_metric.py:91-94) and
  the printed number their mean (:98-99). Pair 0: mean -7/6 vs -1.5 (right by the mean) but sum -3.5 vs -3.0
  (wrong by the sum); pair 1 the same tokens (a tie, half); pair 2 wrong by both."""
  scores = hand_scores([([-1.0, -2.0, -0.5], [-1.5, -1.5]),
                        ([-0.25, -0.75], [-0.25, -0.75]),
                        ([-2.0, -2.0], [-1.0, -1.0, -1.0])])
  by_mean = pair_lines(scores, scores.loss)
  assert [line["positive_log_likelihood"] for line in by_mean] == pytest.approx([-3.5 / 3, -0.5, -2.0])
  assert [line["negative_log_likelihood"] for line in by_mean] == pytest.approx([-1.5, -0.5, -1.0])
  assert [line["result"] for line in by_mean] == [1.0, 0.5, 0.0] and slamkit_accuracy(by_mean) == pytest.approx(0.5)
  by_sum = pair_lines(scores, scores.nll_sum)
  assert [line["positive_log_likelihood"] for line in by_sum] == pytest.approx([-3.5, -1.0, -4.0])
  assert [line["result"] for line in by_sum] == [0.0, 0.5, 0.0]
  assert (by_mean[0]["positive"], by_mean[0]["negative"], by_mean[0]["positive_tokens"]) == ("0_s.wav", "1_s.wav", 3)
  # the project's own metric under SlamKit's tie rule gives the number SlamKit prints
  half = metrics.summarize({("spoken_tstorycloze", "s2s_utterance"): scores})["spoken_tstorycloze"]["s2s_utterance"]
  assert half["accuracy"] == pytest.approx(slamkit_accuracy(by_mean))


def reference_losses(release: str, task: str, spec: str, modality: str, protocol: str, tokenizer, model) -> np.ndarray:
  """Each candidate's mean NLL [N, 2] by a plain transformers forward over the ids the encoder lays (prefix, then
  the candidate, whose tokens are the scored ones)."""
  import torch

  loaded = load_spec(spec)
  units = MelKmeansTokenizer(MEL_KMEANS_CODEBOOK, loaded.audio_tokenizer.get("dedup", False))
  encoder = QuestionEncoder(loaded, modality, tokenizer, units, protocol=protocol)
  questions = read_questions(task, release)
  losses = np.zeros((len(questions), 2))
  for q, question in enumerate(questions):
    for c in range(2):
      prefix, candidate = encoder.prefix(question, c)[0], encoder.candidate(question, c)[0]
      ids = np.concatenate([prefix, candidate]).astype(np.int64)
      with torch.no_grad():
        log_probs = torch.log_softmax(model(torch.from_numpy(ids)[None]).logits[0].float(), -1).numpy()
      targets = np.arange(len(prefix), len(ids))
      losses[q, c] = -log_probs[targets - 1, ids[targets]].mean()
  return losses


def evaluate(tmp_path, tasks, modalities, protocols, spec, release, ckpt, tokenizer_dir=None) -> str:
  from s2sjax.commands.eval import EvalConfig, run
  from s2sjax.data.builds import Variants
  from s2sjax.scoring.evaluator import ScoringOptions
  from tasks.preparation import prepare

  data, out = str(tmp_path / "data"), str(tmp_path / "out")
  for task in tasks:
    for modality in modalities:
      for protocol in protocols:
        prepare(task, spec, modality, 1024, data, manual_dir=release, variants=Variants(protocol=protocol),
                **({"tokenizer_dir": tokenizer_dir} if tokenizer_dir else {}))
  run(EvalConfig(tasks=tasks, modalities=modalities, protocols=protocols, checkpoints=ckpt, spec=spec,
                 data_dir=data, output_dir=out, row_length=1024, chunk_rows=2, scoring=ScoringOptions(batch_size=2)))
  return out


def read_losses(path: str) -> np.ndarray:
  lines = [json.loads(line) for line in open(path)]
  return np.array([line["nll_sum"] / line["n_tokens"] for line in lines]).reshape(-1, 2)


@pytest.mark.slow
def test_cross_modal_stories_score_in_every_modality_with_pairs_files_and_the_degradation_matrix(tmp_path):
  """The cross-modal layout built for a byte-level model (text as bytes, mel k-means unit k as id k) in T->T, S->T,
  T->S and S->S and scored by `s2sjax.eval`: each candidate's mean NLL is a transformers forward's over the same
  ids within 1e-4, each modality's pairs file is SlamKit's arithmetic on those scores, and metrics.json holds the
  degradation matrix of the four."""
  from transformers import AutoTokenizer

  from checkpoints_conversion.convert import convert
  from tests.hf_models import save_hf, tiny_model
  from tests.stack_fixtures import BYTES_SPEC, byte_tokenizer

  release = write_cross_modal(tmp_path / "release", speakers=("spk_a",), stories=3)
  spec = tmp_path / "bytes.yaml"
  spec.write_text(BYTES_SPEC)
  hf = str(tmp_path / "hf")
  model = tiny_model("qwen2", vocab_size=260)  # the 256 bytes, and room for the end token loading adds
  save_hf(model, hf)
  byte_tokenizer(hf)
  convert(hf, str(tmp_path / "ckpt"))
  everything = ("t2t", "s2t", "t2s", "s2s")
  out = evaluate(tmp_path, ("cm_tstorycloze",), everything, ("s2sbench",), str(spec), release, str(tmp_path / "ckpt"),
                 tokenizer_dir=hf)

  tokenizer = AutoTokenizer.from_pretrained(hf)
  run = json.load(open(os.path.join(out, "metrics.json")))["runs"][0]
  for modality in everything:
    scored = read_losses(os.path.join(out, "ckpt", f"cm_tstorycloze-{modality}.scores.jsonl"))
    expected = reference_losses(release, "cm_tstorycloze", str(spec), modality, "s2sbench", tokenizer, model)
    assert np.abs(scored - expected).max() < 1e-4, modality
    pairs = [json.loads(line) for line in open(os.path.join(out, "ckpt", f"cm_tstorycloze-{modality}.pairs.jsonl"))]
    assert [(p["positive"], p["negative"]) for p in pairs] == [(f"spk_a/{k}_correct.wav", f"spk_a/{k}_incorrect.wav")
                                                             for k in range(3)]
    assert [p["positive_log_likelihood"] for p in pairs] == pytest.approx(-expected[:, 0], abs=1e-4)
    assert run["tasks"]["cm_tstorycloze"][modality]["accuracy"] == pytest.approx(slamkit_accuracy(pairs))
  assert set(run["degradation"]["cm_tstorycloze"]) == {"s2t_vs_t2t", "t2s_vs_t2t", "s2s_vs_t2t", "s2s_vs_s2t"}


@pytest.mark.slow
def test_slamkits_speech_to_speech_scores_each_story_whole_as_its_unit_lm(tmp_path):
  """S->S as SlamKit scores it for a unit LM (`<S> units <S>`, unit_tokeniser.py:43-46; the mean NLL of every token
  after the first, unit_lm.py:184-194): the cross-modal story's prompt and ending one recording, their waves
  joined (cross_modal_metric.py:55-58), and the multi-speaker folders' whole stories; each within 1e-4 of a
  transformers forward, ties counted half (modelling_metric.py:93)."""
  from tests.test_spoken_storycloze import unit_lm

  release = write_cross_modal(tmp_path / "release", speakers=("spk_a",), stories=2)
  write_multi_speaker(tmp_path / "release")
  spec, model, ckpt = unit_lm(tmp_path)
  tasks = ("cm_tstorycloze", "spoken_ms_tstorycloze")
  out = evaluate(tmp_path, tasks, ("s2s",), ("utterance",), str(spec), release, ckpt)
  run = json.load(open(os.path.join(out, "metrics.json")))["runs"][0]
  for task in tasks:
    scored = read_losses(os.path.join(out, "unit_lm", f"{task}-s2s_utterance.scores.jsonl"))
    expected = reference_losses(release, task, str(spec), "s2s", "utterance", None, model)
    assert np.abs(scored - expected).max() < 1e-4, task
    pairs = [json.loads(line) for line in open(os.path.join(out, "unit_lm", f"{task}-s2s_utterance.pairs.jsonl"))]
    assert [p["result"] for p in pairs] == [1.0 if p < n else 0.5 if p == n else 0.0 for p, n in expected]
    assert run["tasks"][task]["s2s_utterance"]["tie_rule"] == "half"
    assert pairs[0]["labels"] == {"folder": "spk_a"}
  by_folder = run["tasks"]["spoken_ms_tstorycloze"]["s2s_utterance"]["by_folder"]
  assert list(by_folder) == ["spk_a", "spk_b"] and [v["n"] for v in by_folder.values()] == [1, 2]
  # the cross-modal story's candidate is its prompt and ending heard as one: units of the joined waves, then eos
  units = MelKmeansTokenizer(MEL_KMEANS_CODEBOOK)
  question = read_questions("cm_tstorycloze", release)[0]
  encoder = QuestionEncoder(load_spec(str(spec)), "s2s", None, units, protocol="utterance")
  wave = np.concatenate([soundfile.read(p, dtype="float32")[0] for p in (question.audio_paths[0],
                                                                       question.candidate_audio_paths[0])])
  assert encoder.prefix(question, 0)[0].tolist() == [1]
  joined = np.concatenate([2 + units.encode(wave, "x")[:, 0], [1]])
  np.testing.assert_array_equal(encoder.candidate(question, 0)[0], joined)


def test_hubert_units_with_slamkits_padding_are_transformers_on_the_padded_wave(tmp_path):
  """SlamKit's HuBERT extractor runs each recording with 40 zero samples on both sides (hubert_feature_extractor.py:
  42, `F.pad(wav, (40, 40))`); the spec's `pad: 40` does the same: the units are the nearest centroids of
  transformers' features of the padded wave, and the padding is in the tokenizer's identity (another build)."""
  import torch
  from transformers import HubertConfig, HubertModel

  from tasks.audio.hubert import HubertKmeansTokenizer

  torch.manual_seed(0)
  config = HubertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                        conv_dim=(16, 24, 16), conv_kernel=(10, 3, 2), conv_stride=(5, 2, 2),
                        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
  model = HubertModel(config).eval()
  model.save_pretrained(str(tmp_path / "hubert"), safe_serialization=True)
  wave = (0.3 * np.random.default_rng(1).standard_normal(1203)).astype(np.float32)
  with torch.no_grad():
    padded = torch.nn.functional.pad(torch.from_numpy(wave)[None], (40, 40))
    features = model(padded, output_hidden_states=True).hidden_states[2][0].numpy()
  centroids = features[np.random.default_rng(2).choice(len(features), 8, replace=False)] + 0.01
  np.save(tmp_path / "km.npy", centroids.astype(np.float32))
  settings = {"model_dir": "hubert", "centroids": "km.npy", "layer": 2, "dedup": False}
  where = lambda path: str(tmp_path / path)
  slamkit = HubertKmeansTokenizer.from_settings({**settings, "pad": 40}, where)
  distances = ((features[:, None].astype(np.float64) - centroids[None]) ** 2).sum(-1)
  np.testing.assert_array_equal(slamkit.encode(wave, "x")[:, 0], distances.argmin(-1))
  plain = HubertKmeansTokenizer.from_settings(settings, where)
  assert len(plain.encode(wave, "x")) < len(features)  # 80 more samples: 4 more frames of 20
  assert slamkit.identity()["pad"] == 40 and "pad" not in plain.identity()
