"""The data contract and its formats: modalities, row formats and packing (`formats`), specs (`specs/`),
the task registry (`task_registry`), builds and their questions, the task data a build wrote, and each
task's arithmetic (`metrics`). It imports the run-time plumbing only (docs/architecture.md, "Stages")."""
