"""Kimi-Audio held to its own code: ../shared/upstream-oracles/kimi_audio is a tiny release in Kimi-Audio's layout
with what MoonshotAI/Kimi-Audio 349251e computed from it (its PROVENANCE.txt). The layout gives upstream's two id
streams and continuous mask exactly; the JAX Whisper features are upstream's at every stage; the converted
release's text- and audio-head log-probs at every position (`s2sjax.logprobs`), and each candidate's NLL, are
upstream's within 1e-4 from its saved Whisper features and within 2e-4 from its waves (where a few mel entries
round to the other bf16 neighbour). Through the data side: S2SBench questions holding the oracle's waves and texts
are built (`kimi_audio` spec, codes and Whisper features per recording) into rows equal to upstream's requests, and
s2sjax.eval scores them as upstream does, their prefixes shared in packed rows; a build of the bundled sample
imports no torch."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from checkpoints_conversion import convert, safetensors_io
from s2sjax.scoring import log_probs
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.data.spec import SPECS_DIR
from s2sjax.scoring.architectures import kimi_audio
from s2sjax.model import kimi_audio as network
from s2sjax.model.config import ConfigError
from s2sjax.scoring.sequence_inputs import LogProbsError
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
  assert (special.media_begin, special.media_end) == (config.media_begin, config.media_end)
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


def streams_of(example: str, candidate: int, special, config) -> np.ndarray:
  """[2, T]: the audio stream over the text stream, as `s2sjax.logprobs` takes a Kimi-Audio request."""
  streams, _ = request(example, candidate, special, config)
  return np.stack([streams.audio, streams.text])


@pytest.mark.slow
def test_converted_release_gives_upstreams_log_probs_and_nlls(converted, special, meta):
  """`s2sjax.logprobs` on the converted release, in a process that imports no plugin: every position's text- and
  audio-head log-softmax of all six sequences, from the saved Whisper features, and each candidate's mean NLL over
  its tokens (text head rows P-1 .. P+n-2)."""
  ckpt, manifest = converted
  assert manifest["source_model_type"] == kimi_audio.NAME and "left in the release folder" in manifest["whisper_encoder"]
  config = checkpoint.load_config(ckpt)
  nlls = json.loads((ORACLE / "outputs" / "nll_per_candidate.json").read_text())
  for sequence in SEQUENCES:
    example, c = sequence[:-3], int(sequence[-1])
    wave = EXAMPLES[example][1]
    saved = None if wave is None else oracle(f"outputs/whisper_wave{wave}_continuous_feature")
    out = log_probs.compute(str(ckpt), streams_of(example, c, special, config), features=saved)
    assert np.abs(out.text - oracle(f"outputs/{sequence}_text_head_logprobs")).max() < FROM_FEATURES
    assert np.abs(out.codebooks - oracle(f"outputs/{sequence}_audio_head_logprobs")).max() < FROM_FEATURES
    prefix = meta["layouts"][example]["prefix_len_P"]
    candidate = oracle(f"inputs/text_ids_cand_{example}_{c}")
    nll = -out.text[np.arange(prefix - 1, prefix - 1 + len(candidate)), candidate].mean()
    assert abs(nll - nlls[sequence]["nll_mean"]) < FROM_FEATURES


@pytest.mark.slow
def test_the_command_line_reads_a_converted_checkpoint_in_a_fresh_process(converted, special, tmp_path):
  """`python -m s2sjax.logprobs` with no plugin named: the architecture registers with the package."""
  import os
  import subprocess
  import sys

  ckpt, _ = converted
  np.save(tmp_path / "ids.npy", streams_of("a2t_w0", 1, special, checkpoint.load_config(ckpt)))
  np.save(tmp_path / "features.npy", oracle("outputs/whisper_wave0_continuous_feature"))
  env = {key: value for key, value in os.environ.items() if key != "S2SJAX_PLUGINS"}
  root = Path(__file__).resolve().parents[1]
  subprocess.run([sys.executable, "-m", "s2sjax.logprobs", f"--checkpoint={ckpt}",
                  f"--input_ids={tmp_path / 'ids.npy'}", f"--features={tmp_path / 'features.npy'}",
                  f"--output={tmp_path / 'text.npy'}", f"--codebook_output={tmp_path / 'audio.npy'}"],
                 check=True, cwd=root, env=dict(env, PYTHONPATH=str(root)), capture_output=True, timeout=600)
  for head in ("text", "audio"):
    expected = oracle(f"outputs/a2t_w0_c1_{head}_head_logprobs")
    assert np.abs(np.load(tmp_path / f"{head}.npy") - expected).max() < FROM_FEATURES


def test_log_probs_refuse_what_the_model_cannot_read(converted, special):
  """The hook's inputs named when wrong: one stream, features without an audio message, a message without its
  features, codebook codes."""
  ckpt, _ = converted
  config = checkpoint.load_config(ckpt)
  audio = streams_of("a2t_w1", 0, special, config)
  text = streams_of("t2t", 0, special, config)
  features = oracle("outputs/whisper_wave1_continuous_feature")
  for ids, kwargs, words in (
      (audio[1], {"features": features}, r"input_ids \[2, T\]"),
      (text, {"features": features}, "no audio message"),
      (audio, {}, r"pass its Whisper features as --features \[23, 128\]"),
      (audio, {"features": features[:5]}, r"features must be \[N >= 23, 128\]"),
      (audio, {"features": features, "audio_codes": np.zeros((3, 1), np.int64)}, "--audio_codes does not apply")):
    with pytest.raises(LogProbsError, match=words):
      log_probs.compute(str(ckpt), ids, **kwargs)


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
def test_log_probs_from_the_waves(converted, special):
  """The whole path from the 16 kHz waves: JAX Whisper features, the layout, the converted model."""
  ckpt, _ = converted
  config = checkpoint.load_config(ckpt)
  whisper = kimi_whisper.KimiWhisperFeatures(str(ORACLE / "model" / "whisper-large-v3"))
  features = whisper.features([oracle(f"inputs/wave{i}") for i in range(2)])
  for sequence in SEQUENCES:
    example, c = sequence[:-3], int(sequence[-1])
    wave = EXAMPLES[example][1]
    out = log_probs.compute(str(ckpt), streams_of(example, c, special, config),
                           features=None if wave is None else features[wave])
    assert np.abs(out.text - oracle(f"outputs/{sequence}_text_head_logprobs")).max() < FROM_WAVES
    assert np.abs(out.codebooks - oracle(f"outputs/{sequence}_audio_head_logprobs")).max() < FROM_WAVES


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


# ---- the data side: S2SBench questions built into Kimi-Audio rows and scored -----------------------------------------

TEXT_IDS = 200  # the tiny tokenizer's ordinary ids 1..199 (num_base_tokens); its special tokens follow


def word(ids) -> str:
  """Oracle text ids as the words the tiny tokenizer maps back to them."""
  return " ".join(f"t{int(i)}" for i in ids)


def tiny_tokenizer(folder: Path, meta: dict) -> str:
  """The oracle's stand-in text tokenizer as a tokenizer folder: word `t<i>` is id i, and the special tokens of the
  layout at the oracle's tiny ids (PROVENANCE.txt's table), the rest of its 256 ids reserved."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  named = meta["special_token_ids_tiny"]
  vocab = {"<unk>": 0, **{f"t{i}": i for i in range(1, TEXT_IDS)}}
  vocab.update({kimi_prompt.TOKEN_NAMES[field]: named[name] for field, name in EXTRA_TOKENS.items()})
  vocab.update({f"<|reserved_{i}|>": i for i in range(TEXT_IDS, 256) if i not in vocab.values()})
  core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>").save_pretrained(str(folder))
  return str(folder)


# story -> (prefix wave, the example whose candidates it holds): a StoryCloze pair per oracle request
STORIES = ((0, "a2t_w0"), (1, "t2t"), (1, "a2t_w1"))


def tiny_release(root: Path) -> str:
  """An S2SBench StoryCloze release of the oracle's waves and texts: story k's lines 2k and 2k+1 end with candidates 0
  and 1 of its example, its written prefix is the t2t example's text, its spoken prefix the oracle's wave; and the
  precomputed GLM-4-Voice codes of each prefix (the oracle's random codes), by uttid."""
  import soundfile

  speech = root / "release" / "StoryCloze" / "s-story-firstspeech"
  speech.mkdir(parents=True)
  (root / "audio" / "codes").mkdir(parents=True)
  (root / "audio" / "whisper-large-v3").symlink_to(ORACLE / "model" / "whisper-large-v3")
  lines = []
  for story, (wave, example) in enumerate(STORIES):
    for c in (0, 1):
      uttid = 2 * story + c
      lines.append({"uttid": uttid, "first": word(oracle("inputs/text_ids_prompt_t2t")),
                    "last": word(oracle(f"inputs/text_ids_cand_{example}_{c}"))})
      soundfile.write(speech / f"{uttid}.wav", oracle(f"inputs/wave{wave}"), 16000, subtype="FLOAT")
      np.save(root / "audio" / "codes" / f"{uttid}.npy", oracle(f"inputs/codes_wave{wave}"))
  (root / "release" / "StoryCloze" / "sStory_s2t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
  return str(root / "release")


def oracle_spec(root: Path, name: str, instruction: str, codes: dict, codebook: int) -> str:
  """The kimi_audio preset at the oracle's sizes (its config's offset and adaptor width), with an instruction."""
  import yaml

  fields = yaml.safe_load(open(Path(SPECS_DIR) / "kimi_audio.yaml"))
  fields.update(name=name, codebook_sizes=[codebook], options={"token_offset": 256, "feature_width": 128},
                speech_instruction={"en": instruction}, audio_tokenizer=dict(fields["audio_tokenizer"], codes=codes))
  path = root / f"{name}.yaml"
  path.write_text(yaml.safe_dump(fields))
  return str(path)


def laid_sequences(td, blank: int) -> dict[tuple[str, int], tuple]:
  """Per (question, candidate) the request as the rows hold it: (audio stream, text stream, continuous mask) of the
  prefix and the candidate's laid positions, then its last token (a target only: text = that token, audio = BLANK,
  as upstream's request holds it); the candidate's targets; the feature track of its laid positions."""
  rows, table = td.rows, td.metadata.questions
  out = {}
  for record in table:
    for c, (item, j) in enumerate(record["slots"]):
      r, s = np.argwhere((rows["slot_item"] == item) & (rows["slot_candidate"] == j))[0]
      targets = rows["target_ids"][r][rows["target_slot"][r] == s]
      segment = rows["segment_ids"][r, rows["target_pos"][r][rows["target_slot"][r] == s][0]]
      laid = (rows["segment_ids"][r] == segment) & np.isin(rows["branch_ids"][r], (0, j + 1))
      out[(record["id"], c)] = (np.append(rows["audio_ids"][r][laid], blank),
                                np.append(rows["text_ids"][r][laid], targets[-1]),
                                np.append(rows["continuous"][r][laid], 0), targets,
                                rows["features"][r][laid] if "features" in rows else None)
  return out


@pytest.mark.slow
def test_built_rows_are_upstreams_requests_and_score_upstreams_nlls(tmp_path, meta, converted):
  """tasks.prepare lays the oracle's three requests from an S2SBench release of its waves and texts (S->T with the
  spec's instruction as the user's text message, S->T without one, T->T), GLM-4-Voice codes precomputed and the
  Whisper feature track computed in JAX from the waves: both id streams and the continuous mask equal upstream's,
  id for id, the features JAX's Whisper gives the waves; s2sjax.eval scores each candidate's NLL within 2e-4 per
  token of upstream's (from its waves) and writes the model's rows of the Table 1 file."""
  from s2sjax.commands.eval import EvalConfig, run
  from s2sjax.scoring.evaluator import ScoringOptions
  from s2sjax.data.task_data import load_task_data
  from tasks.preparation import prepare

  release, tokenizer = tiny_release(tmp_path), tiny_tokenizer(tmp_path / "tokenizer", meta)
  codes = {"type": "precomputed", "codes_dir": "codes"}
  specs = {"a2t_w0": oracle_spec(tmp_path, "kimi_tiny", word(oracle("inputs/text_ids_prompt_a2t_w0")), codes, 1024),
           "a2t_w1": oracle_spec(tmp_path, "kimi_tiny_bare", "", codes, 1024)}
  specs["t2t"] = specs["a2t_w0"]
  ckpt, _ = converted
  whisper = kimi_whisper.KimiWhisperFeatures(str(ORACLE / "model" / "whisper-large-v3"))
  features = whisper.features([oracle(f"inputs/wave{i}") for i in range(2)])
  nlls = json.loads((ORACLE / "outputs" / "nll_per_candidate.json").read_text())
  blank = meta["special_token_ids_tiny"]["kimia_text_blank"]
  for story, (wave, example) in enumerate(STORIES):
    modality = "t2t" if example == "t2t" else "s2t"
    data, out = str(tmp_path / "data"), str(tmp_path / "out" / example)
    prepare("sstorycloze", specs[example], modality, None, data, manual_dir=release, tokenizer_dir=tokenizer,
            audio_tokenizer_dir=str(tmp_path / "audio"))
    run(EvalConfig(tasks=("sstorycloze",), modalities=(modality,), checkpoints=str(ckpt), spec=specs[example],
                   data_dir=data, output_dir=out, tokenizer_dir=tokenizer, chunk_rows=2,
                   scoring=ScoringOptions(batch_size=2)))
    lines = {(line["question"], line["candidate"]): line
             for line in map(json.loads, open(Path(out) / "ckpt" / f"sstorycloze-{modality}.scores.jsonl"))}
    assert f"| ckpt | {'T→T' if modality == 't2t' else 'S→T'} |" in (Path(out) / "table.md").read_text()
    laid = laid_sequences(load_task_data(data, "sstorycloze", modality, specs[example], None), blank)
    for c in (0, 1):
      sequence = f"{example}_c{c}"
      audio, text, continuous, targets, track = laid[(str(2 * story), c)]
      np.testing.assert_array_equal(audio, oracle(f"outputs/{sequence}_audio_stream_ids"))
      np.testing.assert_array_equal(text, oracle(f"outputs/{sequence}_text_stream_ids"))
      np.testing.assert_array_equal(continuous, oracle(f"outputs/{sequence}_is_continuous_mask"))
      np.testing.assert_array_equal(targets, oracle(f"inputs/text_ids_cand_{example}_{c}"))
      if modality == "s2t":
        np.testing.assert_array_equal(track[continuous[:-1] > 0], features[wave])
      line = lines[(str(2 * story), c)]
      assert line["n_tokens"] == nlls[sequence]["n_tokens"]
      assert abs(line["nll_sum"] / line["n_tokens"] - nlls[sequence]["nll_mean"]) < FROM_WAVES, (sequence, line)

  # the pre-flight on the checkpoint with its tokenizer beside it, and the S->T data: every check passes, the audio
  # blanked by the format's rule moves the scores
  import shutil

  from s2sjax.scoring import preflight

  shutil.copytree(ckpt, tmp_path / "ckpt")
  shutil.copytree(tokenizer, tmp_path / "ckpt" / "tokenizer")
  td = load_task_data(str(tmp_path / "data"), "sstorycloze", "s2t", specs["a2t_w0"], None)
  verdicts = preflight.run(checkpoint.open(str(tmp_path / "ckpt")), spec=specs["a2t_w0"], data=td)
  assert all(v.ok for v in verdicts) and "audio reaches the model" in {v.check for v in verdicts}, preflight.table(verdicts)


GLM4_ORACLE = ORACLE.parent / "glm4voice_tokenizer"


@pytest.mark.slow
def test_a_build_of_the_bundled_sample_imports_no_torch(tmp_path, meta):
  """The bundled sample's S->T laid for Kimi-Audio with torch out of reach: GLM-4-Voice codes from the project's JAX
  tokenizer (its oracle folder) and the Whisper features from the oracle release's encoder, both in JAX; each
  prefix's code rows hold its codes + the offset and beside them its features, as the tokenizers give them."""
  from tasks.audio.base import load_audio
  from tasks.audio.glm4_voice import Glm4VoiceTokenizer
  from tasks.release import read_questions
  from tasks.sample import RELEASE_DIR
  from tests.test_audio_builds import run_without_torch

  audio = tmp_path / "audio"
  audio.mkdir()
  (audio / "glm-4-voice-tokenizer").symlink_to(GLM4_ORACLE)
  (audio / "whisper-large-v3").symlink_to(ORACLE / "model" / "whisper-large-v3")
  glm4 = Glm4VoiceTokenizer(str(GLM4_ORACLE))
  spec = oracle_spec(tmp_path, "kimi_sample", "t1 t2", {"type": "glm4_voice", "model_dir": "glm-4-voice-tokenizer"},
                     glm4.codebook_sizes[0])
  tokenizer = tiny_tokenizer(tmp_path / "tokenizer", meta)
  done = run_without_torch("tasks.prepare", "--task=sstorycloze", f"--spec={spec}", "--modality=s2t",
                           f"--tokenizer_dir={tokenizer}", f"--audio_tokenizer_dir={audio}",
                           f"--data_dir={tmp_path / 'data'}")
  assert done.returncode == 0, done.stderr[-3000:]
  from s2sjax.data.task_data import load_task_data

  td = load_task_data(str(tmp_path / "data"), "sstorycloze", "s2t", spec, None)
  assert td.rows["features"].dtype == np.float32 and td.rows["features"].shape[-1] == 128
  whisper = kimi_whisper.KimiWhisperFeatures(str(ORACLE / "model" / "whisper-large-v3"))
  laid = laid_sequences(td, meta["special_token_ids_tiny"]["kimia_text_blank"])
  questions = read_questions("sstorycloze", RELEASE_DIR)
  for question in questions[:3]:
    wave = load_audio(question.audio_paths[0], 16000)
    audio_ids, _, continuous, _, track = laid[(question.id, 0)]
    code_rows = continuous[:-1] > 0
    np.testing.assert_array_equal(audio_ids[:-1][code_rows], 256 + glm4.encode(wave, question.uttids[0])[:, 0])
    np.testing.assert_allclose(track[code_rows], whisper.features([wave])[0], rtol=0, atol=1e-5)
  assert len({q for q, _ in laid}) == len(questions)


def test_kimi_audio_cannot_be_asked_spoken_candidates_and_its_spec_is_checked():
  """T->S and S->S are refused by name (kimia.py's delayed audio stream), and a spec the format cannot lay is too."""
  from s2sjax.data import modalities
  from s2sjax.data.spec import SpecError, load_spec, spec_from_dict

  spec = load_spec("kimi_audio")
  for modality in ("t2s", "s2s"):
    with pytest.raises(SpecError, match=r"6 steps behind it \(kimia.py:125-150"):
      spec.check_modality(modalities.get(modality))
  spec.check_modality(modalities.get("s2t"))
  fields = dict(spec.as_dict(), options={"token_offset": 152064})
  with pytest.raises(SpecError, match="options needs exactly the non-negative integers token_offset, feature_width"):
    spec_from_dict(fields)
  with pytest.raises(SpecError, match=r"takes no unit_token"):
    spec_from_dict(dict(spec.as_dict(), unit_token="<|audio_{}|>"))


def test_a_checkpoint_whose_config_differs_from_the_spec_is_refused(meta, special):
  """The evaluator's fit check and the pre-flight's verdicts compare the spec's offset, codes and feature width with
  the checkpoint's config, and the fit check the media markers the rows hold, naming each."""
  from s2sjax.scoring.architectures import FitError
  from s2sjax.data.spec import load_spec

  config = kimi_audio.parse_config(meta["config_json"])
  spec = load_spec("kimi_audio")  # the 7B release's sizes, not the tiny oracle's
  verdicts = {check: ok for check, ok, _ in kimi_audio.spec_checks(config, spec)}
  assert verdicts == {"code offset": False, "code range": False, "feature width": False}
  streams, _ = request("a2t_w1", 0, special, config)
  rows = {"audio_ids": streams.audio[None], "continuous": streams.continuous[None].astype(np.int32)}
  assert kimi_audio.media_markers(rows) == ({213}, {215})

  class Data:
    task, modality = "sstorycloze", "s2t"
    metadata = type("Metadata", (), {"spec": spec})

  Data.rows = dict(rows, audio_ids=np.where(streams.audio == 213, 1, streams.audio)[None])
  with pytest.raises(FitError, match="code offset: spec kimi_audio lays code k at audio id 152064 \\+ k; the "
                                     "checkpoint's kimia_token_offset is 256.*media markers: the rows open their "
                                     "audio with ids \\[1\\] and close it with \\[215\\]"):
    kimi_audio.check_fit(config, Data)


def test_special_ids_are_looked_up_as_upstream_looks_them_up(meta, special):
  """special_tokens.py:25-31: the tokenizer's `special_tokens` table where it has one (the release's tiktoken
  tokenizer), else its vocabulary; a token it lacks is named."""
  from s2sjax.data.spec import SpecError, load_spec
  from tasks.kimi_encoder import special_ids

  named = meta["special_token_ids_tiny"]
  table = {kimi_prompt.TOKEN_NAMES[field]: named[name] for field, name in EXTRA_TOKENS.items()}
  tiktoken_like = type("Tokenizer", (), {"special_tokens": table})()
  assert special_ids(load_spec("kimi_audio"), tiktoken_like) == special
  vocabulary_only = type("Tokenizer", (), {"get_vocab": lambda self: {"<|im_msg_end|>": 200}})()
  with pytest.raises(SpecError, match=r"needs the tokens <\|im_media_begin\|>.*--tokenizer_dir=RELEASE"):
    special_ids(load_spec("kimi_audio"), vocabulary_only)


def test_the_planner_sizes_kimi_audio_7b_through_its_architecture():
  """The 7B release's config parsed by the architecture: 9.77B parameters held (7.73B in the main stack, the rest
  the audio branch, its head and the adaptor), the step costed as the main stack it runs."""
  from s2sjax.scoring import planner

  config = planner.named_models()["kimi-audio-7b"]
  assert (config.token_offset, config.audio_codes, config.adaptor_input_dim) == (152064, 16384, 5120)
  assert round(config.num_params() / 1e9, 2) == 9.77 and round(config.decoder.num_params() / 1e9, 2) == 7.73
  p = planner.plan(config, "v5e-8", 2048, 8, "bfloat16", 12.5, 0.4)
  assert p["fits"] and p["mesh"] == "data:4,model:2"
  assert p["params_gib"] == pytest.approx(config.num_params() * 2 / 2 / 2**30)
  decoder = planner.plan(config.decoder, "v5e-8", 2048, 8, "bfloat16", 12.5, 0.4)
  assert p["total_seconds"] == decoder["total_seconds"] and p["activations_gib"] == decoder["activations_gib"]
