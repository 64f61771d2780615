"""One base class for a user's mistake (`s2sjax.runtime.errors.UserError`): a command line prints it as one line and exits 1;
any other exception is a bug and keeps its traceback. Every error class the project defines derives from it."""

import ast
import pathlib
import signal

import pytest
from absl import flags

from s2sjax.runtime import cli
from s2sjax.runtime.errors import MissingFileError, UnknownNameError

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILTIN_ERRORS = {"Exception", "ValueError", "KeyError", "OSError", "FileNotFoundError", "RuntimeError", "TypeError",
                  "LookupError", "IOError"}


@pytest.fixture
def command_line(monkeypatch):
  """`cli.run`'s wrapper around a main, at the default --verbosity, with the signal handlers restored after. The
  flag is set on its Flag object, which needs no parsing: the process-wide FLAGS are left as they are, parsed or
  not, whatever ran before."""
  verbosity = flags.FLAGS["verbosity"]  # defined by absl.logging, which s2sjax.runtime.cli imports
  monkeypatch.setattr(verbosity, "value", verbosity.default)
  handlers = {each: signal.getsignal(each) for each in (signal.SIGINT, signal.SIGTERM)}
  yield lambda main: cli._one_line_errors(main)(["test"])
  for each, handler in handlers.items():
    signal.signal(each, handler)


def test_a_user_error_is_one_line_and_exit_1(command_line, capsys):
  def main(argv):
    raise UnknownNameError("unknown task 'sstory'; tasks: sstorycloze, scmmlu")

  with pytest.raises(SystemExit) as exited:
    command_line(main)
  assert exited.value.code == 1
  assert capsys.readouterr().err == ("error: unknown task 'sstory'; tasks: sstorycloze, scmmlu\n"
                                     "(--verbosity=1 shows where it was raised)\n")


def test_a_bug_keeps_its_traceback(command_line):
  def main(argv):
    raise ValueError("an internal invariant broke")  # not a UserError: the project's own mistake

  with pytest.raises(ValueError, match="an internal invariant broke"):
    command_line(main)


def test_user_errors_are_still_the_builtins_they_stand_for():
  assert issubclass(MissingFileError, FileNotFoundError) and issubclass(UnknownNameError, KeyError)
  assert str(UnknownNameError("no such name")) == "no such name"  # KeyError's str() would quote it


def bare_builtin_errors(source: str) -> list[str]:
  """Classes of `source` that subclass a builtin error and not UserError."""
  return [f"{node.name}({', '.join(ast.unparse(base) for base in node.bases)})"
          for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)
          and {ast.unparse(base) for base in node.bases} & BUILTIN_ERRORS
          and "UserError" not in {ast.unparse(base) for base in node.bases}]


def test_every_project_error_derives_from_user_error():
  """A class that subclasses a builtin error directly must also name UserError (or derive from a project error
  that does): else the command lines would print it as a bug. UserError itself is the one exception."""
  offenders = []
  for package in ("s2sjax", "tasks", "checkpoints_conversion", "launch"):
    for path in sorted((ROOT / package).rglob("*.py")):
      found = bare_builtin_errors(path.read_text(encoding="utf-8"))
      offenders += [f"{path.relative_to(ROOT).as_posix()}: {name}" for name in found if name != "UserError(Exception)"]
  assert offenders == []


def test_the_check_sees_a_bare_builtin_error():
  source = "class Bad(ValueError):\n  pass\n\nclass Good(UserError, ValueError):\n  pass\n"
  assert bare_builtin_errors(source) == ["Bad(ValueError)"]
