"""`python -m s2sjax.lm_eval` and `import s2sjax.lm_eval` (which registers the `s2sjax` model with lm-eval), kept at
their name; the backend is `s2sjax/commands/lm_eval.py` (entry points sit apart from the core: docs/architecture.md,
"Packages")."""

from s2sjax.commands.lm_eval import S2SJaxLM, cli_evaluate

__all__ = ["S2SJaxLM", "cli_evaluate"]

if __name__ == "__main__":
  cli_evaluate()
