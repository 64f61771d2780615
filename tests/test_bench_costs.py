"""The cost curves' arithmetic and measurement (s2sjax/benchmarks/costs.py): the fitted line and its knee on
hand-computed points, and a child process's own peak memory."""

import sys

import pytest

from s2sjax.benchmarks.costs import linear_fit, timed_process


def test_a_line_is_fitted_exactly_and_called_linear():
  fit = linear_fit([100, 200, 400, 800], [7.0, 9.0, 13.0, 21.0])  # 5 s fixed + 0.02 s a question
  assert fit["fixed"] == pytest.approx(5.0) and fit["per_unit"] == pytest.approx(0.02)
  assert fit["r2"] == pytest.approx(1.0) and fit["linear"] and fit["knee"] is None


def test_the_knee_is_where_the_cost_per_unit_changes_most():
  # 0.01 s a question up to 400, then 0.1 s a question: the line misses the small points by far more than a tenth
  fit = linear_fit([100, 200, 400, 800, 1600], [10.0, 11.0, 13.0, 53.0, 133.0])
  assert not fit["linear"]
  assert fit["knee"] == dict(x=400.0, slope_before=pytest.approx(0.01), slope_after=pytest.approx(0.1))


def test_a_child_process_reports_its_own_peak_memory_and_a_failure_names_its_log(tmp_path):
  hold = [sys.executable, "-c", "import time; b = b'x' * (400 * 2**20); time.sleep(1)"]
  small = timed_process([sys.executable, "-c", "pass"], str(tmp_path / "small.log"))
  large = timed_process(hold, str(tmp_path / "large.log"))
  assert large["peak_rss_gib"] - small["peak_rss_gib"] == pytest.approx(400 / 1024, abs=0.05)
  with pytest.raises(RuntimeError, match=r"exited 3 \(log .*fails.log\):\n.*gone"):
    timed_process([sys.executable, "-c", "import sys; print('gone'); sys.exit(3)"], str(tmp_path / "fails.log"))
