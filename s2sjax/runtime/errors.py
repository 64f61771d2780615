"""The one base class of a user's mistake: a bad path, data that does not fit, a refused checkpoint, an unknown
name. A command line (`s2sjax.runtime.cli.run`) prints such an error as its message and exits 1; any other exception is a
bug in the project and prints its traceback.

Each project error derives from `UserError` and from the builtin it stands for (`ValueError` for bad values,
`FileNotFoundError` for a missing file, `KeyError` for an unknown name), so `except ValueError` in a caller's code
keeps working."""


class UserError(Exception):
  """Input the user can fix; its message names the file, item, key or flag, and what to do."""


class MissingFileError(UserError, FileNotFoundError):
  """A file or directory the user named (or a command needs) does not exist."""


class UnknownNameError(UserError, KeyError):
  """A name looked up in a registry, a table or a mapping the user chose from is not there."""

  def __str__(self) -> str:  # KeyError's own str() quotes the message
    return str(self.args[0]) if self.args else ""
