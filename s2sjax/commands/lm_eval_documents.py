"""A registered task's questions as lm-evaluation-harness documents, read from its release by the build's own reader
(`tasks.release.read_questions`): what a task YAML of docs/my_tasks names as its dataset,

  custom_dataset: !function s2sjax.commands.lm_eval_documents.questions
  dataset_kwargs: {task: sstorycloze}
  metadata: {version: 1.0, release_dir: tasks/sample/release}

lm-eval calls `custom_dataset` with the task's metadata and dataset_kwargs as keyword arguments
(lm_eval/api/task.py:860-867 at 0.4.13; `--metadata '{"release_dir": ...}'` overrides the YAML's), and its YAML
loader imports a `!function` it finds no file for beside the YAML as a module (lm_eval/tasks/_yaml_loader.py,
`_import_func_in_yml`). Every release format the registry holds, a plugin's too, gives documents so.

A document is one question: `id`, `language`, `prefix` (its written first part), `candidates` (the texts),
`answer` (the right candidate's index), `prefix_audio` (its spoken prefix: one recording, or none) and
`candidate_audio` (each candidate's recording, where the release has them). A recording is `{"path": wav}`, HF
datasets' undecoded Audio form, which the s2sjax backend reads from a task's `doc_to_audio`. lm-eval gives every
candidate of a document the same context, so a question whose candidates follow different prefixes is refused.
"""

from __future__ import annotations

import hashlib

import datasets

from s2sjax.runtime.errors import UserError
from tasks.release import Question, read_questions


class DocumentError(UserError, ValueError):
  """A question lm-eval's documents cannot hold as it is."""


def _content(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def document(question: Question) -> dict:
  """One question as an lm-eval document (the module's docstring says its fields)."""
  prefixes, recordings = set(question.prefixes), {_content(p) if p else "" for p in question.audio_paths}
  if len(prefixes) > 1 or len(recordings) > 1:
    raise DocumentError(f"question {question.id}: its candidates follow different prefixes (texts or recordings "
                        f"{', '.join(question.audio_paths)}); an lm-eval document gives all its choices one context")
  return {"id": question.id, "language": question.language, "prefix": question.prefixes[0],
          "candidates": list(question.candidates), "answer": question.correct,
          "prefix_audio": [{"path": question.audio_paths[0]}] if question.audio_paths[0] else [],
          "candidate_audio": [{"path": path} for path in question.candidate_audio_paths]}


def questions(task: str, release_dir: str, **lm_eval_metadata) -> dict[str, datasets.Dataset]:
  """The `test` split of documents of `task`'s release at `release_dir` (relative paths are the working
  directory's, as lm-eval's own data_files are). `lm_eval_metadata`: what else lm-eval passes (the YAML's
  metadata, the run's model_args), which documents do not depend on."""
  del lm_eval_metadata
  return {"test": datasets.Dataset.from_list([document(q) for q in read_questions(task, release_dir)])}
