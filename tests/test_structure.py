"""The packages depend one way: `s2sjax` (model, packing, scoring, metrics, result files) imports nothing from
`tasks` or `checkpoints_conversion`; those two import `s2sjax` and not each other. Only the command-line wiring
named below reaches across (docs/architecture.md, "Packages")."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Modules whose job is to wire the packages into a command line or an example: the eval CLI (builds the bundled
# sample, converts the default model), the embedded default model (converted on first use), the benchmark (loads
# the PyTorch reference the converter verifies against) and the examples.
WIRING = {"s2sjax/eval.py", "s2sjax/default_model.py", "s2sjax/bench.py", "s2sjax/examples/two_stage_training.py"}
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


def _module_graph() -> dict[str, set[str]]:
  """Every project module (package `__init__`s as their package) -> the project modules it imports, at any depth
  (function-level imports included: one that dodges a cycle at import time is still a cycle)."""
  paths = {}
  for package in ("s2sjax", "tasks", "checkpoints_conversion", "launch"):
    for path in (ROOT / package).rglob("*.py"):
      parts = path.relative_to(ROOT).with_suffix("").parts
      paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

  def project_module(name: str) -> str | None:
    while name and name not in paths:
      name = name.rpartition(".")[0]
    return name or None

  graph = {}
  for module, path in paths.items():
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Import):
        names.update(alias.name for alias in node.names)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the module's package up
          base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
        # `from pkg import module` imports the module; `from module import name` the module
        names.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base for alias in node.names)
    graph[module] = {found for name in names if (found := project_module(name)) and found != module}
  return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
  index, low, stack, on_stack, cycles = {}, {}, [], set(), []

  def visit(module: str) -> None:
    index[module] = low[module] = len(index)
    stack.append(module)
    on_stack.add(module)
    for other in sorted(graph[module]):
      if other not in index:
        visit(other)
        low[module] = min(low[module], low[other])
      elif other in on_stack:
        low[module] = min(low[module], index[other])
    if low[module] == index[module]:
      component = []
      while not component or component[-1] != module:
        component.append(stack.pop())
        on_stack.discard(component[-1])
      if len(component) > 1:
        cycles.append(sorted(component))

  for module in sorted(graph):
    if module not in index:
      visit(module)
  return cycles


def test_no_module_imports_itself_through_others():
  assert import_cycles(_module_graph()) == []


def test_the_cycle_check_finds_a_cycle_through_three_modules():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  assert import_cycles(graph) == [["a", "b", "c"]]
  assert import_cycles({"a": {"b"}, "b": set()}) == []
