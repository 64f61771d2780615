"""Scoring: the model kinds the scorer drives (`architectures`: each pairs a network of s2sjax/model with its scoring
step and checks), checkpoint I/O (`checkpoints`: this project's format, other stacks', `--checkpoint` globs), the
jitted, sharded step (`scorer`), the evaluator, the default model, and the libraries of the pre-flight (`preflight`),
the planner (`planner`) and one sequence's log-probs (`log_probs`). It imports the plumbing, the numerics, the data
stage and the model (docs/architecture.md, "Stages")."""
