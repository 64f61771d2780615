"""launch/: dry runs print complete commands; spot preemption recreates the slice and resumes; queued resources are
waited for; a failed run still deletes the slice."""

import shlex
import subprocess
import sys

import pytest

from launch.tpu import Launcher

ARGS = ["--zone=us-east5-b", "--checkpoint=gs://b/run/step_*", "--data_dir=gs://b/data", "--output_dir=gs://b/out",
        "--accelerator=v5litepod-16", "--name=t1", "--eval_args=--task=all --modality=both --mesh=data:-1,model:4"]


def _dry(*extra):
  out = subprocess.run([sys.executable, "-m", "launch.tpu", "--dry_run", *ARGS, *extra], capture_output=True,
                       text=True, check=True)
  return out.stdout.splitlines()


class FakeGcloud:
  """Simulated gcloud: every evaluation attempt listed in `failing_evals` (1-based) exits 1; queued-resource
  describes answer `queued_states` in turn."""

  def __init__(self, failing_evals=(), queued_states=()):
    self.calls, self.printed = [], []
    self.failing_evals, self.queued_states = set(failing_evals), list(queued_states)

  def runner(self, argv):
    self.calls.append(list(argv))
    evals = sum(any("s2sjax.eval" in a for a in c) for c in self.calls)
    return 1 if any("s2sjax.eval" in a for a in argv) and evals in self.failing_evals else 0

  def read_output(self, argv):
    self.calls.append(list(argv))
    return self.queued_states.pop(0) + "\n"

  def launcher(self, spot=False, queued=False, queued_timeout_s=60.0):
    return Launcher("t1", "z", "v4-32", "rt", None, spot=spot, queued=queued, dry_run=False, echo=self.printed.append,
                    runner=self.runner, recreate_wait_s=0, read_output=self.read_output, poll_interval_s=0,
                    queued_timeout_s=queued_timeout_s)

  def verbs(self):
    """Each call as its command group and verb: 'tpu-vm ssh', 'queued-resources describe', 'storage rsync'."""
    return [" ".join(c[3:5] if c[1] == "compute" else c[1:3]) for c in self.calls]


def test_dry_run_prints_every_command_in_order():
  lines = _dry("--spot")
  assert lines[0] == "# dry run: commands are printed, not run"
  zone = "--zone=us-east5-b"
  eval_command = ("cd s2sjax && python3 -m s2sjax.eval '--checkpoint=gs://b/run/step_*' --data_dir=gs://b/data "
                  "--output_dir=gs://b/out --distributed --task=all --modality=both --mesh=data:-1,model:4")
  assert [shlex.split(line) for line in lines[1:]] == [  # what the shell hands gcloud, quoting undone
    ["gcloud", "compute", "tpus", "tpu-vm", "create", "t1", "--accelerator-type=v5litepod-16",
     "--version=v2-alpha-tpuv5-lite", zone, "--spot"],
    ["gcloud", "compute", "tpus", "tpu-vm", "scp", "--recurse", "--worker=all", ".", "t1:s2sjax", zone],
    ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "t1", "--worker=all",
     "--command=cd s2sjax && python3 -m pip install -q -e '.[tpu]'", zone],
    ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "t1", "--worker=all", f"--command={eval_command}", zone],
    ["gcloud", "storage", "rsync", "--recursive", "gs://b/out", "./tpu-eval-results"],
    ["gcloud", "compute", "tpus", "tpu-vm", "delete", "t1", "--quiet", zone],
  ]
  # the command each worker runs parses back into the evaluation's own flags
  assert shlex.split(eval_command.split(" && ")[1])[3:7] == [
    "--checkpoint=gs://b/run/step_*", "--data_dir=gs://b/data", "--output_dir=gs://b/out", "--distributed"]


def test_queued_resource_and_project():
  lines = _dry("--queued", "--project=p1", "--action=create")
  assert lines[1] == ("gcloud compute tpus queued-resources create t1-qr --node-id=t1 --accelerator-type=v5litepod-16 "
                      "--runtime-version=v2-alpha-tpuv5-lite --zone=us-east5-b --project=p1")


def test_preempted_spot_slice_is_recreated_and_the_run_resumes():
  gcloud = FakeGcloud(failing_evals=[1])
  gcloud.launcher(spot=True).run("gs://c", "gs://d", "gs://o", "--task=scmmlu", retries=2)
  assert gcloud.verbs() == ["tpu-vm ssh", "tpu-vm delete", "tpu-vm create", "tpu-vm scp", "tpu-vm ssh", "tpu-vm ssh"]
  assert gcloud.calls[0] == gcloud.calls[-1]  # the same evaluation, into the same output directory: it resumes there
  assert any("recreating t1 and resuming into gs://o" in p for p in gcloud.printed)


def test_dry_run_of_a_queued_slice_describes_it_once_and_goes_on_as_if_active():
  lines = _dry("--queued")
  assert lines[1].startswith("gcloud compute tpus queued-resources create t1-qr ")
  assert shlex.split(lines[2]) == ["gcloud", "compute", "tpus", "queued-resources", "describe", "t1-qr",
                                   "--format=value(state.state)", "--zone=us-east5-b"]
  assert shlex.split(lines[3])[3:5] == ["tpu-vm", "scp"]  # install follows
  assert lines[-1] == "gcloud compute tpus queued-resources delete t1-qr --force --quiet --zone=us-east5-b"
  assert len(lines) == 8


def test_queued_slice_is_installed_only_once_active():
  gcloud = FakeGcloud(queued_states=["WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"])
  launcher = gcloud.launcher(queued=True)
  launcher.create()
  launcher.install()
  assert gcloud.verbs() == ["queued-resources create", *["queued-resources describe"] * 4, "tpu-vm scp",
                            "tpu-vm ssh"]
  assert [p for p in gcloud.printed if p.startswith("#")] == [  # each state once, not once per poll
      "# t1-qr is WAITING_FOR_RESOURCES, waiting for ACTIVE", "# t1-qr is PROVISIONING, waiting for ACTIVE"]


@pytest.mark.parametrize("state", ["FAILED", "SUSPENDED"])
def test_failed_or_suspended_queued_resource_is_deleted_and_reported(state):
  gcloud = FakeGcloud(queued_states=["WAITING_FOR_RESOURCES", state])
  with pytest.raises(RuntimeError, match=f"queued resource t1-qr is {state} .*deleted it"):
    gcloud.launcher(queued=True).create()
  assert gcloud.verbs() == ["queued-resources create", "queued-resources describe", "queued-resources describe",
                            "queued-resources delete"]


def test_queued_resource_still_waiting_at_the_timeout_is_deleted():
  gcloud = FakeGcloud(queued_states=["WAITING_FOR_RESOURCES"])
  with pytest.raises(RuntimeError, match="still WAITING_FOR_RESOURCES after 0 s \\(--queued_timeout_s\\)"):
    gcloud.launcher(queued=True, queued_timeout_s=0).create()
  assert gcloud.verbs()[-1] == "queued-resources delete"


@pytest.mark.parametrize("spot", [False, True])
def test_failed_run_still_fetches_and_deletes_the_slice_then_raises(spot):
  gcloud = FakeGcloud(failing_evals=[1, 2])  # a plain failure; on spot, every attempt (1 retry) fails
  with pytest.raises(RuntimeError, match="evaluation failed after"):
    gcloud.launcher(spot=spot).run_all("gs://c", "gs://d", "gs://o", "", retries=1, fetch_to="./r")
  assert gcloud.verbs()[-2:] == ["storage rsync", "tpu-vm delete"]
  assert gcloud.verbs().count("tpu-vm delete") == (2 if spot else 1)  # the spot retry's recreate, then the cleanup


def test_failing_partial_fetch_does_not_hide_the_run_error_or_skip_delete():
  gcloud = FakeGcloud(failing_evals=[1])
  launcher = gcloud.launcher()
  launcher.fetch = lambda output_dir, fetch_to: (_ for _ in ()).throw(RuntimeError("bucket gone"))
  with pytest.raises(RuntimeError, match="evaluation failed after 1 attempt"):
    launcher.run_all("gs://c", "gs://d", "gs://o", "", retries=0, fetch_to="./r")
  assert gcloud.verbs()[-1] == "tpu-vm delete"
  assert "# could not fetch partial results: bucket gone" in gcloud.printed


def test_queued_spot_slice_that_fails_to_come_back_is_deleted_once():
  gcloud = FakeGcloud(failing_evals=[1], queued_states=["ACTIVE", "FAILED"])  # preempted, then no capacity
  with pytest.raises(RuntimeError, match="t1-qr is FAILED"):
    gcloud.launcher(spot=True, queued=True).run_all("gs://c", "gs://d", "gs://o", "", retries=2, fetch_to="./r")
  assert gcloud.verbs() == [
      "queued-resources create", "queued-resources describe", "tpu-vm scp", "tpu-vm ssh", "tpu-vm ssh",  # try 1
      "queued-resources delete", "queued-resources create", "queued-resources describe",  # recreate: FAILED
      "queued-resources delete", "storage rsync"]  # the failed request is deleted, not again in the cleanup


def test_queued_spot_slice_resumes_after_preemption_and_is_deleted_at_the_end():
  gcloud = FakeGcloud(failing_evals=[1], queued_states=["ACTIVE", "PROVISIONING", "ACTIVE"])
  gcloud.launcher(spot=True, queued=True).run_all("gs://c", "gs://d", "gs://o", "", retries=2, fetch_to="./r")
  evals = [c for c in gcloud.calls if any("s2sjax.eval" in a for a in c)]
  assert len(evals) == 2 and evals[0] == evals[1]
  assert gcloud.verbs()[-2:] == ["storage rsync", "queued-resources delete"]
  assert gcloud.verbs().count("queued-resources describe") == 3


def test_relative_output_dir_is_fetched_from_the_remote_project_dir():
  for output_dir, remote in [("outputs/eval", "t1:s2sjax/outputs/eval"), ("/tmp/eval", "t1:/tmp/eval"),
                             ("~/eval", "t1:~/eval")]:
    lines = _dry(f"--output_dir={output_dir}", "--action=fetch", "--fetch_to=./r")
    assert shlex.split(lines[1]) == ["gcloud", "compute", "tpus", "tpu-vm", "scp", "--recurse", "--worker=0", remote,
                                     "./r", "--zone=us-east5-b"]


@pytest.mark.parametrize("bad_flag", ["--retries=-1", "--queued_timeout_s=-5"])
def test_negative_counts_are_refused_at_flag_parsing(bad_flag):
  out = subprocess.run([sys.executable, "-m", "launch.tpu", "--dry_run", *ARGS, bad_flag], capture_output=True,
                       text=True)
  assert out.returncode != 0
  assert f"flag {bad_flag}: " in out.stderr and "non-negative" in out.stderr
  assert "gcloud" not in out.stdout  # nothing ran


def _fake_program(folder, name):
  """An executable `name` in `folder` that appends its arguments (one per line, then a `--` line) to `name`.log."""
  log = folder / f"{name}.log"
  script = folder / name
  script.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a" >> {shlex.quote(str(log))}; done\n'
                    f'echo -- >> {shlex.quote(str(log))}\n')
  script.chmod(0o755)
  return log


@pytest.mark.parametrize("eval_args, words", [
    ("--task=$(touch${IFS}pwned)", ["--task=$(touch${IFS}pwned)"]),
    ("--task=`touch${IFS}pwned`", ["--task=`touch${IFS}pwned`"]),
    ("--task=all --step_pattern='x; touch pwned'", ["--task=all", "--step_pattern=x; touch pwned"]),
    ("--step_pattern=\"a'b\" --task=x|touch${IFS}pwned", ["--step_pattern=a'b", "--task=x|touch${IFS}pwned"]),
])
def test_hostile_arguments_reach_the_worker_as_data_through_both_shells(tmp_path, eval_args, words):
  """The printed ssh line, run by a real local shell, hands gcloud one --command; that command, run by a real shell
  on the 'worker', hands s2sjax.eval the arguments as the user's shell would have split them, and nothing else
  runs."""
  bin_dir, home = tmp_path / "bin", tmp_path / "home"
  bin_dir.mkdir()
  (home / "s2sjax").mkdir(parents=True)
  gcloud_log, python_log = _fake_program(bin_dir, "gcloud"), _fake_program(bin_dir, "python3")
  checkpoint = "gs://b/$(touch pwned)/`touch pwned`"
  lines = _dry(f"--checkpoint={checkpoint}", f"--eval_args={eval_args}", "--action=run")
  env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home)}
  subprocess.run(["sh", "-c", lines[1]], cwd=tmp_path, env=env, check=True)  # the local shell
  command = [a for a in gcloud_log.read_text().splitlines() if a.startswith("--command=")]
  assert len(command) == 1
  subprocess.run(["sh", "-c", command[0].removeprefix("--command=")], cwd=home, env=env, check=True)  # the worker's
  assert python_log.read_text().splitlines() == [
      "-m", "s2sjax.eval", f"--checkpoint={checkpoint}", "--data_dir=gs://b/data", "--output_dir=gs://b/out",
      "--distributed", *words, "--"]
  assert not list(tmp_path.rglob("pwned"))


@pytest.mark.parametrize("eval_args, message", [
    ("--task=all; rm -rf ~", "'rm' is not a flag of s2sjax.eval"),
    ("--task=all && touch pwned", "'&&' is not a flag"),
    ("--task='all", "cannot be split into words (No closing quotation)"),
    ('--task="all', "cannot be split into words"),
])
def test_unparsable_eval_args_are_refused_before_any_slice_is_created(eval_args, message):
  out = subprocess.run([sys.executable, "-m", "launch.tpu", "--dry_run", *ARGS, f"--eval_args={eval_args}"],
                       capture_output=True, text=True)
  assert out.returncode == 1
  assert f"error: --eval_args" in out.stderr and message in out.stderr
  assert "gcloud" not in out.stdout  # nothing printed, so nothing would have run
  gcloud = FakeGcloud()
  with pytest.raises(ValueError, match="--eval_args"):
    gcloud.launcher(spot=True).run_all("gs://c", "gs://d", "gs://o", eval_args, retries=1, fetch_to="./r")
  assert gcloud.calls == []


@pytest.mark.parametrize("output_dir", ["out$(touch pwned)", "out`touch pwned`", "out;touch pwned", "a b", "o'ut"])
def test_worker_local_output_dir_with_shell_syntax_is_refused_before_any_slice_is_created(output_dir):
  """scp hands a remote path to the worker's shell in its legacy mode and not in its SFTP mode: no quoting is right
  for both, so such a directory is refused (a gs:// one is never read by a shell)."""
  gcloud = FakeGcloud()
  with pytest.raises(ValueError, match="worker-local output directory is fetched by scp"):
    gcloud.launcher().run_all("gs://c", "gs://d", output_dir, "", retries=0, fetch_to="./r")
  assert gcloud.calls == []
  out = subprocess.run([sys.executable, "-m", "launch.tpu", "--dry_run", *ARGS, f"--output_dir={output_dir}",
                        "--action=fetch"], capture_output=True, text=True)
  assert out.returncode == 1 and "error: --output_dir=" in out.stderr and "gcloud" not in out.stdout
  lines = _dry(f"--output_dir=gs://b/{output_dir}", "--action=fetch")  # in a bucket: an argument list, no shell
  assert shlex.split(lines[1])[4] == f"gs://b/{output_dir}"
