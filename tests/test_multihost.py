"""Two processes of four CPU devices each (gloo on loopback) give one process's numbers; mismatches fail fast."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # two-process runs over gloo

WORKER = os.path.join(os.path.dirname(__file__), "multihost_worker.py")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run(num_processes: int, devices: int, out: str, *extra: str, timeout: int = 240):
  port = str(_free_port())
  procs = [
    subprocess.Popen([sys.executable, WORKER, port, str(num_processes), str(p), str(devices), out, *extra],
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for p in range(num_processes)
  ]
  try:
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  return [p.returncode for p in procs], outputs


def test_two_processes_equal_one(tmp_path):
  codes, outputs = _run(1, 8, str(tmp_path / "one.npy"))
  assert codes == [0], outputs
  codes, outputs = _run(2, 4, str(tmp_path / "two.npy"))
  assert codes == [0, 0], outputs
  rows = int(outputs[0].split("process 0: ")[1].split()[0])
  assert rows == 9  # odd: the processes' shares (every 2nd row) are 5 and 4 rows, so their step counts differ
  assert f"process 1: {rows} rows scored" in outputs[1]
  np.testing.assert_allclose(np.load(tmp_path / "two.npy"), np.load(tmp_path / "one.npy"), atol=1e-5, equal_nan=True)


def test_processes_with_different_row_shapes_fail_with_a_clear_error(tmp_path):
  codes, outputs = _run(2, 4, str(tmp_path / "x.npy"), "--mismatch", timeout=180)
  assert codes == [3, 3], outputs
  for text in outputs:
    assert "processes disagree on (rows, L, M, C, K, batch)" in text


def test_a_mesh_whose_batch_shards_span_processes_is_refused(tmp_path):
  # model:-1 over 2 x 4 devices: one batch shard on both processes, which feed different rows (0.13 nats off)
  codes, outputs = _run(2, 4, str(tmp_path / "x.npy"), "--mesh=data:1,model:-1", timeout=180)
  assert codes == [3, 3], outputs
  for text in outputs:
    assert "puts a batch shard on devices of 2 processes" in text
