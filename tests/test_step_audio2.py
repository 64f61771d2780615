"""Step-Audio 2 held to its own code: ../shared/upstream-oracles/step_audio2 is a tiny Step-Audio-2-mini(-Base) in
the release's layout with what the release's `modeling_step_audio_2.py` and the Step-Audio2 wrapper computed from it
(its PROVENANCE.txt). From the oracle's waves: the JAX log-mels, the encoder's and adaptor's outputs (alone and in
one padded batch), the requests the wrapper lays (base and chat templates, text and speech out), and through the
converted release the embeddings after the audio rows are written, every layer's output, the full-vocabulary
log-softmax at every position and each candidate's NLL (full vocabulary, and over the 6,562 audio ids for speech
out). Every expected number is read from the folder, so another seed of its generator passes the same way."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from checkpoints_conversion import convert, safetensors_io
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.architectures import step_audio2
from s2sjax.model import decoder
from s2sjax.numerics import rotary
from s2sjax.numerics import norms
from s2sjax.model.attention import packed_attention_mask
from s2sjax.model.config import ConfigError
from s2sjax.model.step_audio2 import AUDIO_CODES, AUDIO_OFFSET, release_audio_tensors
from tasks import step_audio2_prompt as prompt
from tasks.audio import step_audio2 as audio

ROOT = Path(__file__).resolve().parents[1]
ORACLE = ROOT.parent / "shared" / "upstream-oracles" / "step_audio2"
pytestmark = pytest.mark.skipif(not ORACLE.is_dir(), reason="the Step-Audio 2 oracle (../shared/upstream-oracles/"
                                                            "step_audio2) is not beside this checkout")
LOG_PROBS = 1e-4  # fp32 against upstream's fp32 run
STAGES = 1e-5  # mels, encoder, adaptor, embeddings and hidden states: fp32 reduction order only


def oracle(name: str) -> np.ndarray:
  return np.load(ORACLE / f"{name}.npy")


@pytest.fixture(scope="module")
def meta():
  return json.loads((ORACLE / "meta.json").read_text())


@pytest.fixture(scope="module")
def nlls():
  return json.loads((ORACLE / "outputs" / "nll_per_candidate.json").read_text())


@pytest.fixture(scope="module")
def encoder():
  return audio.StepAudio2Encoder(str(ORACLE / "model"))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """The release converted by the project's own command path, in bfloat16 as released."""
  out = tmp_path_factory.mktemp("step_audio2") / "ckpt"
  manifest = convert.convert(str(ORACLE / "model"), str(out), dtype="bfloat16")
  return out, manifest


class StandInTokenizer:
  """The oracle's stand-in text tokenizer (PROVENANCE.txt, "Tokenizer"): its special tokens at the table's ids, every
  other piece between them one seeded id per whitespace word, drawn as gen.py's stand-in draws them."""

  def __init__(self, meta: dict):
    self.seed, self.special = meta["seed"], meta["tokenizer_standin_table"]["special"]
    self.split = re.compile("(" + "|".join(re.escape(t) for t in sorted(self.special, key=len, reverse=True)) + ")")

  def __call__(self, text: str) -> list[int]:
    ids = []
    for part in filter(None, self.split.split(text)):
      if part in self.special:
        ids.append(self.special[part])
      else:
        rng = np.random.default_rng([self.seed, int(hashlib.sha256(part.encode()).hexdigest()[:8], 16)])
        ids += rng.integers(0, 151643, max(1, len(part.split()))).tolist()
    return ids


def waves() -> dict[str, np.ndarray]:
  return {path.stem: np.load(path) for path in sorted((ORACLE / "inputs").glob("wave*.npy"))}


def pieces_of(item, wave_rows: dict[str, tuple[int, ...]]):
  """A message item of meta.sequences as a layout piece: an audio dict as its chunks' rows, text as it is."""
  if isinstance(item, dict) and item.get("type") == "audio":
    return prompt.Audio(wave_rows[Path(item["audio"]).stem])
  return item


def request(sequence: str, meta: dict, wave_rows) -> list:
  """The pieces of an oracle sequence's prompt, by its own template, from meta.sequences' messages."""
  laid = meta["sequences"][sequence]
  if laid["template"] == "base":
    return prompt.base_request([pieces_of(item, wave_rows) for item in laid["messages"]])
  return prompt.chat_pieces([
    prompt.Message(m["role"], m["content"] if not isinstance(m["content"], list)
                   else [pieces_of(item, wave_rows) for item in m["content"]], m.get("eot", True))
    for m in laid["messages"]])


@pytest.fixture(scope="module")
def laid_requests(meta, nlls, encoder):
  """Each oracle sequence laid by the project: (ids + continuation, patch rows, the adaptor rows of its audio)."""
  tokenizer = StandInTokenizer(meta)
  ids = prompt.AudioIds.from_tokens(meta["tokenizer_standin_table"]["special"].__getitem__)
  rows = dict(zip(waves(), encoder.rows(list(waves().values()))))
  wave_rows = {name: tuple(np.bincount(chunk).tolist()) for name, (_, chunk) in rows.items()}
  out = {}
  for sequence in meta["sequences"]:
    laid = prompt.lay(request(sequence, meta, wave_rows), tokenizer, ids)
    heard = [rows[Path(m["audio"]).stem][0] for m in _audio_items(meta["sequences"][sequence]["messages"])]
    features = np.concatenate(heard) if heard else None
    continuation = np.asarray(nlls[sequence]["continuation_ids"])
    out[sequence] = (np.concatenate([laid.ids, continuation]), len(laid), features)
  return out


def _audio_items(messages):
  for m in messages:
    content = m.get("content") if isinstance(m, dict) and "role" in m else [m]
    for item in content if isinstance(content, list) else []:
      if isinstance(item, dict) and item.get("type") == "audio":
        yield item


def test_step_audio_release_config_is_read_by_name(meta):
  """The nested config.json: sizes read, switches the forward does not implement and unknown keys refused; the LLM
  rules and the encoder's / adaptor's tensors are exactly the release's keys and shapes."""
  config = step_audio2.parse_config(meta["config_json"])
  text = meta["config_json"]["text_config"]
  assert (config.decoder.hidden_size, config.decoder.num_layers, config.vocab_size) == (
    text["hidden_size"], text["num_hidden_layers"], text["vocab_size"])
  assert config.decoder.num_kv_heads == text["num_key_value_heads"] and not config.decoder.tie_embeddings
  for change, words in (({"model_type": "qwen2"}, "model_type 'qwen2' is not 'step_audio_2'"),
                        ({"text_config": dict(text, rope_scaling={"type": "yarn"})}, "rope_scaling"),
                        ({"text_config": dict(text, num_attention_groups=7)}, "differ"),
                        ({"extra_switch": 1}, "unknown config.json key 'extra_switch'")):
    with pytest.raises(ConfigError, match=words):
      step_audio2.parse_config(dict(meta["config_json"], **change))
  expected = {key: tuple(shape) for key, shape in meta["state_dict"].items()}
  ours = {p.key: p.source_shape for r in step_audio2.rules(config) for p in r.pieces}
  assert {**ours, **release_audio_tensors(config.encoder)} == expected


def test_step_audio_conversion_keeps_the_release_bf16(converted):
  """`checkpoints_conversion.convert` finds the release by its modeling class; a bfloat16 checkpoint holds the file's
  values bit for bit."""
  ckpt, manifest = converted
  assert manifest["source_model_type"] == step_audio2.MODEL_TYPE
  params = checkpoint.load_params(ckpt)
  source = safetensors_io.SafetensorsFile(str(ORACLE / "model" / "model.safetensors"))
  np.testing.assert_array_equal(np.asarray(params["embed"]["embedding"]), source.read("model.embed_tokens.weight"))
  np.testing.assert_array_equal(np.asarray(params["lm_head"]["kernel"]), source.read("lm_head.weight").T)
  assert np.asarray(params["lm_head"]["kernel"]).dtype == source.read("lm_head.weight").dtype


@pytest.mark.slow
@pytest.mark.parametrize("damage, words", [
  ("missing", "missing key encoder.blocks.1.attn.key.weight"),
  ("misshaped", "shape mismatch at model.layers.0.self_attn.q_proj.weight"),
  ("model_type", "model_type 'qwen2_audio' is not 'step_audio_2'"),
])
def test_step_audio_bad_release_folder_gets_one_line(tmp_path, damage, words):
  """A release with a tensor gone, one of the wrong shape, or another model_type: the converter's command line says
  what in its one error line (no traceback), exits non-zero and writes nothing."""
  source = safetensors_io.SafetensorsFile(str(ORACLE / "model" / "model.safetensors"))
  tensors = {key: source.read(key) for key in source.keys()}
  config = json.loads((ORACLE / "model" / "config.json").read_text())
  if damage == "missing":
    del tensors["encoder.blocks.1.attn.key.weight"]
  elif damage == "misshaped":
    tensors["model.layers.0.self_attn.q_proj.weight"] = tensors["model.layers.0.self_attn.q_proj.weight"][:-1]
  else:
    config["model_type"] = "qwen2_audio"
  release = tmp_path / "release"
  release.mkdir()
  (release / "config.json").write_text(json.dumps(config))
  safetensors_io.write(str(release / "model.safetensors"), tensors)
  done = subprocess.run([sys.executable, "-m", "checkpoints_conversion.convert", f"--source={release}",
                         f"--output={tmp_path / 'out'}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  first = done.stderr.strip().splitlines()[0]
  assert done.returncode != 0 and first.startswith("error: ") and words in first, done.stderr
  assert "Traceback" not in done.stderr
  assert not (tmp_path / "out").exists()


def test_step_audio_check_names_a_refused_source_config(converted, tmp_path):
  """`s2sjax.check`'s config verdict parses the converted checkpoint's source config.json again through the
  architecture: as converted it passes; with another model_type it fails, naming it."""
  import shutil

  from s2sjax.scoring import preflight

  ckpt, _ = converted
  verdict = lambda folder: next(v for v in preflight.run(checkpoint.open(str(folder))) if v.check == "config")
  assert verdict(ckpt).ok
  changed = tmp_path / "ckpt"
  shutil.copytree(ckpt, changed)
  manifest = json.loads((changed / "manifest.json").read_text())
  manifest["source_config"]["model_type"] = "qwen2_audio"
  (changed / "manifest.json").write_text(json.dumps(manifest))
  refused = verdict(changed)
  assert not refused.ok and "model_type 'qwen2_audio' is not 'step_audio_2'" in refused.detail


@pytest.mark.slow
def test_step_audio_mels_encoder_and_adaptor_are_upstreams(meta, encoder):
  """Each wave's log-mel (padding 479), the lengths the forward is given (frames - 2, the encoder's x_len, the
  placeholders laid), the encoder's output and the adaptor's rows, alone and with the other wave in one padded
  batch."""
  sequences = {Path(item["audio"]).stem: s for s in meta["sequences"] if s.endswith("_c0")
               for item in _audio_items(meta["sequences"][s]["messages"])}
  together = dict(zip(waves(), encoder.rows(list(waves().values()))))
  for name, wave in waves().items():
    mel = audio.log_mel(wave)
    assert np.abs(mel.T - oracle(f"outputs/{name}_logmel")).max() < STAGES
    sequence = sequences[name]
    np.testing.assert_allclose(oracle(f"outputs/{sequence}_wavs")[0], oracle(f"outputs/{name}_logmel"), rtol=0, atol=0)
    assert oracle(f"outputs/{sequence}_wav_lens")[0] == len(mel) - 2
    assert oracle(f"outputs/{sequence}_encoder_len")[0] == audio.encoder_length(len(mel))
    assert audio.patch_count(len(mel)) == meta["waves"][name]["n_audio_patches"]
    rows, encoded = encoder.encoded([mel], with_stages=True)
    expected = oracle(f"outputs/{sequence}_encoder_out")
    assert np.abs(encoded[0, : len(expected)] - expected).max() < STAGES
    n = audio.patch_count(len(mel))
    adapted = oracle(f"outputs/{sequence}_adapter_out")[:n]
    assert np.abs(rows[0, :n] - adapted).max() < STAGES
    assert together[name][0].shape == adapted.shape and np.abs(together[name][0] - adapted).max() < STAGES


def test_step_audio_requests_are_the_wrappers(meta, laid_requests):
  """Every oracle sequence's ids as the wrapper laid them (base and chat templates, text and speech out), its
  placeholders where the forward writes the adaptor rows."""
  for sequence, (ids, prefix, features) in laid_requests.items():
    np.testing.assert_array_equal(ids, oracle(f"outputs/{sequence}_input_ids"))
    assert prefix == meta["seqs_detail"][sequence]["P"]
    runs = step_audio2.patch_rows(ids)
    assert sum(count for _, count in runs) == (0 if features is None else len(features))


def _padded(ids: np.ndarray, length: int) -> np.ndarray:
  """The ids followed by zeros to `length` (one compiled shape for all sequences; causal, so the rows of the sequence
  itself are unchanged)."""
  return np.pad(ids, (0, length - len(ids)))


@functools.partial(jax.jit, static_argnums=0)
def _stack(config, params, x, mask):
  """Each layer's output and the final norm's of inputs x [1, L, H]: the LLM run layer by layer."""
  positions = np.arange(x.shape[1])[None]
  cos, sin = rotary.rotary_angles(positions, config.decoder.rotary_dim, config.decoder.rope_theta)
  layer = decoder.DecoderLayer(config.decoder, np.float32, np.float32)
  outputs = []
  for i in range(config.num_layers):
    x = layer.apply({"params": jax.tree.map(lambda leaf: leaf[i].astype(np.float32), params["layers"])}, x, cos, sin,
                    mask, None, None)[0]
    outputs.append(x[0])
  return outputs, norms.rms_norm(x, params["final_norm"]["scale"].astype(np.float32), config.decoder.rms_norm_eps)[0]


def _layer_outputs(config, params, ids, features, padded):
  """The first layer's input, each layer's output and the final norm's, at the sequence's own rows."""
  length = len(ids)
  ids = _padded(ids, padded)
  track, continuous = np.zeros((len(ids), config.decoder.hidden_size), np.float32), np.zeros(len(ids), bool)
  for first, count in step_audio2.patch_rows(ids):
    continuous[first : first + count] = True
  if features is not None:
    track[continuous] = features
  x = np.where(continuous[:, None], track, np.asarray(params["embed"]["embedding"], np.float32)[ids])
  outputs, final = _stack(config, params, x[None], packed_attention_mask(np.ones((1, len(ids)), np.int32)))
  return [x[:length]] + [np.asarray(o)[:length] for o in outputs] + [np.asarray(final)[:length]]


@pytest.mark.slow
def test_step_audio_forward_is_upstreams_at_every_stage(converted, laid_requests, meta, nlls):
  """From the waves through the converted release: the embeddings after the audio rows are written, each layer's
  output, the final hidden states, the full-vocabulary log-softmax at every position (the oracle's id subset, its
  normaliser, the 6,562 audio ids' columns) and each candidate's NLL, full-vocabulary and renormalised over the
  audio ids."""
  ckpt, _ = converted
  config, params = checkpoint.load_config(ckpt), checkpoint.load_params(ckpt)
  subset = oracle("outputs/logprob_id_subset")
  padded = max(len(ids) for ids, _, _ in laid_requests.values())
  for sequence, (ids, prefix, features) in laid_requests.items():
    if (ORACLE / "outputs" / f"{sequence}_inputs_embeds.npy").exists():
      stages = _layer_outputs(config, params, ids, features, padded)
      assert np.abs(stages[0] - oracle(f"outputs/{sequence}_inputs_embeds")).max() < STAGES
      for i in range(config.num_layers):
        assert np.abs(stages[i + 1] - oracle(f"outputs/{sequence}_layer{i}_out")).max() < STAGES
      assert np.abs(stages[-1] - oracle(f"outputs/{sequence}_final_hidden")).max() < STAGES
    log_probs = step_audio2.log_probs(config, params, _padded(ids, padded), features=features)[0][: len(ids)]
    assert np.abs(log_probs[:, subset] - oracle(f"outputs/{sequence}_logprobs_subset")).max() < LOG_PROBS
    normaliser = oracle(f"outputs/{sequence}_logsumexp")  # log p = logit - normaliser, so any column fixes it
    logits = np.asarray(params["lm_head"]["kernel"], np.float32)
    if (ORACLE / "outputs" / f"{sequence}_final_hidden.npy").exists():
      hidden = oracle(f"outputs/{sequence}_final_hidden")
      assert np.abs(hidden @ logits[:, subset[0]] - log_probs[:, subset[0]] - normaliser).max() < LOG_PROBS
    record = nlls[sequence]
    scored = log_probs[np.arange(prefix - 1, prefix - 1 + record["n_tokens"]), ids[prefix:]]
    assert np.abs(scored - np.asarray(record["token_logprobs"])).max() < LOG_PROBS
    assert abs(-scored.mean() - record["nll_mean"]) < LOG_PROBS
    if record["kind"] == "audio":
      window = log_probs[prefix - 1 : prefix + record["n_tokens"], AUDIO_OFFSET : AUDIO_OFFSET + AUDIO_CODES]
      assert np.abs(window - oracle(f"outputs/{sequence}_audio_range_logprobs")).max() < LOG_PROBS
      renormalised = window[:-1] - jax.nn.logsumexp(window[:-1], axis=-1, keepdims=True)
      codes = np.asarray(record["audio_codes"])
      assert abs(-renormalised[np.arange(len(codes)), codes].mean()
                 - record["nll_mean_renormalized_over_audio_ids"]) < LOG_PROBS


# ---- end to end: the bundled sample built and scored by the project's commands -------------------------------------


def sample_tokenizer(folder: Path, meta: dict) -> str:
  """A word-level tokenizer over the bundled sample's StoryCloze words, with the oracle's special tokens at its ids."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  from tasks.release import read_questions
  from tasks.sample import RELEASE_DIR

  words = sorted({word for q in read_questions("sstorycloze", RELEASE_DIR) for text in (*q.prefixes, *q.candidates)
                  for word in text.split()})
  vocab = {"<unk>": 0, **{word: i + 1 for i, word in enumerate(words)}, **meta["tokenizer_standin_table"]["special"]}
  core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>").save_pretrained(str(folder))
  return str(folder)


def tiny_spec(root: Path, config, template: str = "base") -> str:
  """The step_audio2 preset (base) or step_audio2_chat at the oracle's width."""
  import yaml

  from s2sjax.data.spec import SPECS_DIR

  preset = "step_audio2" if template == "base" else "step_audio2_chat"
  fields = yaml.safe_load(open(Path(SPECS_DIR) / f"{preset}.yaml"))
  fields.update(name=f"{preset}_tiny", options=dict(fields["options"], feature_width=config.decoder.hidden_size))
  path = root / f"{preset}_tiny.yaml"
  path.write_text(yaml.safe_dump(fields))
  return str(path)


def sample_audio_dir(root: Path, seed: int) -> Path:
  """The oracle release's config and weights (what the step_audio2 tokenizer reads) beside random s3tokenizer codes
  of every spoken candidate of the bundled sample, as `s3tokenizer_codes/candidates/<name>.npy`."""
  from tasks.release import read_questions
  from tasks.sample import RELEASE_DIR

  folder = root / "release"
  (folder / "s3tokenizer_codes" / "candidates").mkdir(parents=True)
  for name in ("config.json", "model.safetensors"):
    (folder / name).symlink_to(ORACLE / "model" / name)
  rng = np.random.default_rng(seed)
  for question in read_questions("sstorycloze", RELEASE_DIR):
    for path in question.candidate_audio_paths:
      codes = rng.integers(0, AUDIO_CODES - 1, int(rng.integers(5, 20)))
      np.save(folder / "s3tokenizer_codes" / "candidates" / f"{Path(path).stem}.npy", codes)
  return folder


def spoken_codes(release: Path, path: str) -> np.ndarray:
  """The s3tokenizer codes `sample_audio_dir` wrote for the spoken candidate at `path`."""
  return np.load(release / "s3tokenizer_codes" / "candidates" / f"{Path(path).stem}.npy")


SAMPLE_MODALITIES = ("s2t", "t2s", "s2s")


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory, meta, converted):
  """The oracle release converted (the converter's command path, `converted`), the bundled sample built by
  `tasks.prepare` in every modality of SAMPLE_MODALITIES (mels, encoder and adaptor in JAX; spoken candidates as
  precomputed s3tokenizer codes) and scored by one `python -m s2sjax.eval`: (text tokenizer, spec, release with the
  codes, run folder)."""
  from tasks.preparation import prepare

  root = tmp_path_factory.mktemp("step_audio2_sample")
  config = step_audio2.parse_config(meta["config_json"])
  tokenizer, spec = sample_tokenizer(root / "tokenizer", meta), tiny_spec(root, config)
  release = sample_audio_dir(root, meta["seed"])
  (ckpt, _), data, out = converted, root / "data", root / "out"
  for modality in SAMPLE_MODALITIES:
    prepare("sstorycloze", spec, modality, None, str(data), tokenizer_dir=tokenizer, audio_tokenizer_dir=str(release))
  done = subprocess.run([sys.executable, "-m", "s2sjax.eval", "--task=sstorycloze",
                         f"--modality={','.join(SAMPLE_MODALITIES)}", f"--spec={spec}", f"--checkpoint={ckpt}",
                         f"--tokenizer_dir={tokenizer}", f"--data_dir={data}", f"--output_dir={out}"], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return tokenizer, spec, release, out / "ckpt"


@pytest.mark.slow
@pytest.mark.parametrize("modality", SAMPLE_MODALITIES)
def test_step_audio_sample_end_to_end_scores_each_item_as_its_own_forward(meta, encoder, converted, sample_run,
                                                                          modality):
  """`sample_run`, in every modality: every item's NLL is the converted model's forward on that item alone, laid from
  its wave, its text and its codes by the wrapper's base template (speech out after <tts_start>, ids 151696 + code);
  a spoken candidate's `nll_sum_audio_ids` in the details file (none for written candidates) is that forward's NLL
  renormalised over the 6,562 audio ids."""
  from s2sjax.data.spec import load_spec
  from tasks.audio.base import load_audio
  from tasks.release import read_questions
  from tasks.sample import RELEASE_DIR
  from transformers import AutoTokenizer

  config = step_audio2.parse_config(meta["config_json"])
  tokenizer, spec, release, run_dir = sample_run
  ckpt, _ = converted
  lines = [json.loads(line) for line in open(run_dir / f"sstorycloze-{modality}.scores.jsonl")]
  spoken = modality.endswith("s")
  details_path = run_dir / f"sstorycloze-{modality}.details.jsonl"
  assert details_path.exists() == spoken
  details = {(d["question"], d["candidate"]): d for d in map(json.loads, open(details_path))} if spoken else {}
  questions = {q.id: q for q in read_questions("sstorycloze", RELEASE_DIR)}
  assert {line["question"] for line in lines} == set(questions)
  params = checkpoint.load_params(ckpt)
  text = AutoTokenizer.from_pretrained(tokenizer)
  ids = prompt.AudioIds.from_tokens(text.convert_tokens_to_ids)
  instruction = load_spec(spec).speech_instruction["en"]
  tokenize = lambda piece: text(piece, add_special_tokens=False)["input_ids"]
  heard = {}
  if modality.startswith("s"):  # each recording's rows as if alone (the padded batch equals one wave at a time)
    paths = sorted({questions[line["question"]].audio_paths[line["candidate"]] for line in lines})
    heard = dict(zip(paths, encoder.rows([load_audio(path, audio.SAMPLE_RATE) for path in paths])))
  requests, features, continuous, starts = [], [], [], []
  for line in lines:
    question, c = questions[line["question"]], line["candidate"]
    if modality.startswith("s"):
      rows, chunk = heard[question.audio_paths[c]]
      pieces = ([instruction] if instruction else []) + [prompt.Audio(tuple(np.bincount(chunk).tolist()))]
    else:
      rows, pieces = np.zeros((0, config.decoder.hidden_size)), [question.prefixes[c]]
    if spoken:
      pieces.append(prompt.TTS_START)
      codes = spoken_codes(release, question.candidate_audio_paths[c])
      candidate = AUDIO_OFFSET + codes
    else:
      candidate = np.asarray(tokenize(question.candidates[c]))
    laid = prompt.lay(prompt.base_request(pieces), tokenize, ids)
    assert line["n_tokens"] == len(candidate)
    track = np.zeros((ITEM_LENGTH, config.decoder.hidden_size), np.float32)
    track[np.flatnonzero(laid.continuous)] = rows
    requests.append(_padded(np.concatenate([laid.ids, candidate]), ITEM_LENGTH))
    features.append(track)
    continuous.append(np.pad(laid.continuous, (0, ITEM_LENGTH - len(laid))))
    starts.append(len(laid))
  most = max(line["n_tokens"] for line in lines)
  scored = np.stack([np.minimum(start - 1 + np.arange(most), ITEM_LENGTH - 2) for start in starts])
  nll, over_audio = map(np.asarray, _item_nlls(config, params, np.stack(requests), np.stack(features),
                                               np.stack(continuous), scored))
  for line, row, audio_row in zip(lines, nll, over_audio):
    n = line["n_tokens"]
    assert abs(line["nll_sum"] - row[:n].sum()) < LOG_PROBS * n, line
    if spoken:
      found = details[(line["question"], line["candidate"])]
      assert found["uttid"] == line["uttid"]
      assert abs(found["nll_sum_audio_ids"] - audio_row[:n].sum()) < LOG_PROBS * n, found


@pytest.mark.slow
def test_step_audio_scoring_step_gives_upstreams_nll_over_the_audio_ids(converted, laid_requests, nlls):
  """The oracle's speech-out requests (T->S, base; S->S, chat, with its wave's adaptor rows) laid as packed rows and
  scored by the architecture's own step: each candidate's summed NLL (full vocabulary) and its details'
  `nll_sum_audio_ids` (renormalised over the 6,562 audio ids) are upstream's, within 1e-4 a token."""
  from s2sjax.data.formats.step_audio2 import ROWS
  from s2sjax.data.packing import RowShape

  ckpt, _ = converted
  config, params = checkpoint.load_config(ckpt), checkpoint.load_params(ckpt)
  spoken = [name for name, record in nlls.items() if record["kind"] == "audio"]
  length = 32 * -(-max(len(laid_requests[name][0]) for name in spoken) // 32)
  most = max(nlls[name]["n_tokens"] for name in spoken)
  shape = RowShape(length, most, 1)
  rows = ROWS.empty(len(spoken), shape, {"features": config.decoder.hidden_size})
  for r, name in enumerate(spoken):
    ids, prefix, features = laid_requests[name]
    n = nlls[name]["n_tokens"]
    rows["ids"][r, : len(ids)] = ids
    rows["segment_ids"][r, : len(ids)] = 1
    rows["branch_ids"][r, prefix : len(ids)] = 1
    rows["positions"][r, : len(ids)] = np.arange(len(ids))
    rows["target_pos"][r, :n] = prefix - 1 + np.arange(n)
    rows["target_ids"][r, :n] = ids[prefix:]
    rows["target_slot"][r, :n] = 0
    rows["slot_item"][r], rows["slot_candidate"][r] = r, 0
    for first, count in step_audio2.patch_rows(ids):
      rows["continuous"][r, first : first + count] = 1
    if features is not None:
      rows["features"][r, rows["continuous"][r] > 0] = features
  slots = step_audio2.scorer(config, shape, batch_size=2).score_slots(params, rows, progress=False)
  assert step_audio2.ARCHITECTURE.details(config) == ("nll_sum_audio_ids",)
  for r, name in enumerate(spoken):
    n = nlls[name]["n_tokens"]
    assert abs(slots["nll_sum"][r, 0] - nlls[name]["nll_sum"]) < LOG_PROBS * n, name
    assert abs(slots["details"][r, 0, 0] / n - nlls[name]["nll_mean_renormalized_over_audio_ids"]) < LOG_PROBS, name


@pytest.mark.slow
@pytest.mark.parametrize("modality", ["t2t", "s2t", "t2s", "s2s"])
def test_step_audio_chat_spec_lays_the_wrappers_chat_turns(tmp_path, meta, modality):
  """`--spec=step_audio2_chat` lays a bundled sample question as StepAudio2.apply_chat_template lays the same
  pieces (the template held to the oracle's chat requests above): the system prompt, the user's turn holding the
  instruction and audio (or the text), the assistant's turn opened (with <tts_start> for speech out), then the
  candidate; the adaptor rows at the placeholders."""
  from s2sjax.data.spec import load_spec
  from tasks.audio import from_spec
  from tasks.audio.base import load_audio
  from tasks.encoders import QuestionEncoder
  from tasks.release import read_questions
  from tasks.sample import RELEASE_DIR
  from transformers import AutoTokenizer

  config = step_audio2.parse_config(meta["config_json"])
  text = AutoTokenizer.from_pretrained(sample_tokenizer(tmp_path / "tokenizer", meta))
  release = sample_audio_dir(tmp_path, meta["seed"])
  spec = load_spec(tiny_spec(tmp_path, config, "chat"))
  tokenizer = from_spec(spec.audio_tokenizer, spec.codebook_sizes, str(release))
  encoder = QuestionEncoder(spec, modality, text, tokenizer)
  question = read_questions("sstorycloze", RELEASE_DIR)[0]
  prefix, _, _ = encoder.prefix(question, 0)
  candidate, _ = encoder.candidate(question, 0)
  tokenize = lambda piece: text(piece, add_special_tokens=False)["input_ids"]
  if modality.startswith("s"):
    rows, chunk = tokenizer.encoder.rows([load_audio(question.audio_paths[0], audio.SAMPLE_RATE)])[0]
    pieces = [spec.speech_instruction["en"], prompt.Audio(tuple(np.bincount(chunk).tolist()))]
  else:
    rows, pieces = None, [question.prefixes[0]]
  laid = prompt.lay(prompt.chat_request(pieces, prompt.TTS_START if modality.endswith("s") else None), tokenize,
                    prompt.AudioIds.from_tokens(text.convert_tokens_to_ids))
  np.testing.assert_array_equal(prefix["ids"], laid.ids)
  np.testing.assert_array_equal(prefix["continuous"], laid.continuous)
  if rows is not None:
    np.testing.assert_array_equal(prefix["features"][laid.continuous], rows)
  if modality.endswith("s"):
    codes = spoken_codes(release, question.candidate_audio_paths[0])
    np.testing.assert_array_equal(candidate["target_ids"], AUDIO_OFFSET + codes)
  else:
    np.testing.assert_array_equal(candidate["target_ids"], tokenize(question.candidates[0]))


ITEM_LENGTH = 128  # longer than every item of the bundled sample's S->T


@functools.partial(jax.jit, static_argnums=0)
def _item_nlls(config, params, ids, features, continuous, scored):
  """[B, M] twice: the NLL of id scored[b, m] + 1 of each row under the model's plain causal forward of that row alone
  (positions arange, no packing), the features written at the `continuous` rows, over the full vocabulary and
  over the 6,562 audio ids alone."""
  model = decoder.Decoder(config.decoder)
  batch, length = ids.shape
  positions = np.broadcast_to(np.arange(length), (batch, length))
  mask = packed_attention_mask(np.ones((batch, length), np.int32))
  hidden = model.apply({"params": params}, ids, positions, mask, features=features, continuous=continuous)
  rows = jax.numpy.take_along_axis(hidden, scored[..., None], axis=1)
  logits = model.apply({"params": params}, rows, method=decoder.Decoder.logits)
  targets = jax.numpy.take_along_axis(ids, scored + 1, axis=1)
  picked = jax.numpy.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  audio_ids = logits[..., AUDIO_OFFSET : AUDIO_OFFSET + AUDIO_CODES]
  return jax.nn.logsumexp(logits, axis=-1) - picked, jax.nn.logsumexp(audio_ids, axis=-1) - picked


def test_the_planner_sizes_step_audio_2_mini_through_its_architecture():
  """The real release's sizes (hidden 3584, 28 layers; the encoder 1280 wide, 32 blocks) parsed by the architecture:
  the LLM held and run by the step, the encoder's and adaptor's parameters its tensors' (run by the build)."""
  from s2sjax.scoring import planner

  config = planner.named_models()["step-audio-2-mini"]
  assert (config.decoder.hidden_size, config.num_layers, config.encoder.n_state, config.encoder.n_layer) == (
    3584, 28, 1280, 32)
  assert config.num_params() == config.decoder.num_params()
  assert config.encoder.num_params() == sum(np.prod(s) for s in release_audio_tensors(config.encoder).values())
  p = planner.plan(config, "v5e-8", 2048, 8, "bfloat16", 12.5, 0.4)
  assert p["fits"] and p["params_gib"] == pytest.approx(config.num_params() * 2 / 2 / 2**30)
  decoder_plan = planner.plan(config.decoder, "v5e-8", 2048, 8, "bfloat16", 12.5, 0.4)
  assert p["total_seconds"] == decoder_plan["total_seconds"] and p["mesh"] == decoder_plan["mesh"]
