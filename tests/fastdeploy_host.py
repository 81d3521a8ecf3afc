"""Real FastDeploy on CPU: the snapshot's own code, with only its compiled ops stood in.

The snapshot (`FD_GUIDED_FASTDEPLOY_SRC`, else ``../shared/hosts/fastdeploy-src-*.tar.gz`` beside
the repository) is extracted to a temporary directory put first on ``sys.path``. Everything below
runs FastDeploy's code: ``EngineArgs.create_engine_config``, the engine's checker,
``worker_process.parse_args``/``initialize_fd_config`` (where ``FD_PLUGINS`` plugins load),
``GPUModelRunner.__init__``/``insert_tasks_v1``/``_get_p_done_idxs_gd``, ``Sampler.forward_cuda``
and ``post_process_normal``. Stood in, because it cannot exist on a CPU (docs/integration.md):

- ``fastdeploy.model_executor.ops.gpu``: the compiled module is absent; a module-level
  ``__getattr__`` answers every name with a callable that raises if FastDeploy calls it, except
  the few step ops below, re-written in numpy from FastDeploy's unit tests of them.
- ``Sampler.forward_cuda``'s three sampling ops (penalties, min-p, top-k/top-p): the penalties and
  min-p are identities (no request here sets them), top-p samples each row from its probabilities.
- the runner's attention backend (CUDA pinned buffers) is not built and its KV cache not
  allocated; the reference LM (fd_guided/workers/model.py) computes the logits instead.
- FastDeploy's platform reports CUDA while the runner is built (``Sampler.__init__`` refuses CPU).
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import importlib.util
import os
import shutil
import sys
import tarfile
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SNAPSHOT_ENV = "FD_GUIDED_FASTDEPLOY_SRC"
# FastDeploy's pure-Python needs found to suffice on CPU (besides paddle, torch and xgrammar).
REQUIRED_MODULES = ("paddleformers", "zmq", "fastapi", "msgspec", "crcmod", "redis", "opentelemetry", "partial_json_parser")


def find_snapshot() -> str | None:
    configured = os.environ.get(SNAPSHOT_ENV)
    if configured:
        return configured if os.path.exists(configured) else None
    found = sorted(glob.glob(os.path.join(REPO, "..", "shared", "hosts", "fastdeploy-src-*.tar.gz")))
    return found[-1] if found else None


def unavailable_reason() -> str | None:
    """Why real FastDeploy cannot run here, or None."""
    if find_snapshot() is None:
        return f"no FastDeploy snapshot: set {SNAPSHOT_ENV} or put fastdeploy-src-*.tar.gz in ../shared/hosts/"
    missing = [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        return f"FastDeploy's dependencies are not installed ({', '.join(missing)}): run .ci/run's FastDeploy stage"
    return None


@functools.lru_cache(maxsize=1)
def fastdeploy_source() -> str:
    """The snapshot extracted once per process (a directory or an extracted tarball), on sys.path."""
    snapshot = find_snapshot()
    if os.path.isdir(snapshot):
        root = snapshot
    else:
        root = tempfile.mkdtemp(prefix="fastdeploy-src-")
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        with tarfile.open(snapshot) as archive:
            archive.extractall(root, filter="data")
    if root not in sys.path:
        sys.path.insert(0, root)
    # FastDeploy writes its logs under ./log by default: keep them out of the work tree.
    os.environ.setdefault("FD_LOG_DIR", os.path.join(tempfile.gettempdir(), "fd_guided_fastdeploy_logs"))
    os.environ["PYTHONPATH"] = os.pathsep.join([root, REPO, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return root


# ----- the compiled ops, stood in ----------------------------------------------------------------

class MissingOp:
    """A compiled op FastDeploy imports but must not call on this path."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"compiled FastDeploy op {self.name!r} was called; it has no CPU stand-in")


def _assign(tensor, array) -> None:
    import paddle

    paddle.assign(paddle.to_tensor(np.asarray(array).astype(tensor.numpy().dtype)), tensor)


def set_stop_value_multi_ends(sampled, stop_flags, seq_lens_this_time, end_ids, next_tokens, *rest):
    """Stopped rows sample -1 (empty) or EOS (just stopped); a sampled EOS stops its row."""
    tokens, stops, lens, ends = sampled.numpy().copy(), stop_flags.numpy().copy(), seq_lens_this_time.numpy(), end_ids.numpy().reshape(-1)
    nxt = next_tokens.numpy().copy()
    for row in range(tokens.shape[0]):
        if stops[row]:
            tokens[row] = -1 if lens[row] == 0 else ends[0]
        stops[row] = stops[row] or tokens[row, 0] in ends
        nxt[row] = tokens[row]
    _assign(sampled, tokens), _assign(stop_flags, stops), _assign(next_tokens, nxt)


def limit_thinking_content_length_v1(sampled, max_think_lens, step_idx, status, stop_flags, eos_ids, think_end_id):
    """"</think>" strategy: at max_think_len (or on EOS while thinking) force </think>; status 2 = done."""
    tokens, limits, steps, state = sampled.numpy().copy(), max_think_lens.numpy(), step_idx.numpy(), status.numpy().copy()
    eos = eos_ids.numpy().reshape(-1)
    for row in range(tokens.shape[0]):
        if limits[row] < 0 or state[row] == 2 or stop_flags.numpy()[row]:
            continue
        if tokens[row, 0] == think_end_id:
            state[row] = 2
        elif steps[row] >= limits[row] or tokens[row, 0] in eos:
            tokens[row], state[row] = think_end_id, 2
    _assign(sampled, tokens), _assign(status, state)


def limit_thinking_content_length_v2(sampled, max_think_lens, step_idx, status, stop_flags, think_end_id, line_break_id):
    """"\\n</think>\\n\\n" strategy: from max_think_len force \\n, </think>, \\n, \\n; status 3 = done."""
    tokens, limits, steps, state = sampled.numpy().copy(), max_think_lens.numpy(), step_idx.numpy(), status.numpy().copy()
    for row in range(tokens.shape[0]):
        if limits[row] < 0 or state[row] == 3 or stop_flags.numpy()[row]:
            continue
        if tokens[row, 0] == think_end_id and state[row] == 0:
            state[row] = 3
            continue
        offset = int(steps[row]) - int(limits[row])
        if 0 <= offset <= 3:
            tokens[row] = [line_break_id, think_end_id, line_break_id, line_break_id][offset]
            state[row] = 3 if offset == 3 else 1
    _assign(sampled, tokens), _assign(status, state)


def update_inputs_v1(stop_flags, not_need_stop, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, *rest):
    """Live rows decode one token next step; stopped rows none (the model inputs themselves are ours)."""
    stops = stop_flags.numpy().reshape(-1)[: seq_lens_this_time.shape[0]]
    _assign(seq_lens_this_time, np.where(stops, 0, 1).reshape(seq_lens_this_time.shape))
    _assign(seq_lens_encoder, np.zeros(seq_lens_encoder.shape))
    _assign(not_need_stop, np.array([not stops.all()]))


class SavedOutputs(list):
    """``save_output``: what the worker sends the engine, one token per row and step."""

    def __call__(self, sampled, not_need_stop, rank, save_each_rank=False):
        self.append(sampled.numpy().reshape(-1).tolist())


STEP_OPS = {fn.__name__: fn for fn in (set_stop_value_multi_ends, limit_thinking_content_length_v1,
                                       limit_thinking_content_length_v2, update_inputs_v1)}


def install_op_stand_ins() -> SavedOutputs:
    """Answer ``fastdeploy.model_executor.ops.gpu`` names; returns the ``save_output`` recorder."""
    fastdeploy_source()
    import fastdeploy.model_executor.ops.gpu as gpu_ops

    saved = getattr(gpu_ops, "_fd_guided_saved", None)
    if saved is None:
        saved = SavedOutputs()
        ops = {**STEP_OPS, "save_output": saved}

        def stand_in(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return ops[name] if name in ops else MissingOp(name)

        gpu_ops.__getattr__ = stand_in
        gpu_ops._fd_guided_saved = saved
    return saved


def install_sampling_stand_ins(seed: int = 0) -> None:
    """The three sampling ops inside ``Sampler.forward_cuda`` (compiled kernels on every device)."""
    import paddle

    from fastdeploy.model_executor.layers.sample import sampler as sampler_module

    rng = np.random.default_rng(seed)

    def top_k_top_p_sampling(probs, top_p, top_k=None, top_k_list=None, topp_seed=None, **kwargs):
        host = probs.numpy().astype(np.float64)
        ids = [rng.choice(host.shape[1], p=row / row.sum()) for row in host]
        return None, paddle.to_tensor(np.asarray(ids, dtype=np.int64).reshape(-1, 1))

    sampler_module.apply_penalty_multi_scores = lambda pre_ids, prompt_ids, prompt_lens, logits, *rest: logits
    sampler_module.min_p_sampling = lambda probs, min_p, min_p_list: probs
    sampler_module.top_k_top_p_sampling = top_k_top_p_sampling


@contextlib.contextmanager
def platform_reports_cuda():
    from fastdeploy.platforms import current_platform

    current_platform.is_cuda = lambda: True
    try:
        yield
    finally:
        del current_platform.is_cuda
