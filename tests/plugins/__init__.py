"""Plugin modules only the tests define, imported through S2SJAX_PLUGINS: a toy task, a toy model family, one record
for each registry, a second stream architecture, a model of two id streams and a float feature track (its input
format, encoder, architecture and spec), and a release laid out as ZeroSpeech's gold file (its release format and
task)."""
