"""A task only the tests define: its registry record, the one registration a task is, in a plugin module
(S2SJAX_PLUGINS)."""

from s2sjax.data import task_registry

TOY = task_registry.register(task_registry.Task(
  "toy_cloze", "ToyCloze", "en", "story_pairs", "Toy/toy_cloze.jsonl", "Toy/toy_cloze_wav", "Toy/toy_cloze_last_wav",
  decision="pair",
  candidates=2, sizes=task_registry.PlannerSizes(questions=4, prefix_tokens=40, candidate_tokens=10, seconds=6.0)))
