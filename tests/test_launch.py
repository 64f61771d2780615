"""launch/: dry runs print complete commands; spot preemption recreates the slice and resumes."""

import shlex
import subprocess
import sys

from launch.tpu import Launcher

ARGS = ["--zone=us-east5-b", "--checkpoint=gs://b/run/step_*", "--data_dir=gs://b/data", "--output_dir=gs://b/out",
        "--accelerator=v5litepod-16", "--name=t1", "--eval_args=--task=all --modality=both --mesh=data:-1,model:4"]


def _dry(*extra):
  out = subprocess.run([sys.executable, "-m", "launch.tpu", "--dry_run", *ARGS, *extra], capture_output=True,
                       text=True, check=True)
  return out.stdout.splitlines()


def test_dry_run_prints_every_command_in_order():
  lines = _dry("--spot")
  assert lines[0] == "# dry run: commands are printed, not run"
  zone = "--zone=us-east5-b"
  eval_command = ("cd ~/s2sjax && python3 -m s2sjax.eval '--checkpoint=gs://b/run/step_*' --data_dir=gs://b/data "
                  "--output_dir=gs://b/out --distributed --task=all --modality=both --mesh=data:-1,model:4")
  assert [shlex.split(line) for line in lines[1:]] == [  # what the shell hands gcloud, quoting undone
    ["gcloud", "compute", "tpus", "tpu-vm", "create", "t1", "--accelerator-type=v5litepod-16",
     "--version=v2-alpha-tpuv5-lite", zone, "--spot"],
    ["gcloud", "compute", "tpus", "tpu-vm", "scp", "--recurse", "--worker=all", ".", "t1:~/s2sjax", zone],
    ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "t1", "--worker=all",
     "--command=cd ~/s2sjax && python3 -m pip install -q -e '.[tpu]'", zone],
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
  calls, printed = [], []

  def runner(argv):
    calls.append(argv)
    evals = [c for c in calls if any("s2sjax.eval" in a for a in c)]
    return 1 if any("s2sjax.eval" in a for a in argv) and len(evals) == 1 else 0  # the first attempt dies

  launcher = Launcher("t1", "z", "v4-32", "rt", None, spot=True, queued=False, dry_run=False, echo=printed.append,
                      runner=runner, recreate_wait_s=0)
  launcher.run("gs://c", "gs://d", "gs://o", "--task=scmmlu", retries=2)
  verbs = [" ".join(c[3:5]) for c in calls]
  assert verbs == ["tpu-vm ssh", "tpu-vm delete", "tpu-vm create", "tpu-vm scp", "tpu-vm ssh", "tpu-vm ssh"]
  assert calls[0] == calls[-1]  # the same evaluation, into the same output directory: it resumes there
  assert any("recreating t1 and resuming into gs://o" in p for p in printed)
