"""What lm-eval hands the `s2sjax` backend besides requests: its device and batch size arguments, model_args
refused by name before a model is loaded, its registry, its command line and its git lookup (no model loaded: the
backend's own numbers are tests/test_lm_eval.py's)."""

import logging
import shutil
import signal
import sys

import jax
import numpy as np
import pytest

from s2sjax.commands import lm_eval as backend
from s2sjax.scoring import lm_eval_steps as steps
from s2sjax.runtime import sharding
from s2sjax.model.config import ModelConfig
from s2sjax.data.packing import RowShape


def test_lm_evals_device_names_the_jax_devices():
  assert backend.devices_for(None) == jax.devices()
  assert backend.devices_for("cpu") == jax.devices("cpu")
  assert backend.devices_for("cpu:3") == [jax.devices("cpu")[3]]
  with pytest.raises(ValueError, match="device='mps': the s2sjax backend runs on JAX's cpu, cuda, gpu, rocm, tpu"):
    backend.devices_for("mps")
  with pytest.raises(ValueError, match="device='cpu:8': this process has 8 cpu devices \\(0..7\\)"):
    backend.devices_for("cpu:8")


def test_a_calls_rows_are_spread_evenly_over_the_steps_they_need():
  assert [steps.even_steps(rows, 8) for rows in (1, 8, 9, 11, 16, 17)] == [1, 8, 5, 6, 8, 6]
  assert steps.even_steps(11, 64) == 11


def test_auto_batch_size_takes_what_fits_and_what_the_call_needs():
  config = ModelConfig(family="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                       num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=1e5, rotary_dim=64, rope_interleaved=False,
                       rms_norm_eps=1e-5, qkv_bias=False, o_bias=False, mlp_bias=False, tie_embeddings=True)
  shape = RowShape(1024, 512, 256)
  mesh = sharding.make_mesh("data:4,model:2")  # 4 data-parallel devices (conftest's 8 host devices)
  step = lambda rows, memory, most=64: steps.rows_per_step(config, shape, rows, mesh, "float32", most, memory)
  assert step(3, 2**40) == 4  # the call's 3 rows, one a device: a multiple of the data-parallel devices
  assert step(1000, 2**40) == 4 * steps.CPU_ROWS_PER_DEVICE == 8  # a CPU's smaller steps
  assert step(1000, 2**40, most=4) == 4  # max_batch_size
  # per device: half the 538 MB of fp32 weights (256.6 MiB) and 71.5 MiB a row (3 buffers of fp32 scores over 5 of
  # the 9 heads, 1024^2 each, and the rest), in 90% of its memory
  assert step(1000, 400 * 2**20) == 4 * 1 and step(1000, 500 * 2**20) == 4 * 2


def test_batch_size_must_be_rows_or_auto():
  with pytest.raises(ValueError, match="batch_size must be a number of rows or auto, not 'big'"):
    backend.S2SJaxLM(batch_size="big")
  with pytest.raises(ValueError, match="give one of them"):
    backend.S2SJaxLM(pretrained="a", checkpoint="b")


def test_batch_size_in_model_args_is_taken_as_the_hf_backend_takes_it_and_checked_in_the_constructor():
  """lm-eval always passes its own --batch_size (1 by default) beside model_args: a batch_size in model_args is the
  one used, never two values for one argument; a bad one is refused there, in one line."""
  lm_evals = {"batch_size": 1, "max_batch_size": None, "device": None}
  assert backend.merged_arguments({"batch_size": "auto"}, lm_evals) == {"batch_size": "auto"}
  for arg_string, refusal in [("batch_size=0", "batch_size must be a number of rows or auto, not 0"),
                              ("batch_size=-2", "batch_size must be a number of rows or auto, not -2"),
                              ("max_batch_size=-1", "max_batch_size=-1: the most rows a step, a positive number"),
                              ("row_length=0", "row_length=0: the packed row's length is a positive multiple of 32"),
                              ("rows=4", "model_args rows=4: not an argument of the s2sjax backend"),
                              ("pretrained=no/such/folder", "pretrained=no/such/folder: no such checkpoint")]:
    with pytest.raises(backend.BackendError) as refused:
      backend.S2SJaxLM.create_from_arg_string(arg_string, lm_evals)
    assert str(refused.value).startswith(refusal) and "\n" not in str(refused.value), arg_string
  with pytest.raises(backend.BackendError, match="not 0"):
    backend.S2SJaxLM.create_from_arg_obj({"batch_size": 0}, lm_evals)


def test_the_registry_finds_the_backend_by_name():
  from lm_eval.api.registry import get_model, model_registry

  assert get_model("s2sjax") is backend.S2SJaxLM
  assert "hf" in model_registry and "vllm" in model_registry  # lm-eval's own models are still there


@pytest.fixture
def signal_handlers_kept():
  """The command line installs s2sjax.runtime.cli's SIGINT / SIGTERM handlers: this process gets its own back after."""
  handlers = {each: signal.getsignal(each) for each in (signal.SIGINT, signal.SIGTERM)}
  yield
  for each, handler in handlers.items():
    signal.signal(each, handler)


@pytest.fixture
def lm_eval_logging_kept(monkeypatch):
  """lm-eval's command line configures its "lm_eval" logger once a process (a handler on the stderr of the moment,
  here a test's captured one, and no propagation): this process gets the logger back as it was after, or a later
  test's caplog sees none of the backend's warnings and the handler writes to a closed stream."""
  import lm_eval.utils

  logger = logging.getLogger("lm_eval")
  level, propagate, handlers = logger.level, logger.propagate, list(logger.handlers)
  monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", lm_eval.utils._LOGGING_CONFIGURED)
  yield
  logger.setLevel(level)
  logger.propagate = propagate
  logger.handlers[:] = handlers


def test_the_command_line_is_lm_evals_own_with_s2sjax_the_default_model(monkeypatch, signal_handlers_kept):
  import lm_eval.__main__

  seen = []
  monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: seen.append(list(sys.argv[1:])))
  monkeypatch.setattr(sys, "argv", ["s2sjax.lm_eval"])
  backend.cli_evaluate(["run", "--tasks", "t", "--model_args", "pretrained=DIR"])
  backend.cli_evaluate(["--tasks=t", "--model", "hf"])
  backend.cli_evaluate(["ls", "tasks"])
  backend.cli_evaluate(["--help"])
  assert seen == [["run", "--tasks", "t", "--model_args", "pretrained=DIR", "--model", "s2sjax"],
                  ["--tasks=t", "--model", "hf"], ["ls", "tasks"], ["--help"]]


@pytest.mark.parametrize("words, refusal", [
  (["--model_args", "dtype=foo"], "error: dtype=foo: the s2sjax backend scores in float32 or bfloat16"),
  (["--batch_size", "many"], "error: batch_size must be a number of rows or auto, not 'many'"),
  (["--model_args", "mesh=data:-1+model:3"], "error: mesh=data:-1+model:3: mesh 'data:-1,model:3': 1 devices are "
                                             "not divisible by 3"),
])
def test_the_command_line_refuses_the_backends_arguments_before_lm_eval_indexes_its_tasks(
    words, refusal, monkeypatch, capsys, signal_handlers_kept, lm_eval_logging_kept):
  import lm_eval.tasks

  def index(*args, **kwargs):
    raise AssertionError("lm-eval's tasks were indexed before the backend's arguments were checked")

  monkeypatch.setattr(lm_eval.tasks.TaskManager, "__init__", index)
  monkeypatch.setattr(sys, "argv", ["s2sjax.lm_eval"])
  with pytest.raises(SystemExit) as exited:
    backend.cli_evaluate(["run", "--tasks", "sample_storycloze", "--device", "cpu:0", *words])
  assert exited.value.code == 1 and capsys.readouterr().err.splitlines()[-1] == refusal


def test_calls_share_compiled_steps_on_a_ladder_of_windows_and_tables():
  from s2sjax.data.packing import neighbour_free_bound

  fitted = RowShape(1024, 40, 7, max_item=96)
  reaches = {n: steps.step_shape(fitted, n).max_item - 1
             for n in (2, 64, 65, 129, 150, 193, 250, 300, 400, 600, 1000)}
  # 64 x 1, 2, 3, 4, 6, 7, then 960, 1,984: on the neighbour-free ladder (the same bits), never short of the item
  assert reaches == {2: 64, 64: 64, 65: 64, 129: 128, 150: 192, 193: 192, 250: 256, 300: 384, 400: 448, 600: 960,
                     1000: 1984}
  assert all(neighbour_free_bound(reach + 1) == reach + 1 and reach >= n - 1 for n, reach in reaches.items())
  shape = steps.step_shape(fitted, 80)
  assert (shape.length, shape.max_targets, shape.max_slots) == (1024, 64, 32)  # tables to a power of two, >= 32


def test_a_calls_rows_step_at_the_window_their_own_longest_item_needs():
  # rows whose longest items span 40, 300, 100, 300 and 20 tokens: windows reaching 64, 384, 128, 384 and 64 keys
  segment_ids = np.zeros((5, 512), np.int32)
  for row, length in enumerate((40, 300, 100, 300, 20)):
    segment_ids[row, :length] = 1
    segment_ids[row, 320:340] = 2  # a shorter item beside it
  runs = steps.steps_by_window({"segment_ids": segment_ids}, batch=2)
  # widest first, in steps of two rows, each step at its widest row's window (row 0 rides with row 2, at 128 keys)
  assert [(run.tolist(), longest) for run, longest in runs] == [([1, 3], 300), ([2, 0], 100), ([4], 20)]
  assert [steps.window_reach(longest) for _, longest in runs] == [384, 128, 64]
  # a rest of a shared root counts where its item alone lays it: 30 tokens moved 200 on are 30 tokens, not 230
  shift = np.zeros_like(segment_ids)
  segment_ids[4, 224:254], shift[4, 224:254] = 1, 204
  assert steps.steps_by_window({"segment_ids": segment_ids[4:], "key_shift": shift[4:]}, batch=2)[0][1] == 50


@pytest.mark.parametrize("model_args, refusal", [
  (dict(colour="red", dtpye="float32"), "model_args colour=red, dtpye=float32: not an argument of the s2sjax "
                                        "backend; it takes pretrained, checkpoint, mesh, dtype"),
  (dict(dtype="foo"), "dtype=foo: the s2sjax backend scores in float32 or bfloat16"),
  (dict(row_length=0), "row_length=0: the packed row's length is a positive multiple of 32"),
  (dict(row_length=-32), "row_length=-32: "),
  (dict(row_length=100), "row_length=100: "),
  (dict(row_length="long"), "row_length=long: "),
  (dict(mesh="data:-1+model:3"), "mesh=data:-1+model:3: mesh 'data:-1,model:3': 8 devices are not divisible by 3"),
])
def test_model_args_are_refused_by_name_before_a_model_is_loaded(model_args, refusal):
  # `pretrained` names nothing: every refusal comes before the checkpoint is read
  with pytest.raises(backend.BackendError) as refused:
    backend.S2SJaxLM(pretrained="/nonexistent", **model_args)
  assert str(refused.value).startswith(refusal)


def test_lm_evals_git_lookup_says_nothing_outside_a_repository(tmp_path, monkeypatch, capfd):
  import lm_eval.evaluator

  if shutil.which("git") is None:
    pytest.skip("git is not installed: lm-eval's lookup says nothing either way")
  monkeypatch.chdir(tmp_path)  # no repository here: git would say "fatal: not a git repository"
  with backend._git_quiet():
    assert lm_eval.evaluator.get_git_commit_hash() is None
  assert capfd.readouterr().err == ""
  lm_eval.evaluator.get_git_commit_hash()  # and lm-eval's own, restored after, does say it
  assert "not a git repository" in capfd.readouterr().err
