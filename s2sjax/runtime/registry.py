"""One registry type for everything looked up by name (tasks, model families, spec presets, audio tokenizers):
records register themselves when their module is imported, a user's own through $S2SJAX_PLUGINS, a record that
would make a lookup ambiguous is refused, and a lookup of an unknown name lists the known ones. As lm-eval's
`Registry`: a plugin extends any of them the same way, with that registry's `register`."""

from __future__ import annotations

import importlib
from typing import Callable, Generic, Iterator, Mapping, TypeVar

from s2sjax.runtime import plugins
from s2sjax.runtime.errors import UnknownNameError, UserError

T = TypeVar("T")


class RegistryError(UserError, ValueError):
  """A record refused: its name, or something else lookups read, is another record's."""


class Registry(Generic[T]):
  def __init__(self, kind: str, name_of: Callable[[T], str] = lambda record: record.name,
               check: Callable[[T, Mapping[str, T]], list[str]] | None = None,
               unknown: Callable[[str, list[str]], str] | None = None,
               error: type[Exception] = UnknownNameError):
    """`kind` names what it holds in messages ("task", "audio tokenizer"); `name_of` reads a record's name.
    `check(record, registered)` lists the problems a new record would make besides its name (e.g. a model_type
    two families would read). A lookup of an unknown name raises `error` (a UserError) saying `unknown(name, known
    names)` (default: "unknown <kind> <name>; <kind>s: <known>") and how a record of the user's own is added."""
    self.kind, self._name_of, self._check, self._unknown, self._error = kind, name_of, check, unknown, error
    self._records: dict[str, T] = {}

  def register(self, record: T) -> T:
    """Adds a record; one that shares its name with another record, or that `check` finds problems with, is
    refused and nothing changes (a lookup must have one answer). The same record again is a no-op."""
    name = self._name_of(record)
    known = self._records.get(name)
    if known is not None and known == record:
      return record
    article = "an" if self.kind[0] in "aeiou" else "a"
    problems = [f"{article} {self.kind} named {name!r} is registered already"] if known is not None else []
    problems += self._check(record, dict(self._records)) if self._check else []
    if problems:
      raise RegistryError(f"cannot register {self.kind} {name!r}: " + "; ".join(problems))
    self._records[name] = record
    return record

  def _loaded(self) -> dict[str, T]:
    plugins.load_plugins()  # a user's modules register themselves before the first listing
    return self._records

  def registered(self) -> list[T]:
    """The records registered so far, without importing plugins: what a registration's own checks read (a plugin
    imported halfway through the package's registrations would come before them)."""
    return list(self._records.values())

  def names(self) -> list[str]:
    """Every registered name, in registration order (the package's own first)."""
    return list(self._loaded())

  def get(self, name: str) -> T:
    # A registered name answers without importing plugins: a module a plugin imports may look one up while it
    # is itself being imported (tasks/tfds_builder.py reads the spec presets at class definition).
    if name in self._records:
      return self._records[name]
    records = self._loaded()
    if name not in records:
      said = (self._unknown(name, list(records)) if self._unknown
              else f"unknown {self.kind} {name!r}; {self.kind}s: {', '.join(records)}")
      raise self._error(f"{said} (one of your own registers when its module is imported: name that module in "
                        f"${plugins.ENV})")
    return records[name]

  def __iter__(self) -> Iterator[T]:
    return iter(list(self._loaded().values()))


def load_object(path: str):
  """'package.module:Name' -> that object, imported only when asked for (records name heavy code lazily)."""
  module, _, name = path.partition(":")
  return getattr(importlib.import_module(module), name)
