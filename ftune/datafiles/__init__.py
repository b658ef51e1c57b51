"""Data files, read lightly: the room both sides share, below the compiler and the worker.

`sources` (resolve a `data.*` entry, peek its first rows, load it), `formats` (rows -> tokens per format),
`masking` (labels), `errors` (`DataError`, located at a file's row) and `check` (the pre-launch checks on the
files: fields, formats, roles; `ftune.plan.compile` runs them for `plan`, `run` and `validate --check-paths`).
Nothing here imports `datasets` or a tokenizer at module level.
"""
