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
from s2sjax import checkpoint
from s2sjax import eval as s2s_eval
from s2sjax.checkpoint import CheckpointError
from s2sjax.eval import EvalConfig
from s2sjax.evaluator import EvalError, ScoringOptions
from s2sjax.output_dir import LOCK_NAME, OutputError
from tasks.release import Problems, ReleaseError, read_questions
from tests.eval_fixtures import build_sample, later_steps, same_tree, tiny_checkpoint
from tests.hf_models import save_hf, tiny_model

pytestmark = pytest.mark.slow  # whole evaluations and conversions, some as multi-process subprocesses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def setup(tmp_path_factory, qwen_tokenizer_dir):
  root = tmp_path_factory.mktemp("faults")
  ckpt = tiny_checkpoint(str(root), qwen_tokenizer_dir)
  data_dir = str(root / "data")
  build_sample(data_dir, qwen_tokenizer_dir, tasks=("sstorycloze",))
  return {"root": root, "ckpt": ckpt, "data_dir": data_dir, "tokenizer": qwen_tokenizer_dir}


def _run(setup, out, modalities=("t2t",), **config):
  config = {"checkpoints": setup["ckpt"], "data_dir": setup["data_dir"], "output_dir": str(out), "chunk_rows": 4,
            "row_length": 1024, "scoring": ScoringOptions(batch_size=4), **config}
  return s2s_eval.run(EvalConfig(("sstorycloze",), tuple(modalities), **config))


def _accuracy(out, modality="t2t"):
  return json.load(open(os.path.join(out, "metrics.json")))["runs"][0]["tasks"]["sstorycloze"][modality]


def test_a_checkpoint_replaced_at_the_same_path_is_scored_again(setup, tmp_path):
  path = str(tmp_path / "latest")
  shutil.copytree(setup["ckpt"], path)
  _run(setup, tmp_path / "out", checkpoints=path)
  other = later_steps(setup["ckpt"], (7,), root=str(tmp_path / "other"))[0]
  shutil.rmtree(path)
  shutil.copytree(other, path)  # a training loop overwriting latest/
  _run(setup, tmp_path / "out", checkpoints=path)
  _run(setup, tmp_path / "fresh", checkpoints=other)
  assert _accuracy(tmp_path / "out") == _accuracy(tmp_path / "fresh")
  scores = lambda out, name: open(tmp_path / out / name / "sstorycloze-t2t.scores.jsonl").read()
  assert scores("out", "latest") == scores("fresh", "ckpt-7")


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


def test_device_checksums_equal_the_host_ones_however_the_leaf_is_placed():
  # a replicated leaf is summed in one part per device (padded: 1,001 x 7 words is no multiple of 8), a sharded
  # one where its shards lie, a stacked one per layer; all must read the bits as the host wrote them
  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec

  from s2sjax import checksums, sharding

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


def test_a_checkpoint_without_its_tokenizer_needs_one_named(setup, tmp_path):
  bare = str(tmp_path / "bare")
  shutil.copytree(setup["ckpt"], bare)
  shutil.rmtree(os.path.join(bare, "tokenizer"))
  with pytest.raises(EvalError, match=r"holds no tokenizer/.*pass --tokenizer_dir"):
    _run(setup, tmp_path / "refused", checkpoints=bare)
  assert not os.path.exists(tmp_path / "refused" / "metrics.json")
  _run(setup, tmp_path / "named", checkpoints=bare, tokenizer_dir=setup["tokenizer"])
  assert _accuracy(tmp_path / "named")["questions"] == 24


def _lock(out, host, pid):
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, LOCK_NAME), "w") as f:
    json.dump({"host": host, "pid": pid, "started": "earlier", "command": "s2sjax.eval ..."}, f)


def _dead_pid():
  child = subprocess.Popen([sys.executable, "-c", "pass"])
  child.wait()
  return child.pid


def test_one_output_directory_is_one_runs_at_a_time(setup, tmp_path):
  out = tmp_path / "out"
  _lock(out, socket.gethostname(), os.getpid())  # a live run on this host
  with pytest.raises(OutputError, match=rf"being written by another run \(pid {os.getpid()} on "):
    _run(setup, out)
  assert sorted(os.listdir(out)) == [LOCK_NAME]  # nothing scored, nothing written
  _lock(out, "another-host", 1)
  with pytest.raises(OutputError, match=r"rerun with --break_lock"):
    _run(setup, out)
  _run(setup, out, break_lock=True)
  assert not os.path.exists(out / LOCK_NAME)  # released at the end
  _lock(out, socket.gethostname(), _dead_pid())  # a run that died here: taken over
  _run(setup, out)
  assert not os.path.exists(out / LOCK_NAME)


def test_a_kill_between_writing_and_renaming_a_chunk_resumes_to_identical_files(setup, tmp_path):
  reference, resumed = tmp_path / "reference", tmp_path / "resumed"
  _run(setup, reference)
  _run(setup, resumed)
  chunks = resumed / "chunks" / "ckpt-100" / "sstorycloze-t2t"
  first = chunks / "chunk-00000.npz"
  os.rename(first, chunks / f".{first.name}.tmp-{socket.gethostname()}-1")  # written, never renamed
  os.remove(resumed / "metrics.json")
  _run(setup, resumed)
  assert first.exists() and same_tree(str(reference), str(resumed)) == []


def test_another_modality_into_the_same_directory_adds_to_the_summaries(setup, tmp_path):
  out = tmp_path / "out"
  _run(setup, out, modalities=("t2t",))
  _run(setup, out, modalities=("s2t",))
  run = json.load(open(out / "metrics.json"))["runs"][0]
  assert set(run["tasks"]["sstorycloze"]) == {"t2t", "s2t"} and "s2t_vs_t2t" in run["degradation"]["sstorycloze"]
  assert [line.split(" | ")[1] for line in open(out / "table.md").read().splitlines()[2:4]] == ["T→T", "S→T"]


def test_a_full_disk_leaves_the_previous_files_whole_and_names_the_file(setup, tmp_path, monkeypatch):
  out = tmp_path / "out"
  _run(setup, out)
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
    _run(setup, out, modalities=("t2t",), chunk_rows=4)
  assert open(out / "metrics.json", "rb").read() == before
  assert not [name for name in os.listdir(out) if ".tmp-" in name]


def test_an_output_directory_that_cannot_be_written_is_refused_before_scoring(setup, tmp_path, monkeypatch):
  from s2sjax.scoring import Scorer

  monkeypatch.setattr(Scorer, "score", lambda *a, **k: pytest.fail("scored before the output was checked"))
  (tmp_path / "a-file").write_text("")
  with pytest.raises(OutputError, match=r"cannot write to the output directory .*a-file/out"):
    _run(setup, tmp_path / "a-file" / "out")


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


def test_user_errors_are_one_line_and_a_non_zero_exit(tmp_path):
  command = [sys.executable, "-m", "s2sjax.eval", "--task=sstorycloze", "--modality=text",
             f"--checkpoint={tmp_path / 'nothing-*'}", f"--output_dir={tmp_path / 'o'}"]
  failed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert failed.returncode == 1 and "Traceback" not in failed.stderr
  assert f"error: --checkpoint pattern '{tmp_path / 'nothing-*'}' matches nothing" in failed.stderr
  verbose = subprocess.run(command + ["--verbosity=1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert verbose.returncode != 0 and "Traceback" in verbose.stderr



def test_a_dead_peer_ends_the_survivor_with_a_clear_error_in_bounded_time(setup, tmp_path):
  """Process 1 of 2 is killed (SIGKILL) after its first chunk of two; process 0, waiting on it in a collective, must end
  with one line naming it within --peer_timeout_s and a little, not abort after the runtime's 100 s heartbeat."""
  from s2sjax.chunk_store import KILL_AFTER_CHUNKS

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},
         "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  command = lambda p: [
    sys.executable, "-m", "s2sjax.eval", "--task=sstorycloze", "--modality=text", f"--checkpoint={setup['ckpt']}",
    f"--data_dir={setup['data_dir']}", f"--output_dir={tmp_path / 'out'}", "--batch_size=4", "--chunk_rows=1",
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
