"""The benchmark's three protocols score the same numbers and count the tokens they compute correctly."""

import json

import numpy as np
import pytest

import torch  # noqa: F401 - the reference side

import jax.numpy as jnp  # noqa: E402

from checkpoints_conversion.convert import convert  # noqa: E402
from s2sjax.benchmarks import workloads as bench_items  # noqa: E402
from s2sjax.commands import bench  # noqa: E402
from tests.hf_models import save_hf, tiny_model  # noqa: E402


@pytest.mark.slow
def test_protocols_agree_and_sharing_computes_fewer_tokens(tmp_path):
  convert(save_hf(tiny_model("llama"), str(tmp_path / "hf")), str(tmp_path / "ckpt"))
  run = bench.run_workload("speech", str(tmp_path / "ckpt"), count=6, row_lengths=[512, None], batch_size=1,
                           ref_batch_size=4, dtype=jnp.float32)
  results = run["results"]
  items = bench_items.make_items("speech", 6, 512)
  lengths = [len(it.prefix) + len(c) for it in items for c in it.candidates]
  assert results["reference"]["computed"] == sum(4 * max(lengths[i : i + 4]) for i in range(0, len(lengths), 4))
  for length in ("512", "auto"):  # every protocol at every length, against the one reference
    for name in ("s2sjax, no sharing", "s2sjax, shared", "s2sjax, shared, item-local"):
      result = results[f"{name} @ {length}"]
      np.testing.assert_allclose(result["mean_nll"], results["reference"]["mean_nll"], atol=1e-4)
      assert result["max_nll_diff"] == np.nanmax(np.abs(result["mean_nll"] - results["reference"]["mean_nll"]))
    # rows, not tokens computed: with 8 host devices a step is 8 rows, more than either protocol fills at auto
    assert results[f"s2sjax, shared @ {length}"]["rows"] < results[f"s2sjax, no sharing @ {length}"]["rows"]
  # attention as s2sjax.eval's auto picks it on a CPU: the fused call over whole rows, our einsums over windows
  names = ("s2sjax, no sharing", "s2sjax, shared", "s2sjax, shared, item-local")
  assert [results[f"{name} @ 512"]["attention"] for name in names] == ["dot_product", "dot_product", "xla"]
  assert results["s2sjax, shared @ 512"]["row_length"] == 512
  assert results["s2sjax, shared @ auto"]["row_length"] == bench.row_shape(items, None, True).length
  assert "| s2sjax, shared @ 512 | 512 | dot_product |" in bench.format_table(run)


@pytest.mark.slow
def test_accelerator_mode_counts_useful_flops_and_reports_mfu():
  import jax

  from s2sjax.benchmarks import accelerator as bench_accelerator
  from s2sjax.model.decoder import init_params, param_count
  from s2sjax.data.packing import Item, RowShape, pack

  config = bench_accelerator.sizes()["tiny"]
  assert config.num_params() == param_count(init_params(config, jax.random.PRNGKey(0)))  # the FLOP count's base
  # one item by hand: a prefix of 5 laid once, candidates of 3 and 2 tokens branching from it, of which 2 and 1 are
  # laid (a candidate's last token is only predicted)
  rows, _ = pack([Item(np.arange(1, 6), (np.arange(3), np.arange(2)))], RowShape.for_length(64))
  prefix_pairs = 5 * 6 // 2  # causal over the prefix
  branch_pairs = sum(c * 5 + c * (c + 1) // 2 for c in (2, 1))  # each laid candidate token: the prefix, its branch
  assert bench_accelerator.attended_keys(rows) == prefix_pairs + branch_pairs
  tokens, targets = 8, 5
  weights = 2 * (config.num_params() - config.vocab_size * config.hidden_size)  # tied: the table is the head
  attention = 4 * config.num_layers * config.num_heads * config.head_dim * (prefix_pairs + branch_pairs)
  expected = tokens * weights + attention + targets * 2 * config.hidden_size * config.vocab_size
  assert bench_accelerator.step_flops(config, rows) == pytest.approx(expected)
  # 1 row asked on 8 data-parallel host devices: 8 rows measured, all of them real work
  result = bench_accelerator.measure("tiny", 512, 1, "xla", jnp.float32, repeats=1, peak=1.0)
  assert result["rows"] == 8 and result["fill"] > 0.9
  assert result["tokens_per_s"] > 0 and result["mfu"] == pytest.approx(result["tflops_per_s"] / 8)  # 8 host devices
  assert bench_accelerator.peak_tflops("TPU v5 lite") == 197 and bench_accelerator.peak_tflops("NVIDIA H200") == 989


@pytest.mark.slow
def test_accelerator_layouts_score_the_same_candidates_alike(capsys):
  from s2sjax.benchmarks import accelerator as bench_accelerator

  results = bench_accelerator.run(["tiny"], ["xla", "flash"], 512, 1, jnp.float32, "data:-1", None, False, None,
                                  ["noshare", "shared", "local"])
  # flash reads no branch ids: only its unshared line exists, skipped off TPU; xla runs every layout
  assert [(r["attention"], r["protocol"]) for r in results] == [
    ("xla", "noshare"), ("xla", "shared"), ("xla", "local"), ("flash", "noshare")]
  assert "TPU kernel" in results[3]["skipped"]
  first, *others = results[:3]
  assert first["max_nll_difference"] == 0.0
  assert all(r["max_nll_difference"] < 1e-5 for r in others)  # fp32: sharing and item-local change no score
  assert len(capsys.readouterr().out.splitlines()) == 2 + 4


def test_accelerator_mode_streams_rows_skips_what_cannot_run_here_and_compiles_abstractly(tmp_path, capsys):
  from s2sjax.scoring import planner
  from s2sjax.benchmarks import accelerator as bench_accelerator

  with pytest.raises(ValueError, match="unknown model size 'qwen2.5-3b'"):
    bench_accelerator.run(["tiny", "qwen2.5-3b"], ["xla"], 512, 2, jnp.float32, "data:-1", None, False, None)
  with pytest.raises(ValueError, match=r"unknown attention\(s\) \['flsh'\]"):  # before any measurement
    bench_accelerator.run(["tiny"], ["xla", "flsh"], 512, 2, jnp.float32, "data:-1", None, False, None)
  output = tmp_path / "accel.json"
  results = bench_accelerator.run(["tiny"], ["flash", "dot_product"], 512, 2, jnp.float32, "data:4,model:2", None,
                                  True, str(output), ["noshare"])
  flash, dot = results
  assert "TPU kernel" in flash["skipped"]  # Pallas interpret mode off TPU is a numbers check, not a speed
  config = bench_accelerator.sizes()["tiny"]
  # the 8 devices: 4 data-parallel rows per step; XLA's analysis holds the (tied, model-split) weights and more
  assert dot["rows"] == 4 and dot["compiled_gib"] * 2**30 > planner.param_bytes(config, "float32") / 2
  printed = capsys.readouterr().out.splitlines()
  assert printed[0].startswith("| model |") and len(printed) == 4 and "compiled:" in printed[3]
  assert json.loads(output.read_text()) == results


@pytest.mark.slow
def test_a_configuration_that_fails_is_reported_and_the_rest_still_run(monkeypatch, capsys):
  from s2sjax.benchmarks import accelerator as bench_accelerator

  real = bench_accelerator.benchmark_rows
  def rows_or_oom(config, length, count, share_prefix):
    if length == 256:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 93.1GiB")
    return real(config, length, count, share_prefix)

  monkeypatch.setattr(bench_accelerator, "benchmark_rows", rows_or_oom)
  first, second = (bench_accelerator.measure("tiny", length, 1, "xla", jnp.float32, repeats=1)
                   for length in (256, 512))
  assert first["skipped"].startswith("out of memory: RESOURCE_EXHAUSTED") and second["tokens_per_s"] > 0
  assert "out of memory" in bench_accelerator.format_row(first)


def test_the_machine_line_names_the_processor_and_each_sides_matmul_speed():
  from s2sjax.benchmarks import machine as bench_machine

  speeds = bench_machine.matmul_speeds("float32", size=64, repeats=1)  # a measurement: its figures are not asserted on
  assert set(speeds) == {"size", "dtype", "torch_gflops", "xla_gflops"} and speeds["dtype"] == "float32"
  machine = {"processor": "AMD EPYC", "cores": 2, "matmul": dict(speeds, torch_gflops=236.4, xla_gflops=530.2)}
  assert bench_machine.machine_line(machine) == ("machine: AMD EPYC, 2 cores; one 64^2 float32 matmul: torch 236 GFLOP/s, "
                                               "XLA 530 GFLOP/s")


@pytest.mark.slow
def test_lm_eval_mode_runs_lm_evals_own_cmmlu_requests_through_both_backends(tiny_sample):
  # a 2-layer qwen2 with the real Qwen2.5 tokenizer: lm-eval's CMMLU prompts, both backends, a float64 reference
  import pathlib

  cmmlu = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "realdata" / "cmmlu" / "data"
  if not cmmlu.exists():
    pytest.skip(f"the CMMLU data is not at {cmmlu}")
  run = bench.run_lm_eval(tiny_sample["ckpt"], "cmmlu", str(cmmlu), ["agronomy"], limit=3, num_fewshot=1,
                          row_length=512, batch_size=2, ref_batch_size=4, float64_requests=8)
  assert (run["documents"], run["requests"], run["float64_requests"]) == (3, 12, 8)
  assert run["decisions_identical"] and run["is_greedy_identical"] and run["max_abs_diff_s2sjax_hf"] < 1e-4
  for backend in ("hf", "s2sjax"):  # fp32 against float64, over one-token choices after ~200-token contexts
    assert run[backend]["max_abs_err_float64"] < 1e-4
  # the fitted rows: a target table of 32 (12 targets, 4 a context) and windows over the items, not the row
  assert run["s2sjax"]["targets"] == [32]
  # the timed call compiled nothing (the first did); every phase of it is reported
  assert set(run["s2sjax"]["where"]) == set(bench.PHASES) and run["s2sjax"]["where"]["compile"] == 0
  assert run["s2sjax"]["first_call_compile_s"] > 0
  # one subject's shot is the same first-n dev question before each document: a prefix tree lays it once
  context = run["context_tokens"]
  assert context["prefix_tree"] < context["distinct"] <= context["mean"] * run["requests"]
  # hf's logits cache forwards each context once (one-token choices), its 3 in one batch padded to the longest;
  # s2sjax executes at least the rows it packed, which lay at least the contexts' prefix tree
  assert (run["hf"]["forwards"], run["hf"]["positions"]) == (1, 3 * context["max"])
  ours = run["s2sjax"]
  laid = sum(rows * length for rows, length in zip(ours["rows"], ours["length"]))
  assert ours["positions"] >= laid >= context["prefix_tree"]
  (line,) = bench.format_lm_eval([run]).splitlines()[2:]
  assert line.startswith("| cmmlu 1-shot | 3 | 12 |") and line.endswith("| True (is_greedy True) |")


def test_the_cmmlu_requests_are_lm_evals_own(tmp_path):
  import pathlib

  cmmlu = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "realdata" / "cmmlu" / "data"
  if not cmmlu.exists():
    pytest.skip(f"the CMMLU data is not at {cmmlu}")
  names = bench.cmmlu_tasks(str(cmmlu), ["anatomy"], str(tmp_path))
  requests = bench.lm_eval_requests(names, str(tmp_path), limit=2, num_fewshot=1)
  assert [r.args[1] for r in requests] == [" A", " B", " C", " D"] * 2  # one-token choices after its delimiter
  context = requests[0].args[0]
  # lm-eval's CMMLU prompt: the subject's description, a first-n shot from dev with its answer, the question
  assert context.startswith("以下是关于解剖学的单项选择题，请直接给出正确答案的选项。\n\n")
  assert context.count("答案：") == 2 and context.count("\nA. ") == 2 and context.endswith("答案：")
  with pytest.raises(ValueError, match="lm-eval has no CMMLU subject 'anatomie'"):
    bench.cmmlu_tasks(str(cmmlu), ["anatomie"], str(tmp_path))


REALDATA = __import__("pathlib").Path(__file__).resolve().parents[1].parent / "shared" / "realdata"


@pytest.mark.parametrize("workload, folder, shots, first", [
  # lm-eval's xcopa_zh: the premise without its full stop, then its connector; the choices' first letter lowered
  ("xcopa_zh", "xcopa", 0, ("该物品用气泡包装纸包着 因为", [" 它很易碎。", " 它很小。"])),
  ("xstorycloze_zh", "xstorycloze", 0, ("我在 2011 年成为《法律与秩序》剧迷。 我当时正从中风中康复。 回家后，我尽量每一集都会追。 "
                                       "在 20 年内连续刷同一部剧是件难事。",
                                       [" 我认为《法律与秩序》是史上最烂的电视剧之一。", " 我最终看完了整部剧。"])),
  ("storycloze", "storycloze", 0, ("My friends all love to go to the club to dance. They think it's a lot of fun "
                                   "and always invite. I finally decided to tag along last Saturday. I danced "
                                   "terribly and broke a friend's toe.",
                                   [" My friends decided to keep inviting me out as I am so much fun.",
                                    " The next weekend, I was asked to please stay home."])),
])
def test_the_local_tasks_are_lm_evals_own_over_the_release_files(tmp_path, workload, folder, shots, first):
  data = REALDATA / folder
  if not data.exists():
    pytest.skip(f"the {folder} data is not at {data}")
  names = bench.lm_eval_tasks(workload, str(data), [], str(tmp_path))
  requests = bench.lm_eval_requests(names, str(tmp_path), limit=1, num_fewshot=shots)
  context, choices = first
  assert [r.args for r in requests] == [(context, choice) for choice in choices]


def test_an_lm_eval_workload_without_its_files_is_refused_by_name(tmp_path):
  with pytest.raises(ValueError, match=r"xstorycloze_en: .* has no spring2016.val.en.tsv.split_20_80_train.tsv"):
    bench.lm_eval_tasks("xstorycloze_en", str(tmp_path), [], str(tmp_path))
  with pytest.raises(ValueError, match="no lm-eval workload 'xcopa_et'"):
    bench.lm_eval_tasks("xcopa_et", str(tmp_path), [], str(tmp_path))


def test_the_prefix_tree_lays_each_common_leading_run_once():
  assert bench.trie_tokens([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 6], [7]]) == 4 + 1 + 1 + 1


@pytest.mark.slow
def test_encoded_pairs_are_the_backends_and_a_request_of_several_windows_is_refused(tmp_path, qwen_tokenizer_dir):
  from lm_eval.api.instance import Instance

  from s2sjax.commands.lm_eval import S2SJaxLM
  from tests.eval_fixtures import tiny_checkpoint

  lm = S2SJaxLM(pretrained=tiny_checkpoint(str(tmp_path), qwen_tokenizer_dir), row_length=32, batch_size=1)
  fits = Instance("loglikelihood", {}, ("The cat sat on the", " mat."), 0)
  context, continuation = lm.tok_encode("The cat sat on the"), lm.tok_encode(" mat.")
  assert bench.encoded_pairs(lm, [fits]) == [(context, continuation)]
  long = Instance("loglikelihood", {}, ("Once", " upon a time" * 12), 1)
  with pytest.raises(ValueError, match=r"request 1 \(context 'Once'...\): its continuation of \d+ tokens needs 2 "
                                       "windows at row_length=32"):
    bench.encoded_pairs(lm, [fits, long])


@pytest.mark.slow
def test_the_attention_bench_times_both_schedules_on_rows_of_items_as_wide_as_the_window():
  from s2sjax.benchmarks.local_attention import measure

  result = measure(rows=2, length=128, reach=32, heads=4, kv_heads=2, head_dim=8, dtype=jnp.float32, repeats=1)
  assert result["same_bits"] and result["all_at_once_s"] > 0 and result["looped_s"] > 0


def test_the_head_bench_gives_both_argmax_tests_the_same_inputs_and_counts_the_targets_made_greedy():
  from s2sjax.benchmarks.head import measure

  result = measure(hidden_size=8, vocab=1000, targets=16, repeats=1)
  # a quarter of the targets are made their row's argmax; random others in 1,000 are almost never it
  assert result["same_bits"] and 4 <= result["greedy_targets"] <= 5
  assert result["argmax_us_per_target"] > 0 and result["step_us_per_target"] > 0
