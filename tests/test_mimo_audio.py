"""MiMo-Audio-7B-Base held to its own code: ../shared/upstream-oracles/mimo_audio is a tiny release in MiMo-Audio's
layout and key names (bf16, as released) and what XiaomiMiMo/MiMo-Audio computed from it in float32 (PROVENANCE.txt):
requests laid by upstream's get_input_ids, every stage of the patch embedding (the bf16 speech sum, the bidirectional
input local transformer), the text head's log-softmax after every patch, candidates' NLLs, and the patch decoder's
teacher-forced log-softmax per [patch, frame, channel] with the delay pattern. The release is converted by the
project's own command; every expected number is read from the folder, so another seed of the generator passes too.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
ORACLE = ROOT.parent / "shared" / "upstream-oracles" / "mimo_audio"
RELEASE = ORACLE / "model" / "MiMo-Audio-7B-Base"
AUDIO_TOKENIZER = ORACLE / "model" / "MiMo-Audio-Tokenizer"
# slow: converting and loading the release and compiling each request's forward take 10-20 s on two cores
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not ORACLE.is_dir(), reason=f"the MiMo-Audio oracle ({ORACLE}) is absent")]
LOGPROB_TOLERANCE = 1e-4  # fp32 log-probs, absolute


def oracle(name: str) -> np.ndarray:
  return np.load(ORACLE / "outputs" / f"{name}.npy")


@pytest.fixture(scope="module")
def meta():
  return json.loads((ORACLE / "meta.json").read_text())


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """The release converted by checkpoints_conversion.convert with no flags (found by its modeling class), bf16 kept."""
  from checkpoints_conversion import convert

  output = tmp_path_factory.mktemp("mimo") / "ckpt"
  manifest = convert.convert(str(RELEASE), str(output), dtype="bfloat16")
  return output, manifest


@pytest.fixture(scope="module")
def model(converted):
  from s2sjax.scoring.checkpoints import checkpoint

  output, _ = converted
  return checkpoint.load_config(output), checkpoint.load_params(output, dtype=np.float32)


def test_mimo_conversion_keeps_every_released_number(converted, model, meta):
  """Every tensor of the release lands in the checkpoint bit for bit (bf16 kept), the <|empty|> id is the
  tokenizer's, the text tokenizer is copied."""
  from checkpoints_conversion import safetensors_io
  from s2sjax.scoring.architectures import mimo_audio

  output, manifest = converted
  config, params = model
  assert manifest["empty_token_id"] == config.empty_id == meta["special_ids"]["empty"]
  assert (output / "tokenizer" / "tokenizer.json").is_file()
  release = safetensors_io.SafetensorsFile(str(RELEASE / "model.safetensors"))
  read = {piece.key for rule in mimo_audio.rules(config) for piece in rule.pieces}
  assert read == set(meta["llm_state_dict"]) == set(release.keys())
  for rule in mimo_audio.rules(config):
    leaf = params
    for key in rule.target:
      leaf = leaf[key]
    pieces = [rule.to_target(np.asarray(release.read(p.key), np.float32), p, rule.per_layer_shape(leaf.shape))
              for p in rule.pieces]
    np.testing.assert_array_equal(np.asarray(leaf), np.stack(pieces) if rule.stacked else pieces[0],
                                  err_msg="/".join(rule.target))


def test_mimo_requests_are_laid_as_upstreams_get_input_ids(converted, model, meta):
  """S->T: the prefix text segment, the audio segment between <|sosp|> and <|eosp|>, the candidate's text segment;
  the continuation: a <|sosp|> text segment and an unwrapped audio segment, id for id upstream's input_ids."""
  from s2sjax.scoring.checkpoints import checkpoint
  from tasks.mimo_prompt import MimoLayout, input_ids, join

  config, _ = model
  tokenizer = checkpoint.load_tokenizer(converted[0])
  layout = MimoLayout.from_tokens(tokenizer.convert_tokens_to_ids, config.empty_codes, config.group_size)
  text = lambda s: layout.text(tokenizer(s, add_special_tokens=False)["input_ids"])
  prompt = join(text(meta["a2t"]["prefix_text"]), layout.audio(np.load(ORACLE / "inputs" / "a2t_audio_codes.npy")))
  np.testing.assert_array_equal(input_ids(*prompt), oracle("a2t_prompt_input_ids"))
  for name in ("a2t_c0", "a2t_c1"):
    candidate = layout.text(np.load(ORACLE / "inputs" / f"{name}_text_ids.npy"))
    np.testing.assert_array_equal(input_ids(*join(prompt, candidate)), oracle(f"{name}_input_ids"))
  codes = np.load(ORACLE / "inputs" / "cont_audio_codes.npy")
  cont = join(text("<|sosp|>"), layout.audio(codes, wrapped=False))
  np.testing.assert_array_equal(input_ids(*cont), oracle("cont_input_ids"))


@pytest.fixture(scope="module")
def outputs(model):
  from s2sjax.model.mimo_audio import sequence_outputs, split_input_ids

  config, params = model
  return {name: sequence_outputs(config, params, *split_input_ids(config, oracle(f"{name}_input_ids")))
          for name in ("a2t_c0", "a2t_c1", "cont")}


def test_mimo_patch_embedding_stages_match_upstream(outputs):
  """The bf16-rounded speech sum exactly; the input local transformer, the group downcast, the global inputs and
  the global stack's final-normed states within fp32 error of their largest magnitude."""
  stages = {"input_local_out": "input_local_out", "speech_downcast": "speech_group_downcast_out",
            "inputs": "inputs_embeds", "hidden": "last_hidden"}
  for name in ("a2t_c0", "cont"):
    np.testing.assert_array_equal(outputs[name]["input_local_in"], oracle(f"{name}_input_local_in"))
    for ours, theirs in stages.items():
      expected = oracle(f"{name}_{theirs}")
      error = np.abs(outputs[name][ours] - expected).max() / np.abs(expected).max()
      assert error < 1e-5, f"{name} {ours}: {error}"


def test_mimo_text_head_and_candidate_nlls_match_upstream(outputs):
  """The text head's log-softmax after every patch within 1e-4, and each candidate's per-token log-probs (rows
  P-1..P+n-2) and NLL sum as upstream's nll.json."""
  nll = json.loads((ORACLE / "outputs" / "nll.json").read_text())
  for name in ("a2t_c0", "a2t_c1", "cont"):
    assert np.abs(outputs[name]["text"] - oracle(f"{name}_text_logprobs")).max() < LOGPROB_TOLERANCE, name
  for name in ("a2t_c0", "a2t_c1"):
    first, stop = nll[name]["rows"]
    ids = nll[name]["token_ids"]
    found = outputs[name]["text"][np.arange(first, stop + 1), ids]  # rows P-1..P+n-2, both ends given
    np.testing.assert_allclose(found, nll[name]["token_logprobs"], rtol=0, atol=LOGPROB_TOLERANCE)
    assert abs(-found.sum() - nll[name]["nll_sum"]) < LOGPROB_TOLERANCE * len(ids)


def test_mimo_patch_decoder_log_probs_match_upstream_teacher_forcing(outputs, model):
  """The patch decoder of each scored continuation patch, read from the previous patch's global state, teacher
  forced with the 0-1-...-7 delay: every channel's log-softmax (its empty id included) per [patch, frame] within
  1e-4, its hidden states, the step table, and the NLL sum of the 96 scored codes."""
  from s2sjax.model.mimo_audio import local_schedule

  config, _ = model
  np.testing.assert_array_equal(local_schedule(config), oracle("cont_local_step_of_frame")[0])
  scored = oracle("cont_local_logprobs_ch01").shape[0]
  patches = len(outputs["cont"]["text"])
  rows = slice(patches - scored - 1, patches - 1)  # patch g + 1 is read from patch g
  first, rest = oracle("cont_local_logprobs_ch01"), oracle("cont_local_logprobs_ch2to7")
  expected = {c: first[:, :, c] if c < 2 else rest[:, :, c - 2] for c in range(config.channels)}
  for c in range(config.channels):
    assert np.abs(outputs["cont"]["local"][c][rows] - expected[c]).max() < LOGPROB_TOLERANCE, f"channel {c}"
  hidden = oracle("cont_local_hidden")
  assert np.abs(outputs["cont"]["local_hidden"][rows] - hidden).max() / np.abs(hidden).max() < 1e-5
  codes = np.load(ORACLE / "inputs" / "cont_audio_codes.npy")[-scored * config.group_size:]
  codes = codes.reshape(scored, config.group_size, config.channels)
  total = sum(-np.take_along_axis(outputs["cont"]["local"][c][rows], codes[..., c, None], -1).sum()
              for c in range(config.channels))
  nll = json.loads((ORACLE / "outputs" / "nll.json").read_text())["cont"]
  assert abs(total - nll["nll_sum_all"]) < LOGPROB_TOLERANCE * codes.size


def test_mimo_logprobs_command_reads_upstreams_input_ids(converted):
  """s2sjax.logprobs' hook: input_ids [9, 4T] as upstream lays them -> the text head after every patch and the
  patch decoder per [patch, frame, channel], -inf past a channel's vocabulary."""
  from s2sjax.scoring import log_probs
  from s2sjax.scoring.sequence_inputs import LogProbsError

  output, _ = converted
  result = log_probs.compute(str(output), oracle("cont_input_ids"))
  text, local = result.text, result.codebooks
  assert np.abs(text - oracle("cont_text_logprobs")).max() < LOGPROB_TOLERANCE
  scored = oracle("cont_local_logprobs_ch01")
  rows = slice(len(text) - len(scored) - 1, len(text) - 1)
  assert np.abs(local[rows, :, :2, :scored.shape[-1]] - scored).max() < LOGPROB_TOLERANCE
  assert np.isneginf(local[:, :, 2:, oracle("cont_local_logprobs_ch2to7").shape[-1]:]).all()
  with pytest.raises(LogProbsError, match=r"reads input_ids \[9, 4 x patches\]"):
    log_probs.compute(str(output), oracle("cont_input_ids")[:, :-1])
  bad = oracle("cont_input_ids").copy()
  bad[3, 5] = 129
  with pytest.raises(LogProbsError, match=r"input_ids\[3\] \(channel 2\) holds codes outside its table \(0..128\)"):
    log_probs.compute(str(output), bad)


def release_copy(tmp_path: Path, config_changes: dict | None = None, tensors=None) -> Path:
  """The release folder copied, its config.json changed and its tensors replaced where asked."""
  from checkpoints_conversion import safetensors_io

  folder = tmp_path / "release"
  shutil.copytree(RELEASE, folder)
  if config_changes:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, **config_changes)))
  if tensors is not None:
    release = safetensors_io.SafetensorsFile(str(RELEASE / "model.safetensors"))
    changed = {key: release.read(key) for key in release.keys()}
    changed.update(tensors(changed))
    safetensors_io.write(str(folder / "model.safetensors"), {k: v for k, v in changed.items() if v is not None})
  return folder


@pytest.mark.parametrize("problem,change,message", [
  ("misshaped", {"tensors": lambda t: {"speech_embeddings.2.weight": t["speech_embeddings.2.weight"][:-1]}},
   r"speech_embeddings.2.weight.*\(128, 32\).*\(129, 32\)"),
  ("missing", {"tensors": lambda t: {"local_transformer_lm_heads.7.weight": None}},
   r"local_transformer_lm_heads.7.weight"),
  ("model_type", {"config_changes": {"model_type": "llama"}}, r"model_type='llama' is not MiMo-Audio's"),
])
def test_mimo_convert_names_what_is_wrong_with_a_release_in_one_line(tmp_path, problem, change, message):
  import re

  folder = release_copy(tmp_path, **change)
  done = subprocess.run([sys.executable, "-m", "checkpoints_conversion.convert", f"--source={folder}",
                         f"--output={tmp_path / 'out'}"], cwd=str(ROOT), capture_output=True, text=True, timeout=600)
  assert done.returncode == 1 and re.search(message, done.stderr), done.stderr[-2000:]
  assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def test_mimo_codes_outside_a_channel_are_refused_before_scoring(model):
  """The scorer's id check names the row, position, frame and channel of a code past that channel's table, in a
  patch or in a speech target (target_ids -1); a text target past the text table is named too."""
  from s2sjax.scoring.architectures import mimo_audio
  from s2sjax.scoring.scorer import ScoringError

  config, _ = model
  width = config.group_size * config.channels
  empty = np.tile(np.asarray(config.empty_codes, np.int32), config.group_size)
  rows = {"text_ids": np.zeros((1, 4), np.int32), "patch_codes": np.tile(empty, (1, 4, 1)),
          "target_ids": np.array([[5, -1]], np.int32), "target_codes": np.stack([np.full(width, -1), empty - 1])[None]}
  mimo_audio.check_ids(rows, config)
  for field, position, value in (("patch_codes", 2, config.speech_vocab_sizes[3]), ("target_codes", 1, -1)):
    broken = {k: v.copy() for k, v in rows.items()}
    broken[field][0, position, config.channels + 3] = value
    with pytest.raises(ScoringError, match=rf"{field}\[row 0, position {position}\] frame 1 channel 3 = {value} is "
                                           r"outside channel 3's"):
      mimo_audio.check_ids(broken, config)
  with pytest.raises(ScoringError, match=rf"target_ids\[row 0, position 0\] = {config.vocab_size} is outside"):
    mimo_audio.check_ids(dict(rows, target_ids=np.array([[config.vocab_size, -1]], np.int32)), config)


def laid_requests(td, config) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
  """Per (question, candidate) the request as the rows hold it: (text ids [T], codes [T, group * K]) of the prefix and
  the candidate's laid patches, then its last target as a patch (a text token over empty codes, or a patch of
  speech), and the candidate's targets (text ids, -1 for speech patches; the speech patches' codes)."""
  rows, table = td.rows, td.metadata.questions
  empty = np.tile(np.asarray(config.empty_codes, np.int32), config.group_size)
  out = {}
  for record in table:
    for c, (item, j) in enumerate(record["slots"]):
      r, s = np.argwhere((rows["slot_item"] == item) & (rows["slot_candidate"] == j))[0]
      mine = rows["target_slot"][r] == s
      ids, codes = rows["target_ids"][r][mine], rows["target_codes"][r][mine]
      laid = (rows["segment_ids"][r] == rows["segment_ids"][r, rows["target_pos"][r][mine][0]]) & np.isin(
          rows["branch_ids"][r], (0, j + 1))
      last_text, last_codes = (config.empty_id, codes[-1]) if ids[-1] < 0 else (ids[-1], empty)
      out[(record["id"], c)] = (np.append(rows["text_ids"][r][laid], last_text),
                                np.concatenate([rows["patch_codes"][r][laid], last_codes[None]]), ids, codes)
  return out


SAMPLE_MODALITIES = ("s2t", "s2s", "t2s")


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory, converted, model):
  """The bundled sample built for MiMo-Audio by tasks.prepare in every modality of SAMPLE_MODALITIES (codes from the
  JAX tokenizer of the oracle's MiMo-Audio-Tokenizer) and scored by one s2sjax.eval run from the checkpoint the
  project's converter wrote: (data dir, run folder, {modality: laid_requests})."""
  from s2sjax.commands.eval import EvalConfig, run
  from s2sjax.data.task_data import load_task_data
  from s2sjax.scoring.evaluator import ScoringOptions
  from tasks.preparation import prepare

  ckpt, _ = converted
  config, _ = model
  root = tmp_path_factory.mktemp("mimo_sample")
  data, out = str(root / "data"), root / "out"
  for modality in SAMPLE_MODALITIES:
    prepare("sstorycloze", "mimo_audio", modality, None, data, tokenizer_dir=str(ckpt / "tokenizer"),
            audio_tokenizer_dir=str(AUDIO_TOKENIZER))
  run(EvalConfig(tasks=("sstorycloze",), modalities=SAMPLE_MODALITIES, checkpoints=str(ckpt), spec="mimo_audio",
                 data_dir=data, output_dir=str(out), chunk_rows=2, scoring=ScoringOptions(batch_size=2)))
  laid = {modality: laid_requests(load_task_data(data, "sstorycloze", modality, "mimo_audio", None), config)
          for modality in SAMPLE_MODALITIES}
  return data, out / ckpt.name, laid


def jsonl(path: Path) -> dict[tuple[str, int], dict]:
  return {(line["question"], line["candidate"]): line for line in map(json.loads, open(path))}


@pytest.mark.parametrize("modality", SAMPLE_MODALITIES)
def test_mimo_bundled_sample_end_to_end_scores_each_item_as_the_model_alone(converted, model, sample_run, modality):
  """`sample_run`, in every modality: a results file per candidate, each candidate's NLL the model's forward on that
  request alone (every scored log-prob within 1e-4): a written candidate's the text head's, a spoken one's the patch
  decoder's over every frame and channel of each patch, and the details file's per-channel NLLs (spoken candidates
  only) each channel's part of it; the pre-flight passes."""
  from s2sjax.model.mimo_audio import sequence_outputs
  from s2sjax.data.task_data import load_task_data
  from s2sjax.scoring import preflight
  from s2sjax.scoring.checkpoints import checkpoint

  ckpt, _ = converted
  config, params = model
  data, run_dir, laid = sample_run
  longest = max(len(text) for text, *_ in laid[modality].values())
  lines = jsonl(run_dir / f"sstorycloze-{modality}.scores.jsonl")
  spoken = modality.endswith("s")
  details_path = run_dir / f"sstorycloze-{modality}.details.jsonl"
  assert details_path.exists() == spoken
  details = jsonl(details_path) if spoken else {}
  assert set(lines) == set(laid[modality]) and set(details) <= set(lines)
  for key, (text, codes, ids, target_codes) in laid[modality].items():
    # one compiled shape for every request: patches past its end change none of its (causal) outputs
    padded_text = np.concatenate([text, np.full(longest - len(text), config.empty_id, np.int32)])
    padded = np.concatenate([codes, np.tile(codes[-1:], (longest - len(text), 1))])
    out_alone = sequence_outputs(config, params, padded_text, padded.reshape(longest, config.group_size, -1))
    n = len(ids)
    rows = np.arange(len(text) - n - 1, len(text) - 1)  # each target read after the patch before it
    if not spoken:
      scored = out_alone["text"][rows, ids].astype(np.float64)
    else:
      patches = target_codes.reshape(n, config.group_size, config.channels)
      scored = np.stack([np.take_along_axis(channel[rows], patches[..., c, None], -1)[..., 0]
                         for c, channel in enumerate(out_alone["local"])]).astype(np.float64)  # [channels, n, group]
      assert (ids == -1).all()
      assert details[key]["uttid"] == lines[key]["uttid"], key
      for c in range(config.channels):
        assert abs(details[key][f"nll_sum_channel_{c}"] + scored[c].sum()) < LOGPROB_TOLERANCE * scored[c].size, key
    # n tokens or patches counted; every scored log-prob (a patch: group_size x channels of them) within 1e-4
    assert lines[key]["n_tokens"] == n, key
    assert abs(lines[key]["nll_sum"] + scored.sum()) < LOGPROB_TOLERANCE * scored.size, key
  td = load_task_data(data, "sstorycloze", modality, "mimo_audio", None)
  verdicts = preflight.run(checkpoint.open(str(ckpt)), spec="mimo_audio", data=td)
  assert all(v.ok for v in verdicts), preflight.table(verdicts)
  assert ("audio reaches the model" in {v.check for v in verdicts}) == modality.startswith("s")


def test_mimo_bundled_sample_speech_patches_are_its_waves_codes(model, sample_run):
  """Each spoken prefix's speech patches in `sample_run`'s S->T and S->S rows: its wave's codes from the JAX
  tokenizer, laid as upstream lays an audio segment."""
  from tasks.audio.base import load_audio
  from tasks.audio.mimo_audio import MimoAudioTokenizer
  from tasks.mimo_prompt import MimoLayout
  from tasks.release import read_questions
  from tasks.sample import RELEASE_DIR

  config, _ = model
  _, _, laid = sample_run
  tokenizer = MimoAudioTokenizer(str(AUDIO_TOKENIZER))
  layout = MimoLayout(0, 0, config.empty_id, config.empty_codes, config.group_size)
  width = config.group_size * config.channels
  for question in read_questions("sstorycloze", RELEASE_DIR)[:2]:
    _, expected = layout.audio(tokenizer.encode(load_audio(question.audio_paths[0], 24000), question.uttids[0]),
                               wrapped=False)
    for modality in ("s2t", "s2s"):
      text, codes, *_ = laid[modality][(question.id, 0)]
      speech = np.flatnonzero(text == config.empty_id)[: len(expected)]
      np.testing.assert_array_equal(codes[speech], expected.reshape(-1, width), err_msg=modality)


def test_mimo_details_file_holds_upstreams_per_channel_nlls_and_is_the_same_after_a_resume(tmp_path, converted, model):
  """S->S over the oracle's own continuation: every spoken prefix of the bundled sample given the oracle's prompt
  frames and each question's first spoken candidate its scored frames (precomputed codes; the other candidate
  random codes), so that request is upstream's `cont` (<|sosp|> then the audio, unwrapped). Its
  `nll_sum_channel_c` in the details file is minus the sum, over its patches and frames, of upstream's
  patch-decoder log-softmax at channel c's code (within 1e-4 a log-prob); every candidate's channels add up to its
  scores-file NLL. A chunk deleted with both files and the run resumed writes the same details file, byte for
  byte."""
  import yaml

  from s2sjax.commands.eval import EvalConfig, run
  from s2sjax.data.spec import SPECS_DIR
  from s2sjax.scoring.evaluator import ScoringOptions
  from tasks.preparation import prepare
  from tasks.release import read_questions
  from tasks.sample import RELEASE_DIR

  ckpt, _ = converted
  config, _ = model
  first, rest = oracle("cont_local_logprobs_ch01"), oracle("cont_local_logprobs_ch2to7")
  expected = [first[:, :, c] if c < 2 else rest[:, :, c - 2] for c in range(config.channels)]
  scored = len(first)
  cont = np.load(ORACLE / "inputs" / "cont_audio_codes.npy")
  prompt_codes, candidate_codes = cont[: -scored * config.group_size], cont[-scored * config.group_size:]
  patches = candidate_codes.reshape(scored, config.group_size, config.channels)
  upstream = [-np.take_along_axis(lp, patches[..., c, None], -1).sum() for c, lp in enumerate(expected)]

  codes = tmp_path / "codes"
  (codes / "candidates").mkdir(parents=True)
  rng = np.random.default_rng(0)
  questions = read_questions("sstorycloze", RELEASE_DIR)
  for question in questions:
    for c, (uttid, path) in enumerate(zip(question.uttids, question.candidate_audio_paths)):
      other = rng.integers(0, np.asarray(config.empty_codes), (int(rng.integers(3, 13)), config.channels))
      np.save(codes / f"{uttid}.npy", prompt_codes)
      np.save(codes / "candidates" / f"{Path(path).stem}.npy", candidate_codes if c == 0 else other)
  fields = yaml.safe_load(open(Path(SPECS_DIR) / "mimo_audio.yaml"))
  spec = tmp_path / "mimo_audio_codes.yaml"
  spec.write_text(yaml.safe_dump(dict(fields, name="mimo_audio_codes", audio_tokenizer={"type": "precomputed"})))
  data, out = str(tmp_path / "data"), tmp_path / "out"
  prepare("sstorycloze", str(spec), "s2s", 64, data, tokenizer_dir=str(ckpt / "tokenizer"),
          audio_tokenizer_dir=str(codes))
  evaluate = lambda: run(EvalConfig(tasks=("sstorycloze",), modalities=("s2s",), checkpoints=str(ckpt),
                                    spec=str(spec), row_length=64, data_dir=data, output_dir=str(out), chunk_rows=2,
                                    scoring=ScoringOptions(batch_size=2)))
  evaluate()
  run_dir = out / ckpt.name
  details_path = run_dir / "sstorycloze-s2s.details.jsonl"
  written = details_path.read_bytes()
  details, lines = jsonl(details_path), jsonl(run_dir / "sstorycloze-s2s.scores.jsonl")
  assert set(details) == set(lines) == {(q.id, c) for q in questions for c in range(2)}
  for (question, c), line in details.items():
    found = [line[f"nll_sum_channel_{channel}"] for channel in range(config.channels)]
    if c == 0:
      np.testing.assert_allclose(found, upstream, rtol=0, atol=LOGPROB_TOLERANCE * scored * config.group_size)
    assert abs(sum(found) - lines[(question, c)]["nll_sum"]) < 1e-6 * lines[(question, c)]["nll_sum"], question

  chunks = sorted((out / "chunks").rglob("chunk-*.npz"))
  assert len(chunks) > 1
  for path in (chunks[0], details_path, run_dir / "sstorycloze-s2s.scores.jsonl"):
    path.unlink()
  evaluate()
  assert details_path.read_bytes() == written
