"""The names of a converted checkpoint's files: written and read by the scoring stage
(s2sjax/scoring/checkpoints/checkpoint.py), and read by a build that finds its tokenizer inside a checkpoint
(`<checkpoint>/tokenizer`), whose model's trained positions its config holds (tasks/build.py)."""

MANIFEST = "manifest.json"
CONFIG = "model_config.json"
