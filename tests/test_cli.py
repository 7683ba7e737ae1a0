import subprocess
import sys

from sparkcoord.cli import main


def test_env_reports_pyspark_and_java(capsys) -> None:
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "pyspark    4.3" in out and "java" in out


def test_the_module_runs_as_a_command() -> None:
    out = subprocess.run([sys.executable, "-m", "sparkcoord.cli", "--version"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0.1.0"


def test_demo_refuses_a_non_empty_directory_it_did_not_create_and_leaves_it_alone(
        tmp_path, capsys) -> None:
    precious = tmp_path / "data"
    precious.mkdir()
    (precious / "keep.txt").write_text("someone's data")
    assert main(["demo", "--dir", str(precious)]) == 2
    err = capsys.readouterr().err
    assert f"{precious} is not empty and was not created by the demo" in err
    assert "--force" in err
    assert (precious / "keep.txt").read_text() == "someone's data"


def test_the_demo_wipes_its_own_directory_and_with_force_any_directory(tmp_path) -> None:
    from sparkcoord.demo import DEMO_MARKER, prepare_workdir

    own = tmp_path / "own"
    prepare_workdir(str(own))
    (own / "old-output").write_text("from an earlier demo")
    prepare_workdir(str(own))  # the marker says it is the demo's: wiped without asking
    assert sorted(p.name for p in own.iterdir()) == [DEMO_MARKER]
    other = tmp_path / "other"
    other.mkdir()
    (other / "x").write_text("x")
    prepare_workdir(str(other), force=True)
    assert sorted(p.name for p in other.iterdir()) == [DEMO_MARKER]
