"""The packages depend one way. The core (`s2sjax`: a folder per stage, runtime -> numerics -> data -> scoring ->
results) imports nothing from `tasks` or `checkpoints_conversion`; those two import the core and not each other, and
`tasks`, the build, is a stage between data and scoring: it imports the core's runtime, numerics and data only. A
`"module:attr"` string that names a project module (imported when asked for: `s2sjax.runtime.registry.load_object`)
is a dependency as an import is, held to the same rules. The entry points
(`s2sjax/commands/`: command lines; `s2sjax/examples/`) wire the three together and nothing imports them, but the
one-import aliases that keep a command at its name (`s2sjax/eval.py` runs `s2sjax/commands/eval.py`), whose shape is
checked: they import a command and define nothing (docs/architecture.md, "Packages")."""

import ast
import functools
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Nothing imports them (but a command a bench): they import everything.
ENTRY_POINTS = ("s2sjax.commands", "s2sjax.examples", "s2sjax.benchmarks")
PROJECT = ("s2sjax", "tasks", "checkpoints_conversion", "launch")
LAZY_NAME = re.compile(r"([A-Za-z_]\w*(?:\.\w+)*):[A-Za-z_]\w*")
FORBIDDEN = {"s2sjax": ("tasks", "checkpoints_conversion", *ENTRY_POINTS),
             "tasks": ("checkpoints_conversion", *ENTRY_POINTS),
             "checkpoints_conversion": ("tasks", *ENTRY_POINTS)}


def module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
  parts = path.relative_to(root).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def within(module: str, packages) -> bool:
  return any(module == package or module.startswith(package + ".") for package in packages)


def lazy_names(tree: ast.AST) -> set[str]:
  """The project modules that `"module:attr"` strings name (a record's encoder, reader or converter, imported when
  asked for)."""
  return {match.group(1) for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
          and (match := LAZY_NAME.fullmatch(node.value)) and within(match.group(1), PROJECT)}


def imported_modules(path: pathlib.Path) -> set[str]:
  """Every module an `import` or `from ... import` names, at any depth (function-level imports included), and every
  project module a `"module:attr"` string names."""
  tree = ast.parse(path.read_text(encoding="utf-8"))
  names = lazy_names(tree)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.add(node.module)
  return names


def is_command_alias(path: pathlib.Path) -> bool:
  """A module that only keeps a command at its name: a docstring, imports from `s2sjax.commands`, maybe `__all__`,
  and `if __name__ == "__main__":` calling what it imported; it defines nothing."""
  body = ast.parse(path.read_text(encoding="utf-8")).body
  imports = [node for node in body if isinstance(node, (ast.Import, ast.ImportFrom))]
  if not imports or not all(isinstance(node, ast.ImportFrom) and within(node.module or "", ("s2sjax.commands",))
                            for node in imports):
    return False
  for node in body:
    if node in imports or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
      continue
    if isinstance(node, ast.Assign) and [target.id for target in node.targets if isinstance(target, ast.Name)] == [
        "__all__"]:
      continue
    if (isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'" and len(node.body) == 1
        and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Call)):
      continue
    return False
  return True


def _project_files(package: str, root: pathlib.Path = ROOT):
  for path in sorted((root / package).rglob("*.py")):
    if not within(module_name(path, root), ENTRY_POINTS):
      yield path


def wrong_way_imports(package: str, root: pathlib.Path = ROOT) -> list[str]:
  """Every import (or `"module:attr"` string) of a module of a package `package` may not import."""
  return sorted(f"{path.relative_to(root).as_posix()} imports {module}" for path in _project_files(package, root)
                if not is_command_alias(path) for module in imported_modules(path)
                if within(module, FORBIDDEN[package]))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_import_one_way(package):
  assert wrong_way_imports(package) == []


def test_the_commands_keep_their_names_through_aliases_only():
  aliases = sorted(path.relative_to(ROOT).as_posix() for package in FORBIDDEN for path in _project_files(package)
                   if is_command_alias(path))
  assert aliases == ["s2sjax/bench.py", "s2sjax/check.py", "s2sjax/eval.py", "s2sjax/lm_eval.py", "s2sjax/logprobs.py",
                     "s2sjax/plan.py", "s2sjax/watch.py", "s2sjax/zerospeech.py", "tasks/prepare.py"]


def test_an_alias_that_defines_something_is_not_one(tmp_path):
  alias = '"""doc"""\nfrom s2sjax.commands.eval import command_line\n\nif __name__ == "__main__":\n  command_line()\n'
  for text, expected in ((alias, True), (alias + "def helper():\n  pass\n", False),
                         (alias.replace("s2sjax.commands.eval", "tasks.build"), False)):
    (tmp_path / "m.py").write_text(text)
    assert is_command_alias(tmp_path / "m.py") is expected


def test_the_check_reads_real_imports(tmp_path):
  sample = tmp_path / "sample.py"
  sample.write_text("import os\nfrom tasks.build import x\n\ndef f():\n  import checkpoints_conversion.convert\n")
  assert imported_modules(sample) == {"os", "tasks.build", "checkpoints_conversion.convert"}


@functools.cache  # read once a session: several tests ask for the same graph
def _module_graph(root: pathlib.Path = ROOT, packages: tuple[str, ...] = PROJECT, lazy: bool = False
                  ) -> dict[str, set[str]]:
  """Every project module under `root` (package `__init__`s as their package) -> the project modules it imports,
  at any depth (function-level imports included: one that dodges a cycle at import time is still a cycle), and
  with `lazy` the ones its `"module:attr"` strings name (for the stages; a cycle through a name looked up when
  asked for is none at import time).
  Importing `a.b.m` runs `a/__init__.py` and `a/b/__init__.py` first, so it is an edge to each of those packages
  too, but for the importer's own packages, which Python has entered before the importer runs: a package whose
  `__init__` imports a module that imports back into that package is a cycle (the module reads a half-initialised
  package)."""
  paths = {}
  for package in packages:
    for path in (root / package).rglob("*.py"):
      paths[module_name(path, root)] = path

  def project_module(name: str) -> str | None:
    while name and name not in paths:
      name = name.rpartition(".")[0]
    return name or None

  def with_packages(name: str, importer: str) -> set[str]:
    """The module and the packages Python runs first, less the importer's own."""
    parts = name.split(".")
    own = {".".join(importer.split(".")[:n]) for n in range(1, len(importer.split(".")) + 1)}
    return {name} | {package for n in range(1, len(parts)) if (package := ".".join(parts[:n])) not in own}

  graph = {}
  for module, path in paths.items():
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = lazy_names(tree) if lazy else set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        names.update(alias.name for alias in node.names)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the module's package up
          base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
        # `from pkg import module` imports the module; `from module import name` the module
        names.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base for alias in node.names)
    graph[module] = {project for name in names if (found := project_module(name))
                     for project in with_packages(found, package if path.name == "__init__.py" else module)
                     if project in paths and project != module}
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


def test_the_cycle_check_sees_a_package_init(tmp_path):
  """A package whose `__init__` imports a module of another package that imports back into the first package's
  submodule: Python runs the first package's `__init__` again half-way (the module gets a half-initialised
  package), though no module imports another that imports it back."""
  for path, text in {"arch/__init__.py": "from fam import moshi\n", "arch/base.py": "X = 1\n",
                     "fam/__init__.py": "", "fam/moshi.py": "from arch.base import X\n",
                     "fam/own.py": "from fam.moshi import X\n"}.items():
    (tmp_path / path).parent.mkdir(exist_ok=True)
    (tmp_path / path).write_text(text)
  graph = _module_graph(tmp_path, ("arch", "fam"))
  assert graph["fam.moshi"] == {"arch", "arch.base"} and graph["fam.own"] == {"fam.moshi"}  # its own package: no edge
  assert import_cycles(graph) == [["arch", "fam.moshi"]]


# The stages, in the order data flows through them (docs/architecture.md, "Stages"), each a folder of the core but
# the build, the `tasks` package: a module imports (or names in a `"module:attr"` string) its own stage and the
# stages before it, never one after. The run-time plumbing every stage uses comes first, then the numerics both the
# build's audio tokenizers and the model run; a task's arithmetic, `metrics`, is part of the benchmark's contract
# that the data stage defines; the build lays that contract's rows and knows no model. The entry points, their
# aliases and the package's own `__init__` (a lazy `s2sjax.Evaluator`) stand above every stage.
STAGES = (("runtime plumbing", "s2sjax.runtime"), ("shared numerics", "s2sjax.numerics"),
          ("data contract and formats", "s2sjax.data"), ("build", "tasks"), ("model", "s2sjax.model"),
          ("scoring", "s2sjax.scoring"), ("results and reports", "s2sjax.results"))


def stage_of(module: str) -> int | None:
  """The stage whose folder holds the module."""
  found = [n for n, (_, package) in enumerate(STAGES) if within(module, (package,))]
  return found[0] if found else None


def reverse_imports(graph: dict[str, set[str]]) -> list[str]:
  """Every import of a module of a later stage than the importer's."""
  return [f"{module} ({STAGES[stage_of(module)][0]}) imports {other} ({STAGES[stage_of(other)][0]})"
          for module, imported in sorted(graph.items()) if stage_of(module) is not None
          for other in sorted(imported) if stage_of(other) is not None and stage_of(other) > stage_of(module)]


def test_every_core_module_is_in_one_stage():
  aliases = {module_name(path) for path in _project_files("s2sjax") if is_command_alias(path)}
  unplaced = [module for module in sorted(_module_graph()) if within(module, ("s2sjax",)) and module != "s2sjax"
              and not within(module, ENTRY_POINTS) and module not in aliases and stage_of(module) is None]
  assert unplaced == [], "place each in the stage of STAGES it belongs to"


def test_a_module_sits_in_its_stage_folder():
  """The package's top level is its `__init__`, the stages' folders, the entry points' folders and the aliases:
  no core module lies outside the folder of its stage."""
  stages = {package.rpartition(".")[2] for _, package in STAGES if within(package, ("s2sjax",))}
  entry_points = {package.rpartition(".")[2] for package in ENTRY_POINTS}
  loose = sorted(path.name for path in (ROOT / "s2sjax").iterdir()
                 if path.name not in ("__init__.py", "__pycache__") and path.name not in stages | entry_points
                 and not (path.suffix == ".py" and is_command_alias(path)))
  assert loose == []


def test_no_stage_imports_a_later_one():
  assert reverse_imports(_module_graph(lazy=True)) == []


def test_the_checks_read_module_attr_strings():
  graph = _module_graph(lazy=True)
  assert {"checkpoints_conversion.moshi_release", "checkpoints_conversion.kimi_release"} <= graph[
    "checkpoints_conversion.own_converters"]
  assert "tasks.kimi_encoder" in graph["tasks.encoders"]


def test_the_checks_find_a_planted_build_to_scoring_import_and_wrong_way_strings(tmp_path):
  """A tree with one of each: a build module importing the scoring stage, a data module naming a build module in a
  string, a scoring module naming the converter package in one; strings that name no project module are no
  dependency, and a build module may name its own stage."""
  files = {"s2sjax/__init__.py": "", "s2sjax/data/__init__.py": "", "s2sjax/scoring/__init__.py": "",
           "s2sjax/data/formats.py": 'ENCODER = "tasks.encoders:TextEncoder"\nTIME = "12:30"\n',
           "s2sjax/scoring/architectures.py": 'CONVERTER = "checkpoints_conversion.convert:convert"\n',
           "tasks/__init__.py": "", "tasks/release.py": "",
           "tasks/encoders.py": 'from s2sjax.scoring import architectures\nREADER = "tasks.release:read"\n',
           "checkpoints_conversion/__init__.py": "", "checkpoints_conversion/convert.py": 'SOURCE = "json:loads"\n'}
  for path, text in files.items():
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text(text)
  assert reverse_imports(_module_graph(tmp_path, ("s2sjax", "tasks", "checkpoints_conversion"), lazy=True)) == [
    "s2sjax.data.formats (data contract and formats) imports tasks (build)",
    "s2sjax.data.formats (data contract and formats) imports tasks.encoders (build)",
    "tasks.encoders (build) imports s2sjax.scoring (scoring)",
    "tasks.encoders (build) imports s2sjax.scoring.architectures (scoring)"]
  assert wrong_way_imports("s2sjax", tmp_path) == [
    "s2sjax/data/formats.py imports tasks.encoders",
    "s2sjax/scoring/architectures.py imports checkpoints_conversion.convert"]
  assert wrong_way_imports("tasks", tmp_path) == wrong_way_imports("checkpoints_conversion", tmp_path) == []


# Model code: what a build must not import (the model, its families and attention kernels, its architectures).
MODEL_CODE = ("flax", "s2sjax.model", "s2sjax.scoring.architectures")


def imported_by_build(*args: str) -> list[str]:
  """The modules `python -X importtime -m tasks.prepare ARGS` imports (the lines it writes to stderr)."""
  run = subprocess.run([sys.executable, "-X", "importtime", "-m", "tasks.prepare", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-2000:]
  return [line.rpartition("|")[2].strip() for line in run.stderr.splitlines() if line.startswith("import time:")]


def test_the_build_command_line_imports_no_model_code():
  imported = imported_by_build("--help")
  assert "tasks.build" in imported and [m for m in imported if within(m, MODEL_CODE)] == []


@pytest.mark.slow
def test_a_text_build_imports_no_model_code(tmp_path, qwen_tokenizer_dir):
  imported = imported_by_build("--task=sstorycloze", "--spec=demo", "--modality=t2t",
                               f"--tokenizer_dir={qwen_tokenizer_dir}", f"--data_dir={tmp_path}")
  assert "tasks.encoders" in imported and [m for m in imported if within(m, MODEL_CODE)] == []


def test_the_stage_check_finds_an_import_of_a_later_stage():
  graph = {"s2sjax.data.spec": {"s2sjax.runtime.errors"}, "s2sjax.runtime.cli": {"s2sjax.data.task_registry"},
           "s2sjax.results.reports": {"s2sjax.scoring.evaluator"}}
  assert reverse_imports(graph) == ["s2sjax.runtime.cli (runtime plumbing) imports s2sjax.data.task_registry (data "
                                    "contract and formats)"]
