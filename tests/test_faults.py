"""Fault trials: what a user breaks on purpose, and what the evaluator, the builder and the converter do about it.
Each ends refused with a named cause, or recovered with the files an uninterrupted run writes (README, "What it
survives")."""

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from checkpoints_conversion.convert import convert
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.commands import eval as s2s_eval
from s2sjax.scoring.checkpoints.checkpoint import CheckpointError
from s2sjax.commands.eval import EvalConfig
from s2sjax.scoring.evaluator import EvalError, ScoringOptions
from s2sjax.runtime.output_dir import LOCK_NAME, OutputError
from tasks.release import Problems, ReleaseError, read_questions
from tests.eval_fixtures import build_sample, later_steps, same_tree
from tests.hf_models import save_hf, tiny_model

# Whole evaluations, builds and conversions are marked slow one by one (some run multi-process subprocesses); the
# trials of one function on hand-made files run in the fast suite.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(setup, out, modalities=("t2t",), **config):
  config = {"checkpoints": setup["ckpt"], "data_dir": setup["data_dir"], "output_dir": str(out), "chunk_rows": 4,
            "row_length": 1024, "scoring": ScoringOptions(batch_size=4), **config}
  return s2s_eval.run(EvalConfig(("sstorycloze",), tuple(modalities), **config))


def _accuracy(out, modality="t2t"):
  return json.load(open(os.path.join(out, "metrics.json")))["runs"][0]["tasks"]["sstorycloze"][modality]


@pytest.mark.slow
def test_a_checkpoint_replaced_at_the_same_path_is_scored_again(tiny_sample, tmp_path):
  path = str(tmp_path / "latest")
  shutil.copytree(tiny_sample["ckpt"], path)
  _run(tiny_sample, tmp_path / "out", checkpoints=path)
  other = later_steps(tiny_sample["ckpt"], (7,), root=str(tmp_path / "other"))[0]
  shutil.rmtree(path)
  shutil.copytree(other, path)  # a training loop overwriting latest/
  _run(tiny_sample, tmp_path / "out", checkpoints=path)
  _run(tiny_sample, tmp_path / "fresh", checkpoints=other)
  assert _accuracy(tmp_path / "out") == _accuracy(tmp_path / "fresh")
  scores = lambda out, name: open(tmp_path / out / name / "sstorycloze-t2t.scores.jsonl").read()
  assert scores("out", "latest") == scores("fresh", "ckpt-7")


@pytest.mark.slow
def test_a_flipped_byte_in_a_parameter_file_is_refused_by_leaf_name(tmp_path):
  convert(save_hf(tiny_model("qwen2"), str(tmp_path / "hf")), str(tmp_path / "ckpt"))
  files = [os.path.join(d, f) for d, _, names in os.walk(tmp_path / "ckpt" / "params") for f in names]
  largest = max((f for f in files if "/d/" in f), key=os.path.getsize)  # an OCDBT data file
  data = bytearray(open(largest, "rb").read())
  data[len(data) // 2] ^= 0x10
  open(largest, "wb").write(data)
  with pytest.raises(CheckpointError, match=r"1 parameter leaf/leaves differ from the checksums written with them "
                                            r"\(corrupted or replaced files\): \w+(/\w+)+\. Re-convert"):
    checkpoint.load_params(tmp_path / "ckpt")
  assert checkpoint.load_params(tmp_path / "ckpt", verify=False)  # a trusted bucket may skip the check


@pytest.mark.slow
def test_device_checksums_equal_the_host_ones_however_the_leaf_is_placed():
  # a replicated leaf is summed in one part per device (padded: 1,001 x 7 words is no multiple of 8), a sharded
  # one where its shards lie, a stacked one per layer; all must read the bits as the host wrote them
  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec

  from s2sjax.scoring.checkpoints import checksums
  from s2sjax.runtime import sharding

  mesh = sharding.make_mesh("data:4,model:2")
  host = np.random.default_rng(0).normal(size=(4, 1001, 8)).astype(np.float32)
  specs = (PartitionSpec(), PartitionSpec(None, None, "model"))
  placed = [jax.device_put(host, NamedSharding(mesh, spec)) for spec in specs]
  half = jax.device_put(host[0].astype(np.float16), NamedSharding(mesh, PartitionSpec()))
  want = [checksums.host_checksum(layer) for layer in host]
  assert checksums.device_checksums(placed + [half], [True, True, False]) == [
    want, want, [checksums.host_checksum(host[0].astype(np.float16))]]
  flipped = host.copy()
  flipped.view(np.uint32)[2, 500, 3] ^= 1
  assert checksums.device_checksums([jax.device_put(flipped, NamedSharding(mesh, PartitionSpec()))], [True])[0] == (
    want[:2] + [checksums.host_checksum(flipped[2])] + want[3:]) and want[2] != checksums.host_checksum(flipped[2])


@pytest.mark.slow
def test_a_checkpoint_without_its_tokenizer_needs_one_named(tiny_sample, tmp_path):
  bare = str(tmp_path / "bare")
  shutil.copytree(tiny_sample["ckpt"], bare)
  shutil.rmtree(os.path.join(bare, "tokenizer"))
  with pytest.raises(EvalError, match=r"holds no tokenizer/.*pass --tokenizer_dir"):
    _run(tiny_sample, tmp_path / "refused", checkpoints=bare)
  assert not os.path.exists(tmp_path / "refused" / "metrics.json")
  _run(tiny_sample, tmp_path / "named", checkpoints=bare, tokenizer_dir=tiny_sample["tokenizer"])
  assert _accuracy(tmp_path / "named")["questions"] == 24


def _lock(out, host, pid):
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, LOCK_NAME), "w") as f:
    json.dump({"host": host, "pid": pid, "started": "earlier", "command": "s2sjax.eval ..."}, f)


def _dead_pid():
  child = subprocess.Popen([sys.executable, "-c", "pass"])
  child.wait()
  return child.pid


@pytest.mark.slow
def test_one_output_directory_is_one_runs_at_a_time(tiny_sample, tmp_path):
  out = tmp_path / "out"
  _lock(out, socket.gethostname(), os.getpid())  # a live run on this host
  with pytest.raises(OutputError, match=rf"being written by another run \(pid {os.getpid()} on "):
    _run(tiny_sample, out)
  assert sorted(os.listdir(out)) == [LOCK_NAME]  # nothing scored, nothing written
  _lock(out, "another-host", 1)
  with pytest.raises(OutputError, match=r"rerun with --break_lock"):
    _run(tiny_sample, out)
  _run(tiny_sample, out, break_lock=True)
  assert not os.path.exists(out / LOCK_NAME)  # released at the end
  _lock(out, socket.gethostname(), _dead_pid())  # a run that died here: taken over
  _run(tiny_sample, out)
  assert not os.path.exists(out / LOCK_NAME)


@pytest.mark.slow
def test_a_kill_between_writing_and_renaming_a_chunk_resumes_to_identical_files(tiny_sample, tmp_path):
  reference, resumed = tmp_path / "reference", tmp_path / "resumed"
  _run(tiny_sample, reference)
  _run(tiny_sample, resumed)
  chunks = resumed / "chunks" / "ckpt-100" / "sstorycloze-t2t"
  first = chunks / "chunk-00000.npz"
  os.rename(first, chunks / f".{first.name}.tmp-{socket.gethostname()}-1")  # written, never renamed
  os.remove(resumed / "metrics.json")
  _run(tiny_sample, resumed)
  assert first.exists() and same_tree(str(reference), str(resumed)) == []


@pytest.mark.slow
def test_another_modality_into_the_same_directory_adds_to_the_summaries(tiny_sample, tmp_path):
  out = tmp_path / "out"
  _run(tiny_sample, out, modalities=("t2t",))
  _run(tiny_sample, out, modalities=("s2t",))
  run = json.load(open(out / "metrics.json"))["runs"][0]
  assert set(run["tasks"]["sstorycloze"]) == {"t2t", "s2t"} and "s2t_vs_t2t" in run["degradation"]["sstorycloze"]
  assert [line.split(" | ")[1] for line in open(out / "table.md").read().splitlines()[2:4]] == ["T→T", "S→T"]


@pytest.mark.slow
def test_a_full_disk_leaves_the_previous_files_whole_and_names_the_file(tiny_sample, tmp_path, monkeypatch):
  out = tmp_path / "out"
  _run(tiny_sample, out)
  before = open(out / "metrics.json", "rb").read()
  from etils.epath import gpath

  real = gpath.PosixGPath.write_bytes

  def full_disk(self, data):
    if "metrics.json" in self.name:
      real(self, data[: len(data) // 2])  # what a full disk leaves: part of the file
      raise OSError(errno.ENOSPC, "No space left on device")
    return real(self, data)

  monkeypatch.setattr(gpath.PosixGPath, "write_bytes", full_disk)
  with pytest.raises(OutputError, match=r"cannot write .*metrics\.json: No space left on device \(the previous "):
    _run(tiny_sample, out, modalities=("t2t",), chunk_rows=4)
  assert open(out / "metrics.json", "rb").read() == before
  assert not [name for name in os.listdir(out) if ".tmp-" in name]


@pytest.mark.slow
def test_an_output_directory_that_cannot_be_written_is_refused_before_scoring(tiny_sample, tmp_path, monkeypatch):
  from s2sjax.scoring.scorer import Scorer

  monkeypatch.setattr(Scorer, "score_slots", lambda *a, **k: pytest.fail("scored before the output was checked"))
  (tmp_path / "a-file").write_text("")
  with pytest.raises(OutputError, match=r"cannot write to the output directory .*a-file/out"):
    _run(tiny_sample, tmp_path / "a-file" / "out")


@pytest.mark.slow
def test_undecodable_lines_are_bad_lines_and_skips_count_questions(tmp_path):
  from tests.test_tasks import _stories, _write_release

  root = _write_release(str(tmp_path), stories=_stories(3))
  jsonl = os.path.join(root, "StoryCloze", "sStory_s2t.jsonl")
  lines = open(jsonl, "rb").read().splitlines(keepends=True)
  lines[2] = b'{"uttid": "2_x", "first": "Tom \xff went.", "last": "x"}\n'  # story 1's right ending
  open(jsonl, "wb").writelines(lines)
  with pytest.raises(ReleaseError, match=r"sStory_s2t.jsonl:3: not UTF-8 text \(byte 0xff at column 32\)"):
    read_questions("sstorycloze", root)
  problems = Problems()
  questions = read_questions("sstorycloze", root, problems=problems)
  assert [q.id for q in questions] == ["0_x", "4_x"]
  assert len(problems.entries) == 2 and problems.questions == {"story 1"}  # the bad line and its orphaned partner


@pytest.mark.slow
def test_the_converter_cleans_dead_writers_staging_and_overwrites_only_checkpoints(tmp_path):
  source = save_hf(tiny_model("qwen2"), str(tmp_path / "hf"))
  out = tmp_path / "ckpt"
  stale = tmp_path / f".ckpt.partial-{socket.gethostname()}-{_dead_pid()}-deadbeef"
  (stale / "params").mkdir(parents=True)
  (stale / "params" / "junk").write_bytes(b"0" * 1000)
  convert(source, str(out))
  assert not stale.exists()
  precious = tmp_path / "precious"
  precious.mkdir()
  (precious / "notes.txt").write_text("not a checkpoint")
  with pytest.raises(CheckpointError, match=r"neither an s2sjax checkpoint nor empty: --overwrite will not delete"):
    convert(source, str(precious), overwrite=True)
  assert (precious / "notes.txt").exists()
  convert(source, str(out), overwrite=True)  # a finished checkpoint is replaced
  (tmp_path / "empty").mkdir()
  convert(source, str(tmp_path / "empty"), overwrite=True)


@pytest.mark.slow
def test_user_errors_are_one_line_and_a_non_zero_exit(tmp_path):
  command = [sys.executable, "-m", "s2sjax.eval", "--task=sstorycloze", "--modality=text",
             f"--checkpoint={tmp_path / 'nothing-*'}", f"--output_dir={tmp_path / 'o'}"]
  failed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert failed.returncode == 1 and "Traceback" not in failed.stderr
  assert f"error: --checkpoint pattern '{tmp_path / 'nothing-*'}' matches nothing" in failed.stderr
  verbose = subprocess.run(command + ["--verbosity=1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert verbose.returncode != 0 and "Traceback" in verbose.stderr



@pytest.mark.slow
def test_a_dead_peer_ends_the_survivor_with_a_clear_error_in_bounded_time(tiny_sample, tmp_path):
  """Process 1 of 2 is killed (SIGKILL) after its first chunk of two; process 0, waiting on it in a collective, must end
  with one line naming it within --peer_timeout_s and a little, not abort after the runtime's 100 s heartbeat."""
  from s2sjax.results.chunk_store import KILL_AFTER_CHUNKS

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},
         "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  command = lambda p: [
    sys.executable, "-m", "s2sjax.eval", "--task=sstorycloze", "--modality=text", f"--checkpoint={tiny_sample['ckpt']}",
    f"--data_dir={tiny_sample['data_dir']}", f"--output_dir={tmp_path / 'out'}", "--batch_size=1", "--chunk_rows=1",
    "--row_length=1024", "--distributed", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={p}",
    "--cpu_collectives=gloo", "--peer_timeout_s=6"]
  logs = [open(tmp_path / f"process-{p}.log", "w+") for p in range(2)]
  procs = [subprocess.Popen(command(p), cwd=ROOT, env=dict(env, **({KILL_AFTER_CHUNKS: "1"} if p else {})),
                            stdout=logs[p], stderr=subprocess.STDOUT) for p in range(2)]
  try:
    procs[1].wait(timeout=300)
    died = time.monotonic()
    procs[0].wait(timeout=60)
    survived_for = time.monotonic() - died
  finally:
    for p in procs:
      p.kill()
  output = open(tmp_path / "process-0.log").read()
  assert procs[1].returncode == -9 and procs[0].returncode == 1, output[-3000:]
  assert "error: process 1 of 2 stopped answering" in output and "Check failure" not in output
  assert survived_for < 6 + 20, survived_for  # the watch's timeout, plus its polling and the exit


# --- The built data, the results and the inputs are held to what made them ---------------------------------------


def _copy_data(tiny_sample, tmp_path) -> str:
  data_dir = str(tmp_path / "data")
  shutil.copytree(os.path.join(tiny_sample["data_dir"], "sstorycloze"), os.path.join(data_dir, "sstorycloze"))
  return data_dir


def _build_dir(data_dir, modality="t2t"):
  from s2sjax.data.task_data import DATA_VERSION

  return os.path.join(data_dir, "sstorycloze", f"demo-{modality}-1024", DATA_VERSION)


@pytest.mark.slow
def test_an_edited_question_table_is_refused_and_the_flag_reads_it_on_purpose(tiny_sample, tmp_path):
  from s2sjax.data.builds import DataError
  from s2sjax.data.task_data import load_task_data

  data_dir = _copy_data(tiny_sample, tmp_path)
  path = os.path.join(_build_dir(data_dir), "metadata.json")
  metadata = json.load(open(path))
  for question in metadata["questions"][:2]:  # two questions' right ending set to the other one
    question["correct"] = 1 - question["correct"]
  json.dump(metadata, open(path, "w"))
  with pytest.raises(DataError, match=r"demo-t2t-1024/1\.1\.0/metadata\.json: the question table differs from the "
                                      r"checksum written with the build .* --noverify_data reads it anyway"):
    load_task_data(data_dir, "sstorycloze", "t2t", "demo", 1024)
  with pytest.raises(DataError, match=r"the question table differs"):
    _run(tiny_sample, tmp_path / "out", data_dir=data_dir)
  assert not os.path.exists(tmp_path / "out" / "metrics.json")
  assert load_task_data(data_dir, "sstorycloze", "t2t", "demo", 1024, verify=False).questions.correct[0] == 1


@pytest.mark.slow
def test_a_build_copied_under_another_configs_name_is_refused_naming_both(tiny_sample, tmp_path):
  from s2sjax.data.builds import DataError

  data_dir = _copy_data(tiny_sample, tmp_path)
  shutil.rmtree(_build_dir(data_dir, "t2t"))
  shutil.copytree(_build_dir(data_dir, "s2t"), _build_dir(data_dir, "t2t"))  # S->T copied into T->T's folder
  with pytest.raises(DataError, match=r"demo-t2t-1024/1\.1\.0 holds the build sstorycloze/demo-s2t-1024 \(S→T\), not "
                                      r"the sstorycloze/demo-t2t-1024 \(T→T\) asked for \(modality 's2t', not "
                                      r"'t2t'\)"):
    _run(tiny_sample, tmp_path / "out", data_dir=data_dir)


@pytest.mark.slow
def test_a_damaged_or_missing_shard_is_one_error_naming_the_file(tiny_sample, tmp_path):
  from s2sjax.data.builds import DataError
  from s2sjax.data.task_data import load_task_data

  data_dir = _copy_data(tiny_sample, tmp_path)
  shard = [f for f in os.listdir(_build_dir(data_dir)) if ".array_record-" in f][0]
  path = os.path.join(_build_dir(data_dir), shard)
  data = open(path, "rb").read()
  open(path, "wb").write(data[: len(data) // 2])  # a copy cut short
  with pytest.raises(DataError, match=rf"1\.1\.0 is damaged: shard {shard} holds 0 rows, the build wrote 2 "
                                      r"\(truncated\): rebuild it with python -m tasks.prepare"):
    load_task_data(data_dir, "sstorycloze", "t2t", "demo", 1024)
  flipped = bytearray(data)
  flipped[200] ^= 0x01  # a flipped bit in the first chunk of records: array_record's own hash catches it
  open(path, "wb").write(bytes(flipped))
  with pytest.raises(DataError, match=rf"is damaged: shard {shard} cannot be read \(Corrupted Riegeli/records file: "
                                      r"chunk data hash mismatch"):
    load_task_data(data_dir, "sstorycloze", "t2t", "demo", 1024)
  open(path, "wb").write(data)
  metadata_path = os.path.join(_build_dir(data_dir), "metadata.json")
  metadata = json.load(open(metadata_path))
  metadata["integrity"]["rows"] = "0" * 64  # rows that are not the ones the build wrote (a replaced shard)
  json.dump(metadata, open(metadata_path, "w"))
  with pytest.raises(DataError, match=r"the rows differ from the checksum written with the build \(a damaged or "
                                      r"replaced shard\)"):
    load_task_data(data_dir, "sstorycloze", "t2t", "demo", 1024)
  os.remove(path)
  with pytest.raises(DataError, match=rf"is damaged: shard {shard} is missing"):
    load_task_data(data_dir, "sstorycloze", "t2t", "demo", 1024)


@pytest.mark.slow
def test_a_failed_overwrite_leaves_the_earlier_build_byte_identical_and_evaluable(tiny_sample, tmp_path):
  from tasks.audio.base import AudioError
  from tasks.preparation import prepare
  from tasks.sample import RELEASE_DIR

  data_dir = _copy_data(tiny_sample, tmp_path)
  tree = lambda: {os.path.relpath(os.path.join(d, f), data_dir): open(os.path.join(d, f), "rb").read()
                  for d, _, names in os.walk(data_dir) for f in names}
  before = tree()
  release = str(tmp_path / "release")
  shutil.copytree(RELEASE_DIR, release)
  open(os.path.join(release, "StoryCloze", "s-story-firstspeech", "0.wav"), "wb").write(b"RIFF\x00\x00not audio")
  with pytest.raises(AudioError, match=r"0\.wav cannot be read"):
    prepare("sstorycloze", "demo", "s2t", 1024, data_dir, manual_dir=release, overwrite=True,
            tokenizer_dir=tiny_sample["tokenizer"])
  assert tree() == before  # nothing deleted, nothing left behind
  _run(tiny_sample, tmp_path / "out", modalities=("s2t",), data_dir=data_dir)
  assert _accuracy(tmp_path / "out", "s2t")["questions"] == 24


@pytest.mark.slow
def test_an_edited_config_or_tokenizer_is_refused_and_accepted_on_purpose(tiny_sample, tmp_path):
  ckpt = str(tmp_path / "ckpt-100")
  shutil.copytree(tiny_sample["ckpt"], ckpt)
  path = os.path.join(ckpt, "model_config.json")
  original = open(path).read()
  config = json.loads(original)
  json.dump(dict(config, rope_theta=config["rope_theta"] * 2), open(path, "w"), indent=2)
  with pytest.raises(CheckpointError, match=r"model_config\.json differs from the config written with the checkpoint "
                                            r".* pass --accept_config_change"):
    _run(tiny_sample, tmp_path / "refused", checkpoints=ckpt)
  assert not os.path.exists(tmp_path / "refused" / "metrics.json")
  assert checkpoint.load_config(ckpt, accept_changed_config=True).rope_theta == config["rope_theta"] * 2
  open(path, "w").write(original)
  with open(os.path.join(ckpt, "tokenizer", "tokenizer_config.json"), "a") as f:
    f.write("\n")
  with pytest.raises(CheckpointError, match=r"tokenizer's files .* differ from the ones written with the checkpoint"):
    checkpoint.load_tokenizer(ckpt)
  assert checkpoint.load_tokenizer(ckpt, accept_changed_config=True) is not None


@pytest.mark.slow
def test_a_non_finite_weight_is_an_error_naming_the_candidates_and_no_nan_reaches_a_file(tiny_sample, tmp_path):
  import numpy as np

  config, params = checkpoint.load_config(tiny_sample["ckpt"]), checkpoint.load_params(tiny_sample["ckpt"])
  kernel = np.array(params["layers"]["mlp"]["up"]["kernel"])
  kernel[0, 0, 0] = np.nan  # the model itself is broken; its checksums are those of the broken bits
  params["layers"]["mlp"]["up"]["kernel"] = kernel
  broken = str(tmp_path / "ckpt-100")
  checkpoint.save_params(broken, config, params, tokenizer_dir=os.path.join(tiny_sample["ckpt"], "tokenizer"))
  with pytest.raises(EvalError, match=r"sstorycloze/T→T: 48 of 48 candidates scored a non-finite NLL \(nan\), first: "
                                      r"question 0 candidate 0, question 0 candidate 1, question 2 candidate 0\. "
                                      r"The model computes NaN/Inf.*nothing was saved"):
    _run(tiny_sample, tmp_path / "out", checkpoints=broken)
  assert not os.path.exists(tmp_path / "out" / "metrics.json") and not list((tmp_path / "out").rglob("chunk-*.npz"))


def test_steps_are_read_as_checkpoint_managers_write_them_and_ambiguous_names_are_refused(tmp_path):
  from s2sjax.scoring.checkpoints.paths import CheckpointListError, expand, step_of, steps

  names = {"step_300": 300, "checkpoint-500": 500, "ckpt-100": 100, "ckpt_7": 7, "1200": 1200, "global_step_9": 9,
           "params_40": 40, "latest": None}
  assert {name: step_of(f"/run/{name}") for name in names} == names
  with pytest.raises(CheckpointListError, match=r"cannot tell the training step of .*ckpt-100-fp16.* pass "
                                                r"--step_pattern"):
    steps(["/run/ckpt-100-fp16", "/run/ckpt-200-fp16"])  # both were step 16: the last number in the name
  assert steps(["/run/ckpt-100-fp16", "/run/ckpt-200-fp16"], r"ckpt-(\d+)-fp16") == [100, 200]
  assert steps(["/run/checkpoint-500-v2"]) == [None]  # one checkpoint: no curve, no step to guess
  with pytest.raises(CheckpointListError, match=r"does not read a step from 'ckpt-9'"):
    steps(["/run/ckpt-9"], r"step-(\d+)")
  with pytest.raises(CheckpointListError, match=r"checkpoints step_100, 100 are all step 100"):
    steps(["/run/step_100", "/run/100"])
  assert steps(["/a/ckpt-100", "/b/ckpt-100"]) == [100, 100]  # two runs' same step: named apart
  for name in ("100", "200", "300.orbax-checkpoint-tmp-17"):  # orbax's folders, one of them unfinished
    (tmp_path / name).mkdir()
  assert [os.path.basename(p) for p in expand(str(tmp_path / "*"))] == ["100", "200"]


def test_writes_are_fsynced_around_the_rename_and_json_is_strict(tmp_path, monkeypatch):
  from s2sjax.results import reports
  from s2sjax.runtime.output_dir import OutputError, write_atomic

  synced, real = [], os.fsync
  monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
  renamed = []
  from etils.epath import gpath

  real_replace = gpath.PosixGPath.replace
  monkeypatch.setattr(gpath.PosixGPath, "replace", lambda self, target: (renamed.append(len(synced)),
                                                                         real_replace(self, target))[1])
  write_atomic(tmp_path / "chunk-00000.npz", b"bytes")
  temporary = [p for p in synced if ".chunk-00000.npz.tmp-" in p]
  assert temporary and synced.index(temporary[0]) < renamed[0]  # the file's bytes before its new name
  assert synced[renamed[0] - 1] == str(tmp_path) and synced[renamed[0]:] == [str(tmp_path)]  # the dir around it
  with pytest.raises(OutputError, match=r"metrics\.json: runs/0/tasks/x/accuracy is not a finite number"):
    reports.write_json(tmp_path / "metrics.json", {"runs": [{"tasks": {"x": {"accuracy": float("nan")}}}]})
  assert not (tmp_path / "metrics.json").exists()


def test_damaged_lock_identity_and_scores_files_are_named_or_recovered(tmp_path, capfd):
  import numpy as np

  from s2sjax.results.chunk_store import ChunkStore
  from s2sjax.runtime.output_dir import RunLock
  from s2sjax.data.questions import QuestionScores

  out = tmp_path / "out"
  out.mkdir()
  (out / LOCK_NAME).write_text('{"host": "h')  # a lock cut short
  with pytest.raises(OutputError, match=rf"{LOCK_NAME} is damaged \(not JSON\).*rerun with --break_lock"):
    RunLock(out).__enter__()
  with RunLock(out, break_lock=True):
    pass
  identity = {"checkpoint": "/c", "checkpoint_content": "a", "dtype": "float32", "chunk_rows": 4, "data": "d"}
  store = ChunkStore(tmp_path / "chunks", identity)
  store.open()
  store.save(0, np.zeros((4, 2)), np.ones((4, 2), np.int64))
  (tmp_path / "chunks" / "identity.json").write_text('{"checkpoint": "/c", "chec')
  ChunkStore(tmp_path / "chunks", identity).open()  # who made the chunk cannot be told: it is scored again
  assert not store.done(0) and "1 chunks of unknown origin (identity.json is damaged) are scored again" in (
    capfd.readouterr().err)
  store.save(0, np.zeros((4, 2)), np.ones((4, 2), np.int64))
  (tmp_path / "chunks" / "chunk-00000.npz").write_bytes(b"")  # what a power loss leaves of an unsynced file
  assert store.readable(0, (4, 2)) is None and "chunk-00000.npz is unreadable" in capfd.readouterr().err
  lines = [{"question": q, "uttid": q, "candidate": c, "text": "t", "is_answer": c == 0, "nll_sum": 1.0 + c,
            "n_tokens": 2} for q in ("a", "b") for c in range(2)]
  with pytest.raises(ValueError, match=r"scores\.jsonl: question b holds 1 candidates, the others 2 \(lines lost"):
    QuestionScores.from_lines(lines[:-1], where="scores.jsonl")


def test_a_release_file_that_ends_mid_line_is_refused_and_skipped_as_a_bad_line(tmp_path):
  from tests.test_tasks import _stories, _write_release

  root = _write_release(str(tmp_path), stories=_stories(3))
  jsonl = os.path.join(root, "StoryCloze", "sStory_s2t.jsonl")
  data = open(jsonl, "rb").read()
  open(jsonl, "wb").write(data[: len(data) - 12])  # an interrupted copy: the last line cut short
  with pytest.raises(ReleaseError, match=r"sStory_s2t\.jsonl:6: the file ends mid-line, this line cut short \(a "
                                         r"truncated copy\?\): not JSON"):
    read_questions("sstorycloze", root)
  problems = Problems()
  assert [q.id for q in read_questions("sstorycloze", root, problems=problems)] == ["0_x", "2_x"]
  assert problems.questions == {"story 2"}  # the cut line and its orphaned partner: one question left out


def _char_tokenizer(directory: str) -> str:
  """A 100-token character-level tokenizer: a text vocabulary below the demo spec's units (49152..49407), as
  SmolLM2's is, so the demo's untrained unit rows are added to a model that has them not."""
  from tokenizers import Regex, Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  vocab = {token: i for i, token in enumerate(["<unk>", "<s>", "</s>"] + [chr(c) for c in range(32, 127)])}
  core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
  PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
                          ).save_pretrained(directory)
  return directory


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
  """The embedded default's situation on a tiny model: a text vocabulary the demo spec's units lie past."""
  root = tmp_path_factory.mktemp("small-vocab")
  hf = save_hf(tiny_model("qwen2", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2),
               str(root / "hf"))
  _char_tokenizer(hf)
  ckpt = str(root / "ckpt-1")
  convert(hf, ckpt)
  data_dir = str(root / "data")
  build_sample(data_dir, os.path.join(ckpt, "tokenizer"), tasks=("sstorycloze",))
  return {"ckpt": ckpt, "data_dir": data_dir}


@pytest.mark.slow
def test_a_users_checkpoint_is_never_grown_to_a_specs_units(small_vocab, tmp_path):
  """Only the embedded default is given untrained rows for the demo spec's units (default_model.fit_to_spec): a
  user's 128-row model is scored as it is on T->T, and its S->T data, whose units lie past its embedding, is
  refused by name rather than read from rows it never had."""
  run = lambda out, modalities: _run(small_vocab, tmp_path / out, modalities, checkpoints=small_vocab["ckpt"],
                                     data_dir=small_vocab["data_dir"])
  run("alone", ("t2t",))
  identity = json.load(open(tmp_path / "alone" / "chunks" / "ckpt-1" / "sstorycloze-t2t" / "identity.json"))
  assert identity["vocab_size"] == 128  # the checkpoint's own embedding, as recorded with its chunks
  with pytest.raises(EvalError, match=r"sstorycloze/s2t: tokens\[row \d+, position \d+\] = 49\d+ is outside the "
                                      r"embedding table \(128 rows\).*; spec demo's units 49152\.\.49407 \(256 ids\) "
                                      r"lie past the checkpoint's embedding of 128 rows"):
    run("together", ("t2t", "s2t"))


@pytest.mark.slow
def test_the_pre_flight_check_refuses_what_the_evaluator_refuses(small_vocab):
  from s2sjax.scoring import preflight
  from s2sjax.data.task_data import load_task_data

  data = load_task_data(small_vocab["data_dir"], "sstorycloze", "s2t", "demo", 1024)
  verdicts = {v.check: v for v in preflight.run(checkpoint.open(small_vocab["ckpt"]), spec="demo", data=data)}
  assert not verdicts["unit ids"].ok and not verdicts["check_fit"].ok, preflight.table(list(verdicts.values()))
  assert verdicts["unit ids"].detail == "units 49152..49407 (256 ids) against 128 embedding rows"
  assert "lie past the checkpoint's embedding of 128 rows" in verdicts["check_fit"].detail
  assert "unit_ids 49152..49407 (256 ids)" in verdicts["data special ids"].detail
  assert verdicts["data special ids"].detail.count("49152") == 1  # once, as a range


@pytest.mark.slow
def test_scores_files_are_held_to_their_chunks_and_damaged_ones_rewritten(tiny_sample, tmp_path, capfd):
  out = tmp_path / "out"
  _run(tiny_sample, out, modalities=("t2t",))
  _run(tiny_sample, out, modalities=("s2t",))
  before = {name: open(out / "ckpt-100" / name, "rb").read() for name in os.listdir(out / "ckpt-100")}
  metrics = open(out / "metrics.json").read()
  scores = out / "ckpt-100" / "sstorycloze-s2t.scores.jsonl"
  lines = open(scores, "rb").read().splitlines(keepends=True)
  open(scores, "wb").writelines(lines[:-3])  # lost its last lines (and so a question's candidate)
  _run(tiny_sample, out, modalities=("t2t",))  # another modality into the directory: the summaries are recomputed
  assert f"sstorycloze-s2t.scores.jsonl: damaged (45 of the 48 lines written): rewritten from its chunks" in (
    capfd.readouterr().err)
  assert open(out / "metrics.json").read() == metrics
  assert {name: open(out / "ckpt-100" / name, "rb").read() for name in os.listdir(out / "ckpt-100")} == before
  os.remove(scores)
  os.remove(out / "chunks" / "ckpt-100" / "sstorycloze-s2t" / "chunk-00001.npz")
  with pytest.raises(ValueError, match=r"sstorycloze-s2t\.scores\.jsonl is damaged \(missing\) and its chunks cannot "
                                       r"rebuild it \(chunk-00001\.npz is missing\): rerun that task and modality"):
    _run(tiny_sample, out, modalities=("t2t",))


@pytest.mark.slow
def test_zero_byte_or_truncated_chunks_and_identities_are_scored_again_to_identical_files(tiny_sample, tmp_path, capfd):
  reference, resumed = tmp_path / "reference", tmp_path / "resumed"
  _run(tiny_sample, reference, modalities=("s2t",))
  _run(tiny_sample, resumed, modalities=("s2t",), chunk_rows=1)
  assert "--chunk_rows=1 is below --batch_size=4: raised to 4" in capfd.readouterr().out
  chunks = resumed / "chunks" / "ckpt-100" / "sstorycloze-s2t"
  assert json.load(open(chunks / "identity.json"))["chunk_rows"] == 4
  (chunks / "chunk-00000.npz").write_bytes(b"")  # a power loss after an unsynced rename
  data = open(chunks / "chunk-00001.npz", "rb").read()
  (chunks / "chunk-00001.npz").write_bytes(data[: len(data) // 2])
  os.remove(resumed / "metrics.json")
  _run(tiny_sample, resumed, modalities=("s2t",))
  err = capfd.readouterr().err
  assert "chunk-00000.npz is unreadable" in err and "chunk-00001.npz is unreadable" in err
  assert same_tree(str(reference), str(resumed)) == []


@pytest.mark.slow
def test_damaged_checkpoint_files_are_named_and_a_failed_overwrite_keeps_the_old_one(tmp_path, tiny_sample):
  import numpy as np

  shutil.copytree(tiny_sample["ckpt"], tmp_path / "ckpt")
  params = tmp_path / "ckpt" / "params"
  data_files = sorted(p for p in params.rglob("*") if p.is_file() and p.parent.name == "d")

  def damaged(change, match):
    copy = tmp_path / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(tmp_path / "ckpt", copy)
    change(copy)
    with pytest.raises(CheckpointError, match=match):
      checkpoint.load_config(copy)
      checkpoint.load_params(copy)

  first = data_files[0].relative_to(tmp_path / "ckpt")
  damaged(lambda c: os.remove(c / first), rf"copy is damaged: {first} is missing\. Restore it or re-convert it")
  damaged(lambda c: open(c / first, "r+b").truncate(10), rf"{first} holds 10 bytes, \d+ were written \(truncated")
  process = next(p for p in params.rglob("ocdbt.process_*") if p.is_dir()).relative_to(tmp_path / "ckpt")
  damaged(lambda c: shutil.rmtree(c / process), rf"copy is damaged: {process}/\S+ is missing")
  damaged(lambda c: (c / "manifest.json").write_text('{"source": "x'),
          r"copy/manifest\.json, the checkpoint's manifest, is not valid JSON: Unterminated string")
  (tmp_path / "ckpt" / "tokenizer" / ".ipynb_checkpoints").mkdir()  # a notebook opened the folder
  (tmp_path / "ckpt" / "tokenizer" / ".ipynb_checkpoints" / "tokenizer_config-checkpoint.json").write_text("{}")
  assert len(checkpoint.load_tokenizer(tmp_path / "ckpt")) == 151_669  # the tokenizer, not "Is a directory"
  before = {p: p.read_bytes() for p in (tmp_path / "ckpt").rglob("*") if p.is_file()}

  def failing_leaves():  # a conversion whose source fails half way, as `convert --overwrite` would see it
    yield ("embed", "embedding"), np.zeros((151_680, 32), np.float32)
    raise OSError("the source file went away")

  config = checkpoint.load_config(tmp_path / "ckpt")
  with pytest.raises(OSError, match="went away"):
    checkpoint.write_checkpoint(tmp_path / "ckpt", config, failing_leaves(), overwrite=True)
  assert {p: p.read_bytes() for p in (tmp_path / "ckpt").rglob("*") if p.is_file()} == before
  assert checkpoint.load_params(tmp_path / "ckpt") and [p.name for p in tmp_path.iterdir()
                                                         if p.name.startswith(".ckpt")] == []


@pytest.mark.slow
def test_task_all_over_an_empty_data_dir_is_one_line(tmp_path):
  (tmp_path / "empty").mkdir()
  failed = subprocess.run([sys.executable, "-m", "s2sjax.eval", "--task=all", "--modality=text",
                           f"--data_dir={tmp_path / 'empty'}", f"--checkpoint={tmp_path}",
                           f"--output_dir={tmp_path / 'o'}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr[-2000:]
  assert f"error: --task=all: no task is built in {tmp_path / 'empty'}" in failed.stderr
