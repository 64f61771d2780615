"""MaxText checkpoints read as MaxText wrote them (s2sjax/scoring/checkpoints/stacks), held to ../shared/upstream-oracles/maxtext:
checkpoints written by MaxText's own training code (qwen2.5-7b and llama3.1-8b shrunk, scanned and not, a full
training state and a params-only folder each) and the log-softmax MaxText's own forward computed from them. The run
config given is the oracle's train.py command line, nothing else."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from checkpoints_conversion import convert
from s2sjax.scoring import log_probs, own_forward
from s2sjax.scoring.checkpoints import checksums
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.runtime import sharding
from s2sjax.model import decoder
from s2sjax.scoring.checkpoints.stacks import maxtext, maxtext_config
from s2sjax.scoring.checkpoints.stacks.maxtext_config import MaxTextConfigError, RunConfig
from tests.stack_fixtures import (CONFIGS, KINDS, LENGTHS, MAXTEXT, folder, needs_maxtext_oracle,
                                  run_config)

pytestmark = needs_maxtext_oracle
TOLERANCE = 1e-4  # fp32 log-probs against MaxText's own forward
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ("base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=2 head_dim=16 base_mlp_dim=96 "
        "base_num_decoder_layers=3 vocab_size=256")


def padded_reference(config: str) -> list[np.ndarray]:
  """MaxText's log-probs at every valid position of each padded sequence, and the sequences."""
  ids = np.load(MAXTEXT / "inputs_padded.npz")["inputs"]
  reference = np.load(MAXTEXT / config / "logprobs_padded.npy")
  return [(ids[b, :n], reference[b, :n]) for b, n in enumerate(LENGTHS)]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("config", CONFIGS)
def test_every_checkpoint_gives_maxtexts_own_log_probs_through_s2sjax_logprobs(config, kind):
  for ids, reference in padded_reference(config):
    ours = log_probs.compute(folder(config, kind), ids, maxtext_run_config=run_config(config)).text
    error = float(np.abs(ours - reference).max())
    print(f"{config} {kind}: max |log-prob - MaxText| {error:.2e} over {len(ids)} positions")
    assert ours.dtype == np.float32 and error <= TOLERANCE


@pytest.mark.slow
def test_the_logprobs_command_reads_a_step_folder_with_the_run_config_alone(tmp_path):
  ids, reference = padded_reference("llama3.1_scan")[0]
  np.save(tmp_path / "ids.npy", ids)
  subprocess.run([sys.executable, "-m", "s2sjax.logprobs", f"--checkpoint={folder('llama3.1_scan', 'training state')}",
                  f"--input_ids={tmp_path / 'ids.npy'}", f"--output={tmp_path / 'out.npy'}",
                  f"--maxtext_config={run_config('llama3.1_scan')}"], check=True, cwd=ROOT, capture_output=True)
  assert np.abs(np.load(tmp_path / "out.npy") - reference).max() <= TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
def test_packed_rows_scored_through_the_live_tree_give_maxtexts_packed_forward(config):
  """MaxText's packed inputs (two sequences a row, positions restarting, segment ids) through the in-memory adapter
  and the decoder as an own forward: MaxText's forward on them is its padded log-probs, bit for bit (meta.json)."""
  step = maxtext.StepFolder(folder(config, "training state"), RunConfig.parse(run_config(config)))
  live = {"params": step.restore_tree(sharding.make_mesh())}  # MaxText's tree, as its train state holds it
  params = maxtext.params_adapter(run_config(config))(live)
  forward = own_forward.decoder_forward(maxtext.decoder_config(run_config(config)))
  packed = np.load(MAXTEXT / "inputs_packed.npz")
  logits = forward.apply(params, packed["inputs"], packed["inputs_position"], packed["inputs_segmentation"])
  ours = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  padded = np.load(MAXTEXT / config / "logprobs_padded.npy")
  expected = [np.concatenate([padded[0, :40], padded[1, :24]]), np.concatenate([padded[1, :25], padded[0, :39]])]
  for row, reference in enumerate(expected):
    assert np.abs(ours[row, : len(reference)] - reference).max() <= TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
def test_the_map_is_maxtexts_own_hugging_face_export(config, tmp_path):
  """MaxText's to_huggingface (its PARAM_MAPPING and hook functions: query rescaled, rope features permuted to
  halves) and this reader give the decoder the same weights: hf/ converted as any HF checkpoint is."""
  convert.convert(str(MAXTEXT / config / "hf"), str(tmp_path / "hf"))
  theirs = checkpoint.load_params(str(tmp_path / "hf"))
  ours = checkpoint.open(folder(config, "params only"), RunConfig.parse(run_config(config))).load_params()
  assert checkpoint.load_config(str(tmp_path / "hf")).rope_scaling == maxtext.decoder_config(
    run_config(config)).rope_scaling
  for (path, a), (_, b) in zip(checkpoint.flatten(ours), checkpoint.flatten(theirs), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7, err_msg="/".join(path))


def test_restored_sharded_onto_the_evaluation_mesh_as_the_decoders_parameters_are():
  mesh = sharding.make_mesh("data:2,fsdp:2,model:2")
  run = RunConfig.parse(run_config("qwen2.5_scan"))
  loaded = maxtext.StepFolder(folder("qwen2.5_scan", "params only"), run).load(mesh)
  one_device = sharding.make_mesh("data:1", jax.devices()[:1])
  alone = maxtext.StepFolder(folder("qwen2.5_scan", "params only"), run).load(one_device)
  wanted = sharding.logical_to_sharding(decoder.param_logical_axes(loaded.config),
                                        decoder.abstract_params(loaded.config), mesh)
  for (path, leaf), (_, where), (_, single) in zip(checkpoint.flatten(loaded.params), checkpoint.flatten(wanted),
                                                   checkpoint.flatten(alone.params), strict=True):
    assert leaf.sharding.is_equivalent_to(where, leaf.ndim), path
    np.testing.assert_array_equal(np.asarray(leaf), np.asarray(single))
  assert not loaded.params["embed"]["embedding"].sharding.is_fully_replicated  # vocab x embed over model x fsdp


def on_disk(items: str, path: str) -> np.ndarray:
  """One array of a MaxText items/ folder read with tensorstore alone: zarr3 under the OCDBT key `a.b.c/` of tree
  path a/b/c (PROVENANCE.txt, section 6)."""
  import tensorstore

  key = path.replace("/", ".") + "/"
  spec = {"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": f"file://{items}/", "path": key}}
  return np.asarray(tensorstore.open(spec).result().read().result())


def test_every_leaf_read_is_checksummed_as_written():
  """The checksums `load` returns are those of the arrays on disk (read by tensorstore on the host), and the
  content id tells two folders apart."""
  step = maxtext.StepFolder(folder("llama3.1_noscan", "params only"), RunConfig.parse(run_config("llama3.1_noscan")))
  loaded = step.load()
  assert len(loaded.checksums) == 3 * 9 + 3
  for path, checksum in loaded.checksums.items():
    assert checksum == checksums.host_checksum(on_disk(str(step.path / "items"), f"params/params/{path}")), path
  other = maxtext.StepFolder(folder("llama3.1_noscan", "training state"), step.run)
  assert step.content_id() != other.content_id()


def test_a_copy_reads_alike_and_a_rewritten_step_is_another_checkpoint(tmp_path):
  run = RunConfig.parse(run_config("qwen2.5_noscan"))
  copy = shutil.copytree(folder("qwen2.5_noscan", "params only"), tmp_path / "params_only")
  first = maxtext.StepFolder(copy, run).content_id()
  assert first == maxtext.StepFolder(folder("qwen2.5_noscan", "params only"), run).content_id()
  metadata = json.loads((copy / "_CHECKPOINT_METADATA").read_text())
  (copy / "_CHECKPOINT_METADATA").write_text(json.dumps(dict(metadata, commit_timestamp_nsecs=1)))  # orbax rewrote it
  assert maxtext.StepFolder(copy, run).content_id() != first


def test_a_folder_orbax_has_not_committed_is_refused(tmp_path):
  copy = shutil.copytree(folder("qwen2.5_scan", "training state"), tmp_path / "1")
  (copy / "commit_success.txt").unlink()
  assert maxtext.is_step_folder(copy) and not maxtext.is_committed(copy)
  with pytest.raises(maxtext.MaxTextError, match="no commit_success.txt: orbax is still writing it"):
    maxtext.StepFolder(copy, RunConfig.parse(run_config("qwen2.5_scan")))


def test_a_glob_over_a_training_run_leaves_out_the_steps_orbax_is_still_writing(tmp_path):
  from s2sjax.scoring.checkpoints import paths as checkpoint_paths

  steps = tmp_path / "run" / "checkpoints"
  for name in ("1", "2"):
    shutil.copytree(folder("qwen2.5_scan", "training state"), steps / name)
  (steps / "2" / "commit_success.txt").unlink()  # written in place (a bucket): committed last
  (steps / "3.orbax-checkpoint-tmp").mkdir()  # written aside (a local disk): renamed when done
  assert checkpoint_paths.expand(f"{steps}/*") == [str(steps / "1")]


def test_the_items_path_maxtext_users_pass_names_its_step_folder():
  items = os.path.join(folder("llama3.1_scan", "training state"), "items")
  assert maxtext.StepFolder(items, RunConfig.parse(run_config("llama3.1_scan"))).path == MAXTEXT / "llama3.1_scan" / \
      "run" / "checkpoints" / "1"


def test_the_config_yml_maxtext_saves_beside_a_run_is_read_without_a_flag(tmp_path):
  import yaml

  run = shutil.copytree(MAXTEXT / "llama3.1_scan" / "run", tmp_path / "run")
  keys = dict(token.split("=", 1) for token in run_config("llama3.1_scan").split() if "=" in token)
  (run / "config.yml").write_text(yaml.safe_dump(keys))  # save_config_to_gcs's dump of the raw keys
  assert checkpoint.load_config(str(run / "checkpoints" / "1")) == maxtext.decoder_config(run_config("llama3.1_scan"))
  with pytest.raises(MaxTextConfigError, match="no run config says which model it holds.*--maxtext_config"):
    checkpoint.load_config(folder("llama3.1_scan", "training state"))


@pytest.mark.parametrize("overrides,refusal", [
  ("model_name=gemma-2b", "model_name='gemma-2b' is not a MaxText model this reader maps; it reads qwen2.5-1.5b"),
  ("model_name=qwen2.5-7b use_qk_norm=true", "use_qk_norm=True is not implemented by this decoder"),
  ("model_name=llama3.1-8b final_logits_soft_cap=30.0", "final_logits_soft_cap=30.0 is not implemented"),
  ("model_name=llama3.1-8b mlp_activations=[gelu,linear]", "mlp_activations=\\['gelu', 'linear'\\]"),
  ("model_name=qwen2.5-7b global_parameter_scale=2", "global_parameter_scale=2 is not implemented"),
])
def test_models_and_switches_the_decoder_does_not_implement_are_refused_by_name(overrides, refusal):
  with pytest.raises(MaxTextConfigError, match=refusal):
    maxtext.decoder_config(overrides)


def test_a_run_config_of_another_model_names_every_leaf_that_does_not_fit():
  with pytest.raises(maxtext.MaxTextError, match=r"(?s)does not hold the qwen2.5-7b.*decoder/layers/mlp/wi_0/kernel: "
                                                 r"checkpoint \[64, 3, 96\], run config implies \[3584, 28, 18944\]"):
    maxtext.StepFolder(folder("qwen2.5_scan", "params only"), RunConfig.parse("model_name=qwen2.5-7b"))
  with pytest.raises(maxtext.MaxTextError, match="holds unscanned layers, but .* says scan_layers=True"):
    maxtext.StepFolder(folder("llama3.1_noscan", "params only"),
                       RunConfig.parse(f"model_name=llama3.1-8b {TINY} scan_layers=True"))


def test_the_conventions_maxtext_follows_per_model():
  """Llama 3.1's query kernel carries 1/sqrt(head_dim) and its rope rotates interleaved pairs with Llama 3.1's
  scaling; Llama 3 (model_name not llama3.1) rotates halves unscaled; Qwen2 scales at run time, with biases; a tied
  head is MaxText's embedding table in bfloat16, divided by sqrt(emb) unless normalize_embedding_logits=false."""
  llama31 = maxtext_config.describe(RunConfig.parse("model_name=llama3.1-8b"))
  assert (llama31.query_scale, llama31.interleaved_rope, llama31.config.rope_scaling) == (
    np.sqrt(128), True, (8.0, 1.0, 4.0, 8192.0))
  llama3 = maxtext_config.describe(RunConfig.parse("model_name=llama3-8b"))
  assert (llama3.query_scale, llama3.interleaved_rope, llama3.config.rope_scaling) == (np.sqrt(128), False, ())
  qwen = maxtext_config.describe(RunConfig.parse("model_name=qwen2.5-1.5b"))
  assert (qwen.query_scale, qwen.config.qkv_bias, qwen.tied_head, qwen.head_divisor) == (1.0, True, True, 1.0)
  assert maxtext_config.describe(RunConfig.parse("model_name=qwen2.5-1.5b normalize_embedding_logits=true")
                                 ).head_divisor == np.sqrt(1536)


def test_a_tied_head_is_the_embedding_in_bfloat16():
  model = maxtext_config.describe(RunConfig.parse(f"model_name=qwen2.5-1.5b {TINY} normalize_embedding_logits=true"))
  step = maxtext.StepFolder(folder("qwen2.5_scan", "params only"), RunConfig.parse(run_config("qwen2.5_scan")))
  tree = step.restore_tree(sharding.make_mesh())
  tree = dict(tree, decoder={k: v for k, v in tree["decoder"].items() if k != "logits_dense"})
  params = maxtext.to_decoder_params(model, tree)
  table = np.asarray(tree["token_embedder"]["embedding"])
  expected = np.asarray(jax.numpy.asarray(table, jax.numpy.bfloat16), np.float32) / np.float32(8.0)
  np.testing.assert_array_equal(np.asarray(params["lm_head"]["kernel"]), expected.T)
  np.testing.assert_array_equal(np.asarray(params["embed"]["embedding"]), table)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5_scan", "llama3.1_noscan"])
def test_an_s2sbench_eval_of_maxtext_checkpoints_runs_end_to_end(bytes_sample, tmp_path, name):
  """Both checkpoints of a run (full state and params-only) on every modality of the sample, through the command
  line with the run config alone (its tokenizer_path naming the tokenizer, as MaxText's key does); every
  candidate's summed NLL is the decoder's log-probs on prefix + candidate, which match MaxText's forward above.
  Each family and each layer layout (scanned, unscanned) once: the command reads a checkpoint through the loader
  that gives every one of the eight MaxText's own log-probs above."""
  config = f"{run_config(name)} tokenizer_type=huggingface tokenizer_path={bytes_sample['tokenizer']}"
  out = tmp_path / "out"
  checkpoints = f"{folder(name, 'training state')},{folder(name, 'params only')}"
  done = subprocess.run([sys.executable, "-m", "s2sjax.eval", "--task=sstorycloze", "--modality=all",
                         f"--spec={bytes_sample['spec']}", f"--data_dir={bytes_sample['data_dir']}",
                         f"--checkpoint={checkpoints}", f"--maxtext_config={config}", f"--output_dir={out}"], cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  runs = {run["name"]: run for run in json.loads((out / "metrics.json").read_text())["runs"]}
  assert sorted(runs) == ["1", "params_only"]
  for run in runs.values():
    assert sorted(run["tasks"]["sstorycloze"]) == ["s2s", "s2t", "t2s", "t2t"]
  # The same weights in both folders: the same numbers.
  assert runs["1"]["tasks"] == runs["params_only"]["tasks"]
  reader = checkpoint.open(folder(name, "params only"), RunConfig.parse(config))
  params, model_config = reader.load_params(), reader.config
  from s2sjax.data.task_data import load_task_data
  cases = []  # (prefix, candidate, the scores file's nll_sum)
  for modality in ("t2t", "s2t"):
    td = load_task_data(bytes_sample["data_dir"], "sstorycloze", modality, bytes_sample["spec"], None)
    lines = [json.loads(line) for line in (out / "1" / f"sstorycloze-{modality}.scores.jsonl").read_text().splitlines()]
    scored = {(line["question"], line["candidate"]): line["nll_sum"] for line in lines}
    where = {tuple(pair): (td.questions.ids[q], c) for q, pairs in enumerate(td.questions.slots)
             for c, pair in enumerate(pairs)}
    rows = td.rows
    for r, slot in list(zip(*np.nonzero(rows["slot_item"] >= 0)))[:6]:
      targets = rows["target_slot"][r] == slot
      segment = rows["segment_ids"][r, rows["target_pos"][r][targets][0]]
      prefix = rows["tokens"][r][(rows["segment_ids"][r] == segment) & (rows["branch_ids"][r] == 0)]
      cases.append((prefix, rows["target_ids"][r][targets],
                    scored[where[(rows["slot_item"][r, slot], rows["slot_candidate"][r, slot])]]))
  # one causal forward of every sequence padded at its end: the padding follows, so no position before it sees it
  width = max(len(prefix) + len(candidate) for prefix, candidate, _ in cases)
  sequences = np.zeros((len(cases), width), np.int32)
  for i, (prefix, candidate, _) in enumerate(cases):
    sequences[i, : len(prefix) + len(candidate)] = np.concatenate([prefix, candidate])
  log_probs = np.asarray(decoder.sequence_log_probs(model_config, params, sequences))
  for i, (prefix, candidate, found) in enumerate(cases):
    nll = -log_probs[i, np.arange(len(prefix) - 1, len(prefix) + len(candidate) - 1), candidate].sum()
    assert found == pytest.approx(nll, abs=TOLERANCE * len(candidate))


def test_the_pre_flight_reads_a_maxtext_folder(bytes_sample):
  config = f"{run_config('llama3.1_noscan')} tokenizer_path={bytes_sample['tokenizer']}"
  done = subprocess.run([sys.executable, "-m", "s2sjax.check", f"--spec={bytes_sample['spec']}",
                         f"--maxtext_config={config}", f"--checkpoint={folder('llama3.1_noscan', 'params only')}"],
                        cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 0, done.stdout + done.stderr[-2000:]
  assert "256 tokens, embedding 256 rows" in done.stdout and "all checks passed" in done.stdout


@pytest.mark.slow
def test_a_maxtext_folder_converts_with_the_checksums_of_what_was_read(tmp_path):
  config = run_config("llama3.1_scan")
  manifest = convert.convert(folder("llama3.1_scan", "training state"), str(tmp_path / "out"),
                             maxtext_run_config=config)
  read = maxtext.StepFolder(folder("llama3.1_scan", "training state"), RunConfig.parse(config)).load()
  assert manifest["source_checksums"] == read.checksums
  assert checkpoint.load_manifest(str(tmp_path / "out"))["source_model_type"] == "maxtext:llama3.1-8b"
  for ids, reference in padded_reference("llama3.1_scan"):
    assert np.abs(log_probs.compute(str(tmp_path / "out"), ids).text - reference).max() <= TOLERANCE


@pytest.mark.slow
def test_a_converted_llama31_exports_to_transformers_with_its_rope_scaling(tmp_path):
  """The converted checkpoint carries Llama 3.1's rope scaling into transformers' config (rope_type llama3), whose
  LlamaForCausalLM then gives MaxText's log-probs."""
  import torch
  from transformers import AutoModelForCausalLM

  from checkpoints_conversion import export_hf

  convert.convert(folder("llama3.1_noscan", "params only"), str(tmp_path / "s2sjax"),
                  maxtext_run_config=run_config("llama3.1_noscan"))
  export_hf.export(str(tmp_path / "s2sjax"), str(tmp_path / "hf"))
  model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
  for ids, reference in padded_reference("llama3.1_noscan"):
    with torch.no_grad():
      logits = model(torch.from_numpy(ids[None].astype(np.int64))).logits[0]
    assert np.abs(torch.log_softmax(logits, -1).numpy() - reference).max() <= TOLERANCE
