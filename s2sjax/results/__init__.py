"""Results and reports: resumable chunks of per-row results, the result files and tables, the flips
between modalities, levanter's trainer hook. It may import every stage before it
(docs/architecture.md, "Stages")."""
