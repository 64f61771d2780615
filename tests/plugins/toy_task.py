"""A task only the tests define: its registry record and its builder, in one plugin module (S2SJAX_PLUGINS)."""

from s2sjax import benchmarks
from tasks.tfds_builder import S2SBenchBuilder

TOY = benchmarks.register(benchmarks.Benchmark(
  "toy_cloze", "ToyCloze", "en", "story_pairs", "Toy/toy_cloze.jsonl", "Toy/toy_cloze_wav", "Toy/toy_cloze_last_wav",
  decision="pair",
  candidates=2, sizes=benchmarks.PlannerSizes(questions=4, prefix_tokens=40, candidate_tokens=10, seconds=6.0),
  builder="tests.plugins.toy_task:Builder"))


class Builder(S2SBenchBuilder):
  """ToyCloze packed rows."""

  name = "toy_cloze"  # TFDS names a builder after its class; the data folder must carry the task's name
  TASK = "toy_cloze"
