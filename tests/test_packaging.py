"""What the built wheel ships (PEP 561 marker)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_wheel_ships_the_py_typed_marker(tmp_path: pathlib.Path) -> None:
    # built from a copy: setuptools leaves a build/ directory next to the sources
    src = tmp_path / "src"
    shutil.copytree(ROOT / "sparkcoord", src / "sparkcoord",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("sparkcoord-*.whl")
    assert "sparkcoord/py.typed" in zipfile.ZipFile(wheel).namelist()
