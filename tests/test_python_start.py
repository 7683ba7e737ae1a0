"""The interpreter launcher of decision 82 (sparkcoord.spark.python_start): which PYTHONPATH
entries it leaves out, on a made-up installation and on the real one, what it hands the
interpreter, and when the driver uses it (no Spark: a stand-in for the session)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import sysconfig
import threading
import zipfile
from typing import Any

import pytest

import sparkcoord.spark.python_start as python_start
from sparkcoord.spark.python_start import (
    LAUNCHER,
    LAUNCHER_SETTING,
    launch_environment,
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


def test_nothing_is_left_out_when_another_sparks_zip_further_on_would_be_imported_instead(
        tmp_path: pathlib.Path) -> None:
    # review finding: the installed copies left out, a user's older Spark zip later on the
    # path would have been the pyspark imported
    p = _installation(tmp_path / "pip")
    other = tmp_path / "opt" / "spark" / "python" / "lib"
    other.mkdir(parents=True)
    with zipfile.ZipFile(other / "pyspark.zip", "w") as z:
        z.writestr("pyspark/__init__.py", "")
    entries = [p["zip"], p["py4j_zip"], p["jar"], str(other / "pyspark.zip")]
    assert redundant_entries(entries, [*entries, p["site"]]) == set()


def test_py4js_zip_stays_when_another_py4j_zip_further_on_would_be_imported_instead(
        tmp_path: pathlib.Path) -> None:
    p = _installation(tmp_path)
    user = tmp_path / "user" / "py4j-0.10.9.7-src.zip"
    user.parent.mkdir()
    with zipfile.ZipFile(user, "w") as z:
        z.writestr("py4j/__init__.py", "")
        z.writestr("py4j/version.py", "__version__ = '0.10.9.7'\n")
    entries = [p["zip"], p["py4j_zip"], str(user)]
    assert redundant_entries(entries, [*entries, p["site"]]) == {p["zip"]}


def test_a_users_jar_beside_sparks_own_stays(tmp_path: pathlib.Path) -> None:
    # only spark-core's jar is Spark's own entry; a connector jar may carry Python code
    p = _installation(tmp_path)
    user_jar = str(pathlib.Path(p["jar"]).with_name("graphframes-0.8.jar"))
    entries = [p["zip"], p["jar"], user_jar]
    assert redundant_entries(entries, [*entries, p["site"]]) == {p["zip"], p["jar"]}


def test_the_launch_environment_keeps_every_other_entry_empty_ones_too(
        tmp_path: pathlib.Path) -> None:
    p = _installation(tmp_path)
    search = [p["zip"], p["jar"], "/x", p["site"]]
    env = launch_environment({"PYTHONPATH": os.pathsep.join([p["zip"], "", "/x", p["jar"]]),
                              "OTHER": "1"}, search)
    assert env == {"PYTHONPATH": os.pathsep.join(["", "/x"]), "OTHER": "1"}
    env = launch_environment({"PYTHONPATH": p["zip"]}, [p["zip"], p["site"]])
    assert env == {}  # nothing left: no PYTHONPATH at all


def test_the_launch_environment_is_spark_s_own_when_working_it_out_fails_and_says_why(
        tmp_path: pathlib.Path, monkeypatch: Any, capsys: Any) -> None:
    p = _installation(tmp_path)

    def broken(entries: Any, search_path: Any) -> set[str]:
        raise UnicodeDecodeError("utf-8", b"", 0, 1, "a damaged version.py")

    monkeypatch.setattr(python_start, "redundant_entries", broken)
    environ = {"PYTHONPATH": p["zip"]}
    assert launch_environment(environ, [p["zip"], p["site"]]) == environ
    out, err = capsys.readouterr()
    assert out == ""  # Spark's daemon reads its port from standard output
    assert err.count("\n") == 1 and "PYTHONPATH left as Spark set it" in err
    assert "UnicodeDecodeError" in err and "a damaged version.py" in err


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


def test_the_installed_spark_core_jar_holds_no_python_module() -> None:
    # rule 1 leaves <pyspark>/jars/spark-core_*.jar out of the path on this ground
    jars = sorted((_installed_pyspark() / "jars").glob("spark-core_*.jar"))
    assert len(jars) == 1
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


def test_a_launcher_whose_interpreter_is_another_python_is_not_used(tmp_path) -> None:
    # a shim directory or a wrapper: the script beside the executable runs something else
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.symlink_to(sys.executable)
    launcher = bin_dir / LAUNCHER
    launcher.write_text("#!/usr/bin/env bash\nexec pyenv exec sparkcoord-python \"$@\"\n")
    launcher.chmod(0o755)
    assert launcher_for(FakeSpark(python=str(python))) is None
    launcher.write_text(f"#!{tmp_path}/other/python3\n")
    assert launcher_for(FakeSpark(python=str(python))) is None
    launcher.write_text(f"#!{python}\nimport sys\n")
    assert launcher_for(FakeSpark(python=str(python))) == str(launcher)
    # pip's form for an interpreter path too long for a #! line
    launcher.write_text(f"#!/bin/sh\n\'\'\'exec\' \"{python}\" \"$0\" \"$@\"\n\' \'\'\'\n")
    assert launcher_for(FakeSpark(python=str(python))) == str(launcher)


def test_two_threads_making_jobs_at_once_leave_sparks_python_as_it_was(monkeypatch) -> None:
    # review finding: A enters, B enters, A leaves, B leaves restored the launcher for good.
    # B stays inside until A left; with the lock B enters only then (A waits for it in vain).
    # Both chose the launcher before either swapped (B would find none once A swapped)
    spark = FakeSpark()
    monkeypatch.setattr(python_start, "launcher_for", lambda _spark: "/env/bin/" + LAUNCHER)
    b_inside, a_left = threading.Event(), threading.Event()

    def second() -> None:
        with launched_python(spark):
            b_inside.set()
            assert a_left.wait(10)

    thread = threading.Thread(target=second)
    with launched_python(spark):
        thread.start()
        b_inside.wait(0.5)  # without the lock B is inside by now
    a_left.set()
    thread.join(10)
    assert b_inside.is_set() and not thread.is_alive()
    assert spark.sparkContext.pythonExec == sys.executable
