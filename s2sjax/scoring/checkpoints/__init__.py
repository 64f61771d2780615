"""Checkpoint I/O: this project's own format (`checkpoint`: orbax params leaf by leaf, restored onto any mesh, with
the checksum of every leaf, `checksums`), the checkpoints other training stacks wrote (`stacks`: MaxText, levanter),
and `--checkpoint` globs and names (`paths`)."""
