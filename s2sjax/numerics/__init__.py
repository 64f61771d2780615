"""The shared numerics: what the build's audio tokenizers (`tasks/audio/`) and the model (`s2sjax/model/`) both
compute, below both so that a build imports no model code."""
