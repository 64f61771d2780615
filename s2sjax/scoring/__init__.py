"""Scoring: the models (`model`), their families and architectures, other stacks' checkpoints (`stacks`),
checkpoints, the scorer and the evaluator, and the libraries of the pre-flight (`preflight`), the
planner (`planner`), one sequence's log-probs (`log_probs`) and the performance benches. It imports
the plumbing and the data stage (docs/architecture.md, "Stages")."""
