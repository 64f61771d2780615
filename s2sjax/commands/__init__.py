"""The entry points: command lines that wire the packages together (build the bundled sample through `tasks`,
convert the default model through `checkpoints_conversion`). Nothing in the core imports them; the commands keep
their names through one-import aliases (`s2sjax/eval.py`, `tasks/prepare.py`, ...)."""
