"""The interpreter launcher of decision 82 (sparkcoord.spark.python_start): which PYTHONPATH
entries it leaves out, on a made-up installation and on the real one, what it hands the
interpreter, and when the driver uses it (no Spark: a stand-in for the session)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import sysconfig
import zipfile
from typing import Any

import pytest

from sparkcoord.spark.python_start import (
    LAUNCHER,
    LAUNCHER_SETTING,
    launched_python,
    launcher_for,
    redundant_entries,
)


def _installation(root: pathlib.Path, py4j_version: str = "0.10.9.9") -> dict[str, str]:
    """A site-packages with pyspark (its zip, py4j's zip and a jar inside, as pip installs
    it) and py4j."""
    site = root / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    (site / "pyspark" / "jars").mkdir()
    (site / "py4j").mkdir()
    (site / "py4j" / "__init__.py").write_text("")
    (site / "py4j" / "version.py").write_text(f"__version__ = '{py4j_version}'\n")
    paths = {"site": str(site), "zip": str(lib / "pyspark.zip"),
             "py4j_zip": str(lib / "py4j-0.10.9.9-src.zip"),
             "jar": str(site / "pyspark" / "jars" / "spark-core_2.13-4.3.0.jar")}
    for name in ("zip", "py4j_zip", "jar"):
        with zipfile.ZipFile(paths[name], "w") as z:
            z.writestr("x.txt", "")
    return paths


def test_the_installed_pysparks_own_zips_and_jars_are_left_out_and_nothing_else(
        tmp_path: pathlib.Path) -> None:
    p = _installation(tmp_path)
    other = str(tmp_path / "user-code.zip")
    entries = [p["zip"], p["py4j_zip"], p["jar"], other]
    assert redundant_entries(entries, [*entries, p["site"]]) == {p["zip"], p["py4j_zip"], p["jar"]}


def test_py4js_zip_stays_when_the_installed_py4j_is_another_version(tmp_path) -> None:
    p = _installation(tmp_path, py4j_version="0.10.9.7")
    entries = [p["zip"], p["py4j_zip"]]
    assert redundant_entries(entries, [*entries, p["site"]]) == {p["zip"]}


def test_a_zip_of_another_spark_home_stays(tmp_path: pathlib.Path) -> None:
    # a Spark distribution's SPARK_HOME beside a pip-installed pyspark: its zip may be another
    # release, so it keeps its place in front
    p = _installation(tmp_path / "pip")
    home = tmp_path / "spark-4.3.0" / "python" / "lib"
    home.mkdir(parents=True)
    entries = [str(home / "pyspark.zip"), str(home / "py4j-0.10.9.9-src.zip")]
    assert redundant_entries(entries, [*entries, p["site"]]) == set()


def test_nothing_is_left_out_when_no_pyspark_package_is_on_the_rest_of_the_path(
        tmp_path: pathlib.Path) -> None:
    p = _installation(tmp_path)
    entries = [p["zip"], p["py4j_zip"], p["jar"]]
    assert redundant_entries(entries, entries) == set()  # the zip is the only pyspark


def _installed_pyspark() -> pathlib.Path:
    import pyspark

    home = pathlib.Path(pyspark.__file__).parent
    assert (home / "python" / "lib" / "pyspark.zip").exists(), "not a pip-installed pyspark"
    return home


def test_the_installed_sparks_jars_hold_no_python_module() -> None:
    # rule 1 leaves <pyspark>/jars/*.jar out of the path on this ground
    jars = sorted((_installed_pyspark() / "jars").glob("*.jar"))
    assert jars
    for jar in jars:
        with zipfile.ZipFile(jar) as z:
            python = [n for n in z.namelist() if n.endswith((".py", ".pyc"))]
        assert python == [], f"{jar.name} holds Python modules: {python[:5]}"


def _launcher() -> str:
    path = os.path.join(sysconfig.get_path("scripts"), LAUNCHER)
    assert os.access(path, os.X_OK), f"{path}: reinstall the project (pip install -e .)"
    return path


def test_the_launcher_runs_the_interpreter_with_pyspark_from_the_installed_package(
        tmp_path: pathlib.Path) -> None:
    home = _installed_pyspark()
    lib = home / "python" / "lib"
    (py4j_zip,) = lib.glob("py4j-*-src.zip")
    spark_path = [str(lib / "pyspark.zip"), str(py4j_zip), str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(spark_path))
    code = ("import os, sys, pyspark; print(pyspark.__file__); print(os.getpid()); "
            "print(os.environ.get('PYTHONPATH')); print(sys.argv[1:])")
    # Spark reads the daemon's port from its standard output: only the interpreter writes
    process = subprocess.Popen([_launcher(), "-c", code, "a", "b"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0 and err == ""
    imported, pid, pythonpath, argv = out.splitlines()
    assert imported == str(home / "__init__.py")  # compiled, not from the zip
    assert int(pid) == process.pid  # replaced itself: Spark's signals reach the interpreter
    assert pythonpath == str(tmp_path)  # the user's entries stay
    assert argv == "['a', 'b']"
    # without the launcher the same interpreter imports the zip's copy (what this saves)
    plain = subprocess.run([sys.executable, "-c", "import pyspark; print(pyspark.__file__)"],
                           env=env, capture_output=True, text=True, check=True)
    assert "pyspark.zip" in plain.stdout


class FakeContext:
    def __init__(self, master: str, python: str) -> None:
        self.master, self.pythonExec = master, python


class FakeSpark:
    def __init__(self, master: str = "local[2,4]", python: str = sys.executable,
                 **conf: str) -> None:
        self.sparkContext = FakeContext(master, python)
        self.conf = type("Conf", (), {"get": lambda _s, k, d=None: conf.get(k, d)})()


def test_a_local_session_gets_the_launcher_beside_its_python_and_only_while_registering() -> None:
    spark = FakeSpark()
    launcher = _launcher()
    assert launcher_for(spark) == launcher
    with launched_python(spark) as chosen:
        assert chosen == launcher and spark.sparkContext.pythonExec == launcher
    assert spark.sparkContext.pythonExec == sys.executable


@pytest.mark.parametrize("spark", [
    FakeSpark(master="spark://host:7077"),  # a cluster: the executors' paths are not ours
    FakeSpark(python="/nowhere/bin/python3"),  # no launcher beside that interpreter
    FakeSpark(**{LAUNCHER_SETTING: "off"}),
], ids=["cluster", "no-launcher-there", "switched-off"])
def test_a_cluster_a_missing_launcher_or_the_setting_off_leave_sparks_python_as_it_is(
        spark: Any) -> None:
    assert launcher_for(spark) is None
    with launched_python(spark) as chosen:
        assert chosen is None and spark.sparkContext.pythonExec != _launcher()


def test_an_unknown_launcher_setting_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=f"{LAUNCHER_SETTING} is 'fast'.*'auto'.*'off'"):
        launcher_for(FakeSpark(**{LAUNCHER_SETTING: "fast"}))
