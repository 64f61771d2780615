"""Other training stacks' checkpoints and parameters, read as they wrote them: MaxText (`maxtext`, with its run
config in `maxtext_config`) and levanter (`levanter`; its trainer's hook is `s2sjax/results/levanter_hook.py`).
`s2sjax.scoring.checkpoints.checkpoint.open` returns `maxtext.StepFolder` for a MaxText folder, so every command that reads a
checkpoint reads one; levanter's are read in Python (`levanter.load`), with the model's config.json."""
