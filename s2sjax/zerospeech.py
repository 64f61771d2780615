"""`python -m s2sjax.zerospeech`, kept at its name; the command is `s2sjax/commands/zerospeech.py` (entry points sit
apart from the core: docs/architecture.md, "Packages")."""

from s2sjax.commands.zerospeech import command_line

if __name__ == "__main__":
  command_line()
