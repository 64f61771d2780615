r"""Runs s2sjax.eval on a Cloud TPU VM or pod slice: create it, install the project on every worker, run the
evaluation on all workers at once, bring the results back, delete it. Spot slices that get preempted are recreated
and the evaluation reruns into the same output directory, where it resumes.

  python -m launch.tpu --action=all --name=s2s-eval --zone=us-east5-b --accelerator=v5litepod-16 --spot \
      --checkpoint='gs://bucket/run7/step_*' --data_dir=gs://bucket/s2s-data --output_dir=gs://bucket/run7-eval \
      --eval_args='--task=all --modality=both --spec=glm4_voice --dtype=bfloat16 --mesh=data:-1,model:4' \
      --fetch_to=./run7-eval [--dry_run]

Actions: create, install, run, fetch, delete, all (create, install, run with preemption retries, fetch, delete).
With --action=all the slice is deleted even when a step fails (after fetching what a failed run wrote), and the
error is raised again. --queued waits until the queued resource is ACTIVE (at most --queued_timeout_s); one that
fails, is suspended or times out is deleted. --dry_run prints every command instead of running it.

Arguments are data. gcloud is run without a local shell (an argument list); what a worker's shell reads
(`--command=`) is built by `shell_line`, the one place words become a shell line, every word quoted; the printed
commands are `shell_line` too, so a pasted one means what was run. `--eval_args` is split as a shell would
(`shlex`) and must be flags; a worker-local `--output_dir` is fetched by scp, which hands the path to the worker's
shell in its legacy mode and not in its SFTP mode (no quoting is right for both), so it must be plain characters.
Every argument is checked before anything is created.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from typing import Callable, Sequence

from absl import flags

from s2sjax.runtime import cli
from s2sjax.runtime.errors import UserError

ACTIONS = ("create", "install", "run", "fetch", "delete", "all")
REMOTE_DIR = "s2sjax"  # relative to the worker's home, where ssh and scp start: a quoted "~" would not expand
PLAIN_PATH = re.compile(r"[A-Za-z0-9._+,@%=/~-]+")  # no character any shell reads as syntax
UNUSABLE_QUEUED_STATES = ("FAILED", "SUSPENDING", "SUSPENDED")  # a queued resource never leaves these for ACTIVE


class LaunchArgumentError(UserError, ValueError):
  """An argument of launch.tpu that cannot be handed on as it is; refused before anything is created."""


def shell_line(argv: Sequence[str]) -> str:
  """The words as one line a POSIX shell reads back into exactly these words (each quoted where it needs it)."""
  return shlex.join(argv)


def eval_flags(eval_args: str) -> list[str]:
  """`--eval_args` split into words as a shell would, each a flag of s2sjax.eval (`--name` or `--name=value`)."""
  try:
    words = shlex.split(eval_args)
  except ValueError as e:  # an unbalanced quote: no worker could parse the command either
    raise LaunchArgumentError(f"--eval_args={eval_args!r} cannot be split into words ({e})") from e
  for word in words:
    if not word.startswith("--"):
      raise LaunchArgumentError(
          f"--eval_args: {word!r} is not a flag of s2sjax.eval (each word is --name or --name=value; a value "
          "holding spaces goes in quotes within its word, as in --eval_args=\"--step_pattern='a b'\")")
  return words


class Launcher:
  """Builds (and, unless dry, runs) the gcloud commands of one TPU evaluation."""

  def __init__(self, name: str, zone: str, accelerator: str, runtime: str, project: str | None, spot: bool,
               queued: bool, dry_run: bool, echo: Callable[[str], None] = print,
               runner: Callable[[Sequence[str]], int] | None = None, recreate_wait_s: float = 30.0,
               read_output: Callable[[Sequence[str]], str] | None = None, poll_interval_s: float = 30.0,
               queued_timeout_s: float = 7200.0):
    self.name, self.zone, self.accelerator, self.runtime = name, zone, accelerator, runtime
    self.project, self.spot, self.queued, self.dry_run = project, spot, queued, dry_run
    self.queued_resource = f"{name}-qr"
    self.echo = echo
    self.recreate_wait_s = 0.0 if dry_run else recreate_wait_s  # give the zone a moment before asking again
    self.poll_interval_s, self.queued_timeout_s = poll_interval_s, queued_timeout_s
    self.runner = runner or (lambda argv: subprocess.run(list(argv)).returncode)
    # stdout only: gcloud's errors still reach the terminal
    self.read_output = read_output or (lambda argv: subprocess.run(list(argv), stdout=subprocess.PIPE, text=True,
                                                                   check=True).stdout)
    self.deleted = False  # set by a delete until the next create, so cleanup paths never delete twice

  def _gcloud(self, *args: str) -> list[str]:
    argv = ["gcloud", *args, f"--zone={self.zone}"]
    return argv + ([f"--project={self.project}"] if self.project else [])

  def _do(self, argv: Sequence[str], check: bool = True) -> int:
    self.echo(shell_line(argv))
    if self.dry_run:
      return 0
    code = self.runner(argv)
    if check and code:
      raise RuntimeError(f"command failed ({code}): {shell_line(argv)}")
    return code

  def create(self) -> None:
    self.deleted = False
    if self.queued:
      argv = self._gcloud("compute", "tpus", "queued-resources", "create", self.queued_resource,
                          f"--node-id={self.name}", f"--accelerator-type={self.accelerator}",
                          f"--runtime-version={self.runtime}")
    else:
      argv = self._gcloud("compute", "tpus", "tpu-vm", "create", self.name, f"--accelerator-type={self.accelerator}",
                          f"--version={self.runtime}")
    self._do(argv + (["--spot"] if self.spot else []))
    if self.queued:
      self.wait_until_active()

  def wait_until_active(self) -> None:
    """Queued-resource create returns once the request is accepted; its VMs are usable only once it is ACTIVE."""
    describe = self._gcloud("compute", "tpus", "queued-resources", "describe", self.queued_resource,
                            "--format=value(state.state)")
    self.echo(shell_line(describe))
    if self.dry_run:
      return
    deadline = time.monotonic() + self.queued_timeout_s
    last_state = None
    while (state := self.read_output(describe).strip()) != "ACTIVE":
      if state != last_state:
        self.echo(f"# {self.queued_resource} is {state}, waiting for ACTIVE")
        last_state = state
      if state in UNUSABLE_QUEUED_STATES or time.monotonic() >= deadline:
        self.delete()  # a request left behind could still be provisioned, and billed, later
        why = state if state in UNUSABLE_QUEUED_STATES else f"still {state} after {self.queued_timeout_s:g} s"
        raise RuntimeError(f"queued resource {self.queued_resource} is {why} (--queued_timeout_s); deleted it")
      time.sleep(self.poll_interval_s)

  def ssh_all(self, *argv: str, check: bool = True) -> int:
    """One command (its words) on every worker of the slice at once (how JAX multi-host programs start), run in
    the project's folder there."""
    command = f"cd {shell_line([REMOTE_DIR])} && {shell_line(argv)}"
    return self._do(self._gcloud("compute", "tpus", "tpu-vm", "ssh", self.name, "--worker=all",
                                 f"--command={command}"), check)

  def install(self, source_dir: str = ".") -> None:
    self._do(self._gcloud("compute", "tpus", "tpu-vm", "scp", "--recurse", "--worker=all", source_dir,
                          f"{self.name}:{REMOTE_DIR}"))
    self.ssh_all("python3", "-m", "pip", "install", "-q", "-e", ".[tpu]")

  @staticmethod
  def eval_argv(checkpoint: str, data_dir: str, output_dir: str, eval_args: str) -> list[str]:
    return ["python3", "-m", "s2sjax.eval", f"--checkpoint={checkpoint}", f"--data_dir={data_dir}",
            f"--output_dir={output_dir}", "--distributed", *eval_flags(eval_args)]

  def check_arguments(self, checkpoint: str, data_dir: str, output_dir: str, eval_args: str) -> None:
    """Everything run and fetch will hand on, refused now if it cannot be (before a slice is created)."""
    self.eval_argv(checkpoint, data_dir, output_dir, eval_args)
    self.fetch_argv(output_dir, "")

  def run(self, checkpoint: str, data_dir: str, output_dir: str, eval_args: str, retries: int) -> None:
    """Runs on all workers; on failure of a spot slice, recreates it and reruns (the output directory resumes)."""
    argv = self.eval_argv(checkpoint, data_dir, output_dir, eval_args)
    for attempt in range(retries + 1):
      if self.ssh_all(*argv, check=False) == 0:
        return
      if attempt == retries or not self.spot:
        raise RuntimeError(f"evaluation failed after {attempt + 1} attempt(s)")
      self.echo(f"# attempt {attempt + 1} failed (preempted?): recreating {self.name} and resuming into {output_dir}")
      self.delete()
      time.sleep(self.recreate_wait_s)
      self.create()
      self.install()

  def fetch_argv(self, output_dir: str, fetch_to: str) -> list[str]:
    if output_dir.startswith("gs://"):
      return ["gcloud", "storage", "rsync", "--recursive", output_dir, fetch_to]
    # a worker-local directory: process 0 wrote it on worker 0, relative to where the eval ran
    if not PLAIN_PATH.fullmatch(output_dir):
      raise LaunchArgumentError(
          f"--output_dir={output_dir!r}: a worker-local output directory is fetched by scp, which may hand it to "
          "the worker's shell; use letters, digits and ._+,@%=/~- only, or a gs:// directory")
    remote_dir = output_dir if output_dir.startswith(("/", "~")) else f"{REMOTE_DIR}/{output_dir}"
    return self._gcloud("compute", "tpus", "tpu-vm", "scp", "--recurse", "--worker=0", f"{self.name}:{remote_dir}",
                        fetch_to)

  def fetch(self, output_dir: str, fetch_to: str) -> None:
    self._do(self.fetch_argv(output_dir, fetch_to))

  def delete(self) -> None:
    if self.deleted:
      return
    if self.queued:
      self._do(self._gcloud("compute", "tpus", "queued-resources", "delete", self.queued_resource, "--force",
                            "--quiet"), check=False)
    else:
      self._do(self._gcloud("compute", "tpus", "tpu-vm", "delete", self.name, "--quiet"), check=False)
    self.deleted = True

  def run_all(self, checkpoint: str, data_dir: str, output_dir: str, eval_args: str, retries: int,
              fetch_to: str) -> None:
    """create, install, run, fetch, delete. Whatever fails, the slice is deleted (it bills until then) and the error
    is raised again; a failed evaluation's partial results are still fetched."""
    self.check_arguments(checkpoint, data_dir, output_dir, eval_args)
    run_started = False
    try:
      self.create()
      self.install()
      run_started = True
      self.run(checkpoint, data_dir, output_dir, eval_args, retries)
    except Exception:
      if run_started:
        try:
          self.fetch(output_dir, fetch_to)
        except Exception as fetch_error:  # the evaluation's error is the one to report
          self.echo(f"# could not fetch partial results: {fetch_error}")
      raise
    else:
      self.fetch(output_dir, fetch_to)
    finally:
      self.delete()


def main(argv):
  del argv
  F = flags.FLAGS
  launcher = Launcher(F.name, F.zone, F.accelerator, F.runtime, F.project, F.spot, F.queued, F.dry_run,
                      queued_timeout_s=F.queued_timeout_s)
  actions = {
      "create": launcher.create,
      "install": launcher.install,
      "run": lambda: launcher.run(F.checkpoint, F.data_dir, F.output_dir, F.eval_args, F.retries),
      "fetch": lambda: launcher.fetch(F.output_dir, F.fetch_to),
      "delete": launcher.delete,
      "all": lambda: launcher.run_all(F.checkpoint, F.data_dir, F.output_dir, F.eval_args, F.retries, F.fetch_to),
  }
  if F.dry_run:
    print("# dry run: commands are printed, not run")
  actions[F.action]()
  return 0


def define_flags() -> None:
  flags.DEFINE_enum("action", "all", ACTIONS, "What to do.")
  flags.DEFINE_string("name", "s2sjax-eval", "TPU VM (node) name.")
  flags.DEFINE_string("zone", None, "Zone, e.g. us-east5-b.")
  flags.DEFINE_string("project", None, "Google Cloud project (default: gcloud's).")
  flags.DEFINE_string("accelerator", "v5litepod-8", "Accelerator type, e.g. v5litepod-16, v4-32, v6e-8.")
  flags.DEFINE_string("runtime", "v2-alpha-tpuv5-lite", "TPU software version.")
  flags.DEFINE_bool("spot", False, "Spot capacity: preempted slices are recreated and the evaluation resumes.")
  flags.DEFINE_bool("queued", False, "Ask for the slice through a queued resource and wait until it is ACTIVE.")
  flags.DEFINE_integer("queued_timeout_s", 7200, "Longest wait for a queued resource to become ACTIVE; then it is "
                       "deleted.", lower_bound=0)
  flags.DEFINE_string("checkpoint", None, "Checkpoint path, glob or list (gs:// or worker-local).")
  flags.DEFINE_string("data_dir", None, "Built datasets (gs:// so every worker reads them).")
  flags.DEFINE_string("output_dir", None, "Results (gs://, so a recreated slice resumes from them).")
  flags.DEFINE_string("eval_args", "--task=all --modality=both", "Further s2sjax.eval flags.")
  flags.DEFINE_string("fetch_to", "./tpu-eval-results", "Local directory for the results.")
  flags.DEFINE_integer("retries", 3, "Recreate-and-resume attempts for spot slices.", lower_bound=0)
  flags.DEFINE_bool("dry_run", False, "Print the commands instead of running them.")
  flags.mark_flags_as_required(["zone", "checkpoint", "data_dir", "output_dir"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)
