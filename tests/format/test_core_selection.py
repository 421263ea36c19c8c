"""Which implementation runs (tide.format._core): the compiled core when it is built,
the pure-Python path under TIDE_NO_EXTENSIONS=1, and a fallback with one warning when
the extension does not import. The last two run in a fresh interpreter each: the choice
is made once, at import."""

from __future__ import annotations

import os
import subprocess
import sys

from tide.format import _core

# A fresh interpreter in which importing tide.format._ccore fails, as on an install
# built without a C compiler; then everything that uses the core is imported.
_BROKEN_IMPORT = """
import sys, warnings
warnings.simplefilter("always")
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "tide.format._ccore":
            raise ImportError("built without a C compiler (simulated)")
        return None
sys.meta_path.insert(0, Refuse())
import tide.format._core as core
import tide.tail, services.dispatch.engine.dispatch_store
print("compiled" if core.using_extensions() else "python")
"""


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != _core.NO_EXTENSIONS_ENV}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**environment, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )


def test_the_compiled_core_runs_unless_turned_off() -> None:
    """The package build must have built it (make up / make test): a silent fallback
    would leave the compiled path untested."""
    off = os.environ.get(_core.NO_EXTENSIONS_ENV, "") not in ("", "0")
    assert _core.using_extensions() is not off
    assert (_core.scan_v4_run is None) is off


def test_no_extensions_forces_the_python_path_without_a_warning() -> None:
    done = run_python(
        "import warnings; warnings.simplefilter('error'); import tide.format._core as c; "
        "import tide.tail; print(c.using_extensions(), c.scan_v4_run)",
        TIDE_NO_EXTENSIONS="1",
    )
    assert done.stdout.split() == ["False", "None"]
    assert "compiled core" not in done.stderr


def test_a_failed_import_falls_back_with_one_warning() -> None:
    done = run_python(_BROKEN_IMPORT)
    assert done.stdout.strip() == "python"
    warned = [line for line in done.stderr.splitlines() if "compiled core did not import" in line]
    assert len(warned) == 1, done.stderr
    assert "built without a C compiler (simulated)" in warned[0]
    assert "TIDE_NO_EXTENSIONS=1" in warned[0]
