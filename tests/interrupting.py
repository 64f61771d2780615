"""A command stopped mid-step: its N-th step held (`s2sjax.runtime.cli.STALL_WORKER`) until the command stops waiting for
it, the signal sent once the command says that step is under way, the process waited on (not a clock)."""

import os
import signal
import subprocess
import time

import pytest

from s2sjax.runtime import cli

HANG_GUARD_S = 600  # a bound on a hung command, not a measurement


def interrupt_mid_step(command: list[str], step: int, signum: int, **popen) -> tuple[int, str, float]:
  """Runs `command` with its `step`-th step held and sends `signum` once that step is under way. Returns the exit
  status, the whole stderr and the seconds from the signal to the exit (printed too: the test's output says it)."""
  env = dict(popen.pop("env", os.environ), **{cli.STALL_WORKER: str(step)})
  process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, **popen)
  try:
    seen = []
    for line in process.stderr:  # the process's own word that the step is under way, not a guess at a time
      seen.append(line)
      if line.startswith(f"{cli.STALL_WORKER}={step}:"):
        break
    else:
      pytest.fail(f"step {step} never started: {''.join(seen)[-3000:]}")
    sent = time.monotonic()
    process.send_signal(signum)
    process.wait(timeout=HANG_GUARD_S)
    latency = time.monotonic() - sent
    stderr = "".join(seen) + process.stderr.read()
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()
  print(f"{signal.Signals(signum).name} during step {step} of {command[2]}: it ended {latency:.2f} s after the signal")
  return process.returncode, stderr, latency
