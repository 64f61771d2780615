"""The model: the networks in Flax / JAX (`decoder`, the shared decoder; `moshi`; `kimi_audio`), their config
(`config.ModelConfig`), rotary embeddings (`layers`), masked attention and its kernels (`attention`), and the decoder
families with the spellings their checkpoints come in (`families`). It imports the plumbing, the numerics and the
data stage, never scoring: the scoring stage drives it (docs/architecture.md, "Stages")."""
