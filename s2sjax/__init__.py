"""s2sjax: S2SBench in JAX. `s2sjax.Evaluator` is the in-training evaluator (see s2sjax/scoring/evaluator.py)."""


def __getattr__(name):
  # Lazy, so that `import s2sjax` stays cheap for tools that only need a submodule.
  if name == "Evaluator":
    from s2sjax.scoring.evaluator import Evaluator

    return Evaluator
  raise AttributeError(f"module 's2sjax' has no attribute {name!r}")
