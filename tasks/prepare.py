"""`python -m tasks.prepare`, kept at its name; the command is `s2sjax/commands/prepare.py` (entry points sit apart
from the packages they wire: docs/architecture.md, "Packages"), the building `tasks/preparation.py`."""

from s2sjax.commands.prepare import command_line

if __name__ == "__main__":
  command_line()
