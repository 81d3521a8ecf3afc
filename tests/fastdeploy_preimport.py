"""A pytest plugin (``-p fastdeploy_preimport``) for running FastDeploy's own test files.

Several of them replace ``sys.modules["torch"]`` with a MagicMock before importing FastDeploy;
FastDeploy imports paddleformers, which imports transformers, and transformers >= 4.5x probes
``torch.__spec__`` at import and fails on the mock. Importing FastDeploy first, with the real
torch, lets those files run unchanged.
"""
import fastdeploy  # noqa: F401
