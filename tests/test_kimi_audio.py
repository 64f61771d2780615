"""Kimi-Audio held to its own code: ../shared/upstream-oracles/kimi_audio is a tiny release in Kimi-Audio's layout
with what MoonshotAI/Kimi-Audio 349251e computed from it (its PROVENANCE.txt). The layout gives upstream's two id
streams and continuous mask exactly; the JAX Whisper features are upstream's at every stage; the converted
release's text- and audio-head log-probs at every position, and each candidate's NLL, are upstream's within 1e-4
from its saved Whisper features and within 2e-4 from its waves (where a few mel entries round to the other bf16
neighbour); the packed-row step scores the candidates, their prefix shared, as upstream does one by one."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from checkpoints_conversion import convert, safetensors_io
from s2sjax import checkpoint
from s2sjax.architectures import kimi_audio
from s2sjax.model import kimi_audio as network
from s2sjax.model.config import ConfigError
from s2sjax.packing import RowShape
from tasks import kimi_prompt
from tasks.audio import kimi_whisper

ORACLE = Path(__file__).resolve().parents[1].parent / "shared" / "upstream-oracles" / "kimi_audio"
pytestmark = pytest.mark.skipif(not ORACLE.is_dir(), reason="the Kimi-Audio oracle (../shared/upstream-oracles/"
                                                            "kimi_audio) is not beside this checkout")
FROM_FEATURES = 1e-4  # fp32 against upstream's float64 run, fed its saved Whisper features
FROM_WAVES = 2e-4  # the same from the waves: 2 and 5 mel entries round to the other bf16 value (PROVENANCE.txt)
# example -> (its text message: the instruction before the audio, or the text prefix; its wave's index or None)
EXAMPLES = {"a2t_w0": ("prompt_a2t_w0", 0), "a2t_w1": (None, 1), "t2t": ("prompt_t2t", None)}
SEQUENCES = [f"{example}_c{c}" for example in EXAMPLES for c in (0, 1)]


def oracle(name: str) -> np.ndarray:
  return np.load(ORACLE / f"{name}.npy")


@pytest.fixture(scope="module")
def meta():
  return json.loads((ORACLE / "meta.json").read_text())


# The layout's ids by upstream's ExtraTokens names, as meta.json lists the tiny tokenizer's.
EXTRA_TOKENS = {"msg_end": "msg_end", "media_begin": "media_begin", "media_end": "media_end",
                "text_blank": "kimia_text_blank", "text_eos": "kimia_text_eos", "user_start": "kimia_user_msg_start",
                "assistant_start": "kimia_assistant_msg_start", "speech_ct": "kimia_speech_ct_id",
                "speech_ctd": "kimia_speech_ctd_id"}


@pytest.fixture(scope="module")
def special(meta):
  """The tiny tokenizer's special ids, looked up by the token names upstream's special_tokens.py uses."""
  ids = meta["special_token_ids_tiny"]
  by_token = {kimi_prompt.TOKEN_NAMES[field]: ids[name] for field, name in EXTRA_TOKENS.items()}
  return kimi_prompt.KimiSpecialIds.from_tokens(by_token.__getitem__)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """The oracle release converted as a user converts it: no flags."""
  out = tmp_path_factory.mktemp("kimi") / "ckpt"
  manifest = convert.convert(str(ORACLE / "model"), str(out))
  return out, manifest


@pytest.fixture(scope="module")
def model(converted):
  out, _ = converted
  return checkpoint.load_config(out), checkpoint.load_params(out, dtype=np.float32)


def request(example: str, candidate: int, special, config) -> tuple[kimi_prompt.KimiStreams, int]:
  """(prefix + candidate rows, prefix length) of an oracle sequence, laid by the project's layout."""
  instruction, wave = EXAMPLES[example]
  prefix = ({"codes": oracle(f"inputs/codes_wave{wave}")} if wave is not None else
            {"text": oracle(f"inputs/text_ids_{instruction}")})
  if wave is not None and instruction:
    prefix["instruction"] = oracle(f"inputs/text_ids_{instruction}")
  return kimi_prompt.lay_request(oracle(f"inputs/text_ids_cand_{example}_{candidate}"), special, config.token_offset,
                                 config.audio_codes, **prefix)


def features_of(streams, example: str, waves: dict | None = None) -> np.ndarray | None:
  """The sequence's feature rows: the oracle's saved continuous features, or ours from its wave."""
  wave = EXAMPLES[example][1]
  if wave is None:
    return None
  track = waves[wave] if waves else oracle(f"outputs/whisper_wave{wave}_continuous_feature")
  return kimi_prompt.lay_features(streams, track)


def test_config_reads_the_release_and_refuses_what_it_does_not_implement(meta):
  """The code range and offset come from config.json (scaled to 1,024 codes at offset 256 in the oracle); switches
  the port lacks and keys it does not know are refused by name."""
  release = meta["config_json"]
  config = kimi_audio.parse_config(release)
  assert (config.token_offset, config.audio_codes, config.vocab_size) == (256, 1024, 1280)
  assert (config.mimo_layers, config.mimo_from_layer, config.adaptor_input_dim) == (2, 1, 128)
  assert (config.media_begin, config.media_end) == (213, 215)
  for change, words in (({"tie_word_embeddings": True}, "tie_word_embeddings=True is not supported"),
                        ({"kimia_mimo_transformer_from_layer_index": 4}, "starts from main layer 4"),
                        ({"speculative_heads": 2}, "unknown config.json key 'speculative_heads'"),
                        ({"hidden_act": "gelu"}, "hidden_act='gelu'")):
    with pytest.raises(ConfigError, match=words):
      kimi_audio.parse_config(dict(release, **change))
  assert network.KimiAudioConfig.from_json(config.to_json()) == config
  leaves = jax.tree.leaves(network.abstract_params(config))
  assert config.num_params() == sum(int(np.prod(leaf.shape)) for leaf in leaves)
  assert {key for key in meta["llm_state_dict_keys"]} == {p.key for r in kimi_audio.rules(config) for p in r.pieces}


def test_layout_reproduces_upstreams_streams_exactly(special, meta):
  """Audio in after a text instruction, audio alone, text alone: both id streams and the continuous mask of every
  sequence (prefix + candidate) are prompt_manager.py's, id for id."""
  config = kimi_audio.parse_config(meta["config_json"])
  special.check_config(config.media_begin, config.media_end)
  for sequence in SEQUENCES:
    streams, prefix = request(sequence[:-3], int(sequence[-1]), special, config)
    assert prefix == meta["layouts"][sequence[:-3]]["prefix_len_P"]
    np.testing.assert_array_equal(streams.audio, oracle(f"outputs/{sequence}_audio_stream_ids"))
    np.testing.assert_array_equal(streams.text, oracle(f"outputs/{sequence}_text_stream_ids"))
    np.testing.assert_array_equal(streams.continuous, oracle(f"outputs/{sequence}_is_continuous_mask"))


def test_layout_refuses_what_upstream_cannot_run(special):
  codes = kimi_prompt.Message("user", codes=[1, 2])
  with pytest.raises(kimi_prompt.KimiPromptError, match="one audio message per sequence"):
    kimi_prompt.lay_prompt([codes, codes], special, 256, 1024)
  with pytest.raises(kimi_prompt.KimiPromptError, match="outside the model's 1024"):
    kimi_prompt.lay_prompt([kimi_prompt.Message("user", codes=[1024])], special, 256, 1024)


@pytest.mark.slow
def test_whisper_features_match_every_upstream_stage(meta):
  """The log-mel of the padded wave (upstream's float32 STFT against ours in float64), then from upstream's own mel
  rounded to bf16 the encoder's layer-0 input, every layer's output and the last hidden state; and the continuous
  feature from the wave (2 and 5 mel entries round to the other bf16 neighbour)."""
  whisper = kimi_whisper.KimiWhisperFeatures(str(ORACLE / "model" / "whisper-large-v3"))
  waves = [oracle(f"inputs/wave{i}") for i in range(2)]
  features = whisper.features(waves)
  for i, wave in enumerate(waves):
    reference_mel = oracle(f"outputs/whisper_wave{i}_logmel")
    padded = np.zeros(kimi_whisper.WINDOW_SAMPLES, np.float32)
    padded[: len(wave)] = wave
    ours = kimi_whisper.whisper.whisper_log_mel(padded)
    kept, pad_value = reference_mel.shape[1], meta["whisper"][f"wave{i}"]["mel_pad_value"]
    assert np.abs(ours[:, :kept] - reference_mel).max() < 5e-5
    assert np.abs(ours[:, kept:] - pad_value).max() < 1e-6
    mel = np.full((ours.shape[1], ours.shape[0]), pad_value, np.float32)
    mel[:kept] = reference_mel.T
    stages = whisper.intermediates(kimi_whisper.round_to_bf16(mel))
    rows = 4 * meta["whisper"][f"wave{i}"]["token_len_T"]
    for ours_name, theirs in (("layer0_input", "enc_layer0_input"), ("layer0_output", "enc_layer0_output"),
                              ("layer1_output", "enc_layer1_output"), ("last_hidden", "enc_last_hidden")):
      assert np.abs(stages[ours_name][:rows] - oracle(f"outputs/whisper_wave{i}_{theirs}")).max() < 1e-5, ours_name
    reference = oracle(f"outputs/whisper_wave{i}_continuous_feature")
    assert features[i].shape == reference.shape and np.abs(features[i] - reference).max() < 1e-4


@pytest.mark.slow
def test_audio_past_30_seconds_is_encoded_in_30_second_pieces():
  """whisper.py:184-221: each 30 s piece is padded and encoded alone, and the pieces' features are concatenated (T
  per piece, (samples - 1) // 1280 + 1), whatever else shares the batch."""
  whisper = kimi_whisper.KimiWhisperFeatures(str(ORACLE / "model" / "whisper-large-v3"), batch_size=2)
  wave = np.random.default_rng(0).normal(scale=0.1, size=kimi_whisper.WINDOW_SAMPLES + 20800).astype(np.float32)
  short = oracle("inputs/wave1")
  joined, alone = whisper.features([wave, short]), whisper.features([wave[: kimi_whisper.WINDOW_SAMPLES],
                                                                     wave[kimi_whisper.WINDOW_SAMPLES :]])
  assert [len(f) for f in joined] == [375 + 17, 23] and len(alone[0]) == 375
  np.testing.assert_allclose(joined[0], np.concatenate(alone), rtol=0, atol=1e-6)
  np.testing.assert_allclose(joined[1], whisper.features([short])[0], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_converted_release_gives_upstreams_log_probs_and_nlls(converted, model, special):
  """Every position's text- and audio-head log-softmax of all six sequences, from the saved Whisper features, and
  each candidate's mean NLL over its tokens (text head rows P-1 .. P+n-2)."""
  _, manifest = converted
  assert manifest["source_model_type"] == kimi_audio.NAME and "left in the release folder" in manifest["whisper_encoder"]
  config, params = model
  nlls = json.loads((ORACLE / "outputs" / "nll_per_candidate.json").read_text())
  for sequence in SEQUENCES:
    streams, prefix = request(sequence[:-3], int(sequence[-1]), special, config)
    text, audio = network.sequence_log_probs(config, params, streams.audio, streams.text,
                                             features_of(streams, sequence[:-3]), streams.continuous)
    assert np.abs(text - oracle(f"outputs/{sequence}_text_head_logprobs")).max() < FROM_FEATURES
    assert np.abs(audio - oracle(f"outputs/{sequence}_audio_head_logprobs")).max() < FROM_FEATURES
    candidate = streams.text[prefix:]
    nll = -text[np.arange(prefix - 1, len(streams) - 1), candidate].mean()
    assert abs(nll - nlls[sequence]["nll_mean"]) < FROM_FEATURES


def test_embeddings_mix_the_whisper_features_as_upstream(model, special):
  """The adaptor's output at every row and the first layer's input ((embed(audio) + adaptor) * sqrt(2) at the code
  rows, embed(audio) elsewhere, embed(text) added everywhere) of both audio examples and the text one."""
  config, params = model
  for example in EXAMPLES:
    streams, _ = request(example, 0, special, config)
    features = features_of(streams, example)
    embedded = network.embed_inputs(config, params, streams.audio[None], streams.text[None],
                                    None if features is None else features[None], streams.continuous[None])
    assert np.abs(np.asarray(embedded)[0] - oracle(f"outputs/{example}_c0_inputs_embeds")).max() < 1e-5
    if features is not None:
      adapted = network.adaptor(config, params, oracle(f"outputs/{example}_c0_vq_adaptor_input"))
      assert np.abs(np.asarray(adapted) - oracle(f"outputs/{example}_c0_vq_adaptor_output")).max() < 1e-5


@pytest.mark.slow
def test_log_probs_from_the_waves(model, special):
  """The whole path from the 16 kHz waves: JAX Whisper features, the layout, the converted model."""
  config, params = model
  whisper = kimi_whisper.KimiWhisperFeatures(str(ORACLE / "model" / "whisper-large-v3"))
  waves = dict(enumerate(whisper.features([oracle(f"inputs/wave{i}") for i in range(2)])))
  for sequence in SEQUENCES:
    streams, _ = request(sequence[:-3], int(sequence[-1]), special, config)
    text, audio = network.sequence_log_probs(config, params, streams.audio, streams.text,
                                             features_of(streams, sequence[:-3], waves), streams.continuous)
    assert np.abs(text - oracle(f"outputs/{sequence}_text_head_logprobs")).max() < FROM_WAVES
    assert np.abs(audio - oracle(f"outputs/{sequence}_audio_head_logprobs")).max() < FROM_WAVES


def packed_row(config, special, length: int, examples=tuple(EXAMPLES)) -> tuple[dict, dict]:
  """The examples in one row, each prefix laid once with its two candidates branching from it (a candidate's last
  token only in the target table), item after item; and {sequence: slot}. Rows without audio carry no features."""
  fields = {name: np.zeros(length, np.int32) for name in ("audio_tokens", "text_tokens", "continuous",
                                                           "segment_ids", "branch_ids", "positions")}
  features = np.zeros((length, config.adaptor_input_dim), np.float32)
  targets, slots, cursor = [], {}, 0
  for item, example in enumerate(examples):
    for c in (0, 1):
      streams, prefix = request(example, c, special, config)
      prefix_rows = np.arange(prefix) if c == 0 else np.arange(0)
      laid = np.concatenate([prefix_rows, np.arange(prefix, len(streams) - 1)])  # the prefix once, then this candidate
      where = cursor + np.arange(len(laid))
      for name, values in (("audio_tokens", streams.audio), ("text_tokens", streams.text),
                           ("continuous", streams.continuous)):
        fields[name][where] = values[laid]
      fields["segment_ids"][where] = item + 1
      fields["branch_ids"][where] = np.where(laid < prefix, 0, c + 1)
      fields["positions"][where] = laid
      feature_rows = features_of(streams, example)
      if feature_rows is not None:
        features[where] = feature_rows[laid]
      if c == 0:
        last_prefix_row = cursor + prefix - 1
      predictors = np.concatenate([[last_prefix_row], where[len(prefix_rows):]])
      slots[f"{example}_c{c}"] = len(slots)
      targets += [(pos, token, slots[f"{example}_c{c}"]) for pos, token in zip(predictors, streams.text[prefix:])]
      cursor += len(laid)
  shape_targets = 64
  table = np.array(targets + [(0, 0, -1)] * (shape_targets - len(targets)), np.int32)
  rows = {name: values[None] for name, values in fields.items()}
  rows.update(target_pos=table[None, :, 0], target_ids=table[None, :, 1], target_slot=table[None, :, 2],
              target_head=np.zeros((1, shape_targets), np.int32),
              slot_item=np.array([[i // 2 if i < len(slots) else -1 for i in range(8)]], np.int32),
              slot_candidate=np.array([[i % 2 if i < len(slots) else -1 for i in range(8)]], np.int32))
  if fields["continuous"].any():
    rows["features"] = features[None]
  return rows, slots


@pytest.mark.slow
def test_packed_scoring_shares_each_prefix_and_gives_upstreams_nlls(model, special):
  """The scoring step over one packed row (three items, each prefix laid once, its candidates branching, item-local
  attention) gives each candidate upstream's summed NLL; the step without the audio branch gives the same, and so
  does the step for text rows without a feature track."""
  config, params = model
  rows, slots = packed_row(config, special, 128)
  nlls = json.loads((ORACLE / "outputs" / "nll_per_candidate.json").read_text())
  shape = RowShape(length=128, max_targets=64, max_slots=8, max_item=64)
  text_rows, text_slots = packed_row(config, special, 128, examples=("t2t",))
  for rows, slots, features, audio_head in ((rows, slots, True, True), (rows, slots, True, False),
                                            (text_rows, text_slots, False, False)):
    scorer = kimi_audio.KimiScorer(config, shape, batch_size=1, audio_head=audio_head, features=features)
    nll_sum, n_tokens = scorer.score(params, rows, progress=False)
    for sequence, slot in slots.items():
      assert n_tokens[0, slot] == nlls[sequence]["n_tokens"]
      assert abs(nll_sum[0, slot] - nlls[sequence]["nll_sum"]) < FROM_FEATURES * n_tokens[0, slot]


def test_converter_lists_every_missing_and_unexpected_tensor(tmp_path):
  """A release with a tensor gone and one no rule reads is refused before anything is written, naming both."""
  source = safetensors_io.SafetensorsFile(str(ORACLE / "model" / "model.safetensors"))
  tensors = {key: source.read(key) for key in source.keys() if key != "model.mimo_norm.weight"}
  tensors["model.extra_head.weight"] = np.zeros((2, 2), np.float32)
  release = tmp_path / "release"
  release.mkdir()
  (release / "config.json").write_text((ORACLE / "model" / "config.json").read_text())
  safetensors_io.write(str(release / "model.safetensors"), tensors)
  with pytest.raises(convert.ConversionError) as error:
    convert.convert(str(release), str(tmp_path / "out"))
  assert "missing key model.mimo_norm.weight (for mimo_norm/scale)" in str(error.value)
  assert "model.extra_head.weight" in str(error.value)
  assert not (tmp_path / "out").exists()
