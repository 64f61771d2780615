"""How a model takes audio, one registered `InputFormat` per spec `audio_mode` (see `format.py`): its typed row
fields, its packer, its spec checks and its pre-flight rule (the encoder that lays its rows is the build's:
tasks/encoders.py, `ENCODERS`).

  none, extended_vocab, codebook_tables   the shared decoder's token rows (`tokens.py`)
  parallel_streams                        a text stream and codebook streams side by side (`streams.py`), laid by
                                          the protocol its spec's architecture names (`moshi_protocol.py`)
  kimi_audio                              two id streams and a float Whisper feature track (`kimi_audio.py`)
  mimo_audio                              a text id and a patch of RVQ frames per position (`mimo_audio.py`)
  step_audio2                             one id stream, the audio adaptor's rows a feature track (`step_audio2.py`)

Adding one is a module of your own that builds an `InputFormat` (a `rows.RowFormat` of its fields) and `register`s it,
registers with tasks.encoders the encoder class that lays a question and packs items with `packing.pack_laid`, then a
spec naming it as its `audio_mode` and an architecture that scores its rows (s2sjax/scoring/architectures); name the
module in $S2SJAX_PLUGINS so every command line imports it before its first lookup (tests/plugins/toy_features.py: two
id streams and a float feature track).
"""

from s2sjax.data.formats.format import INPUT_FORMATS, InputFormat, get, owner_of_key, register

# The built-ins register on import.
from s2sjax.data.formats import tokens, streams, kimi_audio, moshi_protocol  # noqa: E402,F401,I001
from s2sjax.data.formats import mimo_audio  # noqa: E402,F401
from s2sjax.data.formats import step_audio2  # noqa: E402,F401

__all__ = ["INPUT_FORMATS", "InputFormat", "get", "owner_of_key", "register"]
