"""The packages depend one way: `s2sjax` (model, packing, scoring, metrics, result files) imports nothing from
`tasks` or `checkpoints_conversion`; those two import `s2sjax` and not each other. Only the command-line wiring
named below reaches across (docs/architecture.md, "Packages")."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Modules whose job is to wire the packages into a command line or an example: the eval CLI (builds the bundled
# sample, converts the default model), the embedded default model (converted on first use), the benchmark (loads
# the PyTorch reference the converter verifies against), the examples, and the prepare CLI's default tokenizer
# (the default model's).
WIRING = {"s2sjax/eval.py", "s2sjax/default_model.py", "s2sjax/bench.py", "s2sjax/examples/two_stage_training.py",
          "tasks/prepare.py"}
FORBIDDEN = {"s2sjax": ("tasks", "checkpoints_conversion"), "tasks": ("checkpoints_conversion",),
             "checkpoints_conversion": ("tasks",)}


def imported_modules(path: pathlib.Path) -> set[str]:
  """Every module an `import` or `from ... import` names, at any depth (function-level imports included)."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.add(node.module)
  return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_import_one_way(package):
  offenders = []
  for path in sorted((ROOT / package).rglob("*.py")):
    relative = path.relative_to(ROOT).as_posix()
    if relative in WIRING:
      continue
    for module in imported_modules(path):
      if module.split(".")[0] in FORBIDDEN[package]:
        offenders.append(f"{relative} imports {module}")
  assert offenders == []


def test_the_check_reads_real_imports(tmp_path):
  sample = tmp_path / "sample.py"
  sample.write_text("import os\nfrom tasks.build import x\n\ndef f():\n  import checkpoints_conversion.convert\n")
  assert imported_modules(sample) == {"os", "tasks.build", "checkpoints_conversion.convert"}
