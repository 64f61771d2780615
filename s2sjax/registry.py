"""One registry type for everything looked up by name (tasks, audio tokenizers): records register themselves
when their module is imported, a user's own through $S2SJAX_PLUGINS, and a lookup of an unknown name lists the
known ones. As lm-eval's `Registry`: a plugin extends any of them the same way."""

from __future__ import annotations

import importlib
from typing import Callable, Generic, Iterator, TypeVar

from s2sjax import plugins

T = TypeVar("T")


class Registry(Generic[T]):
  def __init__(self, kind: str, name_of: Callable[[T], str] = lambda record: record.name):
    """`kind` names what it holds in messages ("task", "audio tokenizer"); `name_of` reads a record's name."""
    self.kind, self._name_of = kind, name_of
    self._records: dict[str, T] = {}

  def register(self, record: T) -> T:
    """Adds a record; the same name again with another record is an error (a lookup must have one answer)."""
    name = self._name_of(record)
    known = self._records.get(name)
    if known is not None and known != record:
      raise ValueError(f"{self.kind} {name!r} is already registered with another record")
    self._records[name] = record
    return record

  def _loaded(self) -> dict[str, T]:
    plugins.load_plugins()  # a user's modules register themselves before the first lookup
    return self._records

  def names(self) -> list[str]:
    """Every registered name, in registration order (the package's own first)."""
    return list(self._loaded())

  def get(self, name: str) -> T:
    records = self._loaded()
    if name not in records:
      raise KeyError(f"unknown {self.kind} {name!r}; {self.kind}s: {', '.join(records)} "
                     f"(your own: see {plugins.ENV})")
    return records[name]

  def __iter__(self) -> Iterator[T]:
    return iter(list(self._loaded().values()))


def load_object(path: str):
  """'package.module:Name' -> that object, imported only when asked for (records name heavy code lazily)."""
  module, _, name = path.partition(":")
  return getattr(importlib.import_module(module), name)
