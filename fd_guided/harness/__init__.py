"""The harness built on the fd_guided library: not what a host imports.

`engine` (the reference engine, its Paddle models and device runners), `server` (`fd-guided
serve`), `bench` (`fd-guided bench`), `cli` (`fd-guided`), `baseline` (a FastDeploy-style manager
to compare against), `parallel` (tensor-parallel ranks in one process), `conformance` (the
JSON-Schema-Test-Suite kit) and `validate` (independent output checks). Installed with the extras
(`pip install fd-guided[demo]`, `[serve]`, `[bench]`); imports run one way, harness -> library,
as the import-linter contracts in pyproject.toml enforce.
"""
