"""The model: the networks in Flax / JAX (`decoder`, the shared decoder; `moshi`; `kimi_audio`; `mimo_audio`;
`step_audio2`), their config (`config.ModelConfig`), masked attention and its kernels (`attention`), and the decoder
families with the spellings their checkpoints come in (`families`); rotary embeddings are a numeric
(`s2sjax/numerics/rotary.py`). It imports the plumbing, the numerics and the data stage, never scoring: the scoring
stage drives it (docs/architecture.md, "Stages")."""
