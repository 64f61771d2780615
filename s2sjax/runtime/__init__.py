"""The run-time plumbing every stage uses: user errors, the `Registry` type and plugins, the cache
folder, command-line helpers and progress, output folders, staged writes, peer processes, meshes.
It imports no other stage (docs/architecture.md, "Stages")."""
