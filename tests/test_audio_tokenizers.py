"""Audio tokenizers on real speech (the bundled espeak-ng sample): shapes, ranges, dedup, errors."""

import os

import numpy as np
import pytest

from s2sjax.data import task_registry
from tasks import audio
from tasks.audio.base import AudioError, dedup, load_audio
from tasks.audio.mel_kmeans import MelKmeansTokenizer, fit_codebook, log_mel
from tasks.audio.precomputed import PrecomputedTokenizer
from tasks.sample import MEL_KMEANS_CODEBOOK, RELEASE_DIR

SPEECH = os.path.join(RELEASE_DIR, task_registry.get("sstorycloze").release_audio_dir, "0.wav")


def test_kmeans_recovers_separated_clusters():
  rng = np.random.default_rng(0)
  centers = rng.normal(0, 10, (4, 40))
  points = np.concatenate([c + rng.normal(0, 0.1, (50, 40)) for c in centers]).astype(np.float32)
  found = fit_codebook(points, clusters=4)
  distances = np.linalg.norm(found[:, None] - centers[None], axis=-1)
  assert sorted(distances.argmin(axis=1)) == [0, 1, 2, 3] and distances.min(axis=1).max() < 0.3  # centres ~80 apart; sample-mean noise ~0.09


def test_mel_kmeans_codes_real_speech_at_50_frames_per_second():
  wave = load_audio(SPEECH, 16000)
  codes = MelKmeansTokenizer(MEL_KMEANS_CODEBOOK).encode(wave, "0")
  assert codes.shape == (len(log_mel(wave)), 1) and abs(len(codes) - len(wave) / 320) <= 2
  assert codes.min() >= 0 and codes.max() < 256 and len(np.unique(codes)) > 20  # speech uses many units
  deduped = MelKmeansTokenizer(MEL_KMEANS_CODEBOOK, deduplicate=True).encode(wave, "0")
  runs = [int(c) for i, c in enumerate(codes[:, 0]) if i == 0 or c != codes[i - 1, 0]]  # each run kept once
  assert deduped[:, 0].tolist() == runs and len(deduped) < len(codes)


def test_dedup_keeps_the_first_of_each_run_of_equal_frames():
  frames = np.array([[3, 1], [3, 1], [3, 2], [7, 2], [7, 2], [7, 2], [3, 1]])
  np.testing.assert_array_equal(dedup(frames), [[3, 1], [3, 2], [7, 2], [3, 1]])


def test_hubert_kmeans_on_real_speech(tmp_path):
  import torch
  from transformers import HubertConfig, HubertModel

  torch.manual_seed(0)
  config = HubertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        conv_dim=(16,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)
  HubertModel(config).save_pretrained(str(tmp_path / "hubert"))
  np.save(tmp_path / "km.npy", np.random.default_rng(0).normal(size=(50, 32)).astype(np.float32))
  tokenizer = audio.from_spec({"type": "hubert_kmeans", "model_dir": "hubert", "centroids": "km.npy", "layer": 2,
                               "dedup": False}, (50,), str(tmp_path))
  wave = load_audio(SPEECH, 16000)
  codes = tokenizer.encode(wave, "0")
  assert codes.shape[1] == 1 and abs(len(codes) - len(wave) / 320) <= 2  # HuBERT: 20 ms frames
  assert 0 <= codes.min() and codes.max() < 50
  with pytest.raises(ValueError, match=r"the hubert_kmeans tokenizer makes codebooks \(50,\), the spec says \(500,\)"):
    audio.from_spec({"type": "hubert_kmeans", "model_dir": "hubert", "centroids": "km.npy", "layer": 2}, (500,),
                    str(tmp_path))


def test_mimi_on_real_speech(tmp_path):
  import torch
  from transformers import MimiConfig, MimiModel

  torch.manual_seed(0)
  config = MimiConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                      intermediate_size=64, codebook_size=64, num_quantizers=4, num_semantic_quantizers=1,
                      codebook_dim=16, vector_quantization_hidden_dimension=16, num_filters=4, upsample_groups=32,
                      sliding_window=50)
  MimiModel(config).save_pretrained(str(tmp_path / "mimi"))
  tokenizer = audio.from_spec({"type": "mimi", "model_dir": "mimi", "codebooks": 4}, (64,) * 4, str(tmp_path))
  wave = load_audio(SPEECH, tokenizer.sample_rate)
  codes = tokenizer.encode(wave, "0")
  assert codes.shape[1] == 4 and abs(len(codes) - len(wave) / tokenizer.sample_rate * 12.5) <= 2
  assert codes.min() >= 0 and codes.max() < 64


def test_precomputed_codes_are_checked(tmp_path):
  np.save(tmp_path / "7.npy", np.array([[1, 2], [3, 1]]))
  np.save(tmp_path / "8.npy", np.array([[1, 9]]))
  tokenizer = PrecomputedTokenizer(str(tmp_path), (4, 4))
  np.testing.assert_array_equal(tokenizer.encode(None, "7"), [[1, 2], [3, 1]])
  with pytest.raises(AudioError, match=r"uttid 9: precomputed codes .*9\.npy do not exist"):
    tokenizer.encode(None, "9")
  with pytest.raises(AudioError, match=r"uttid 8: .* codes outside the codebook sizes \(4, 4\)"):
    tokenizer.encode(None, "8")


def test_cut_empty_stereo_and_resampled_wavs(tmp_path):
  """A copy cut short is refused naming the file (libsndfile would read the half that is there); an empty file
  likewise; a stereo or 22.05 kHz file is mixed down and resampled, each counted for the build report."""
  import collections

  import soundfile

  wave = np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32)
  soundfile.write(tmp_path / "whole.wav", wave, 16000, subtype="FLOAT")
  np.testing.assert_array_equal(load_audio(str(tmp_path / "whole.wav"), 16000), wave)
  data = (tmp_path / "whole.wav").read_bytes()
  (tmp_path / "cut.wav").write_bytes(data[: len(data) // 2])
  with pytest.raises(AudioError, match=r"cut\.wav is cut: its header promises 64000 bytes of samples, the file holds"):
    load_audio(str(tmp_path / "cut.wav"), 16000)
  (tmp_path / "empty.wav").write_bytes(b"")
  with pytest.raises(AudioError, match=r"empty\.wav is empty"):
    load_audio(str(tmp_path / "empty.wav"), 16000)
  soundfile.write(tmp_path / "stereo.wav", np.stack([wave, -wave / 2], 1), 22050)
  counts = collections.Counter()
  mixed = load_audio(str(tmp_path / "stereo.wav"), 16000, counts)
  assert counts == {"mixed_down": 1, "resampled": 1, "resampled 22050->16000": 1} and abs(len(mixed) - 16000 * 16000 / 22050) <= 1
