"""The performance benches, together: each measures one cost on this machine and prints (or writes) its figures,
recorded with the commands that made them in docs/benchmarks/. Like the commands, they import everything and nothing
imports them but a command line (`s2sjax/commands/bench.py` drives the accelerator one)."""
