"""The official spoken StoryCloze layout (slp-rl/SpokenStoryCloze: sSC/ and tSC/ of `<n>_<...>.wav`) read into the
pairs SlamKit's ModellingMetricDataset makes: sorted by the leading number, recordings 2i (right) and 2i+1
(wrong), each a whole story."""

import numpy as np
import pytest
import soundfile

from s2sjax.spec import spec_from_dict
from tasks.audio.mel_kmeans import MelKmeansTokenizer
from tasks.encoders import QuestionEncoder
from tasks.release import ReleaseError
from tasks.sample import MEL_KMEANS_CODEBOOK
from tasks.spoken_storycloze import read_pairs

# As upstream names them: each recording's own number (2i the right telling, 2i+1 the wrong), then any text.
NAMES = ["10_b41c.wav", "2_a17f.wav", "11_b41c.wav", "3_a17f.wav", "0_99e0.wav", "1_99e0.wav"]


def write_release(root, names=NAMES, folder="tSC"):
  (root / folder).mkdir(parents=True)
  rng = np.random.default_rng(0)
  for n, name in enumerate(names):
    soundfile.write(root / folder / name, rng.normal(0, 0.1, 8000 + 800 * n).astype(np.float32), 16000)
  return str(root)


def test_pairs_are_slamkits_sorted_by_number_then_two_by_two(tmp_path):
  questions = read_pairs("tstorycloze", write_release(tmp_path))
  # numbers 0, 1, 2, 3, 10, 11: not the text order (0, 1, 10, 11, 2, 3)
  assert [q.uttids for q in questions] == [("0_99e0", "1_99e0"), ("2_a17f", "3_a17f"), ("10_b41c", "11_b41c")]
  assert all(q.correct == 0 and q.audio_paths == ("", "") for q in questions)
  assert questions[0].candidate_audio_paths[0].endswith("tSC/0_99e0.wav")


def test_an_odd_count_or_a_name_without_its_number_is_refused_naming_it(tmp_path):
  with pytest.raises(ReleaseError, match=r"tSC holds 5 recordings: an odd count leaves 11_b41c.wav without"):
    read_pairs("tstorycloze", write_release(tmp_path / "odd", NAMES[1:]))
  with pytest.raises(ReleaseError, match=r"2_a\.wav and 2_b\.wav share the number 2"):
    read_pairs("tstorycloze", write_release(tmp_path / "twice", ["2_a.wav", "2_b.wav"]))
  with pytest.raises(ReleaseError, match=r"story_1\.wav: a SpokenStoryCloze recording is named <n>_<\.\.\.>\.wav"):
    read_pairs("tstorycloze", write_release(tmp_path / "bad", ["story_1.wav", "2_x.wav"]))
  with pytest.raises(ReleaseError, match="has no sSC/ folder"):
    read_pairs("sstorycloze", write_release(tmp_path / "topic"))


def test_each_recording_is_scored_whole_under_the_utterance_protocol(tmp_path):
  """bos, then the whole recording's units and eos: nothing of it is prefix, as SlamKit scores it."""
  question = read_pairs("tstorycloze", write_release(tmp_path))[0]
  spec = spec_from_dict({"name": "units", "audio_mode": "extended_vocab", "audio_tokenizer": {"type": "mel_kmeans"},
                         "codebook_sizes": [256], "unit_offset": 2, "text_vocabulary": False, "bos_id": 1})
  tokenizer = MelKmeansTokenizer(MEL_KMEANS_CODEBOOK)
  encoder = QuestionEncoder(spec, "s2s", None, tokenizer, protocol="utterance")
  prefix, _, _ = encoder.prefix(question, 0)
  candidate, seconds = encoder.candidate(question, 0)
  wave, _ = soundfile.read(question.candidate_audio_paths[0], dtype="float32")
  assert prefix.tolist() == [1] and seconds == pytest.approx(len(wave) / 16000)
  np.testing.assert_array_equal(candidate, np.concatenate([2 + tokenizer.encode(wave, "x")[:, 0], [1]]))
