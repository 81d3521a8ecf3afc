"""The scripts under tools/ imported as modules, for the tests that check them."""

import importlib.util
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def import_tool(name: str):
    """tools/NAME.py as the module ``fd_guided_NAME_tool``, registered in sys.modules (a
    dataclass looks its module up there)."""
    spec = importlib.util.spec_from_file_location(f"fd_guided_{name}_tool", TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
