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


def test_demo_pipeline_is_a_choice_of_demo_and_plain_demo_stays_the_numbers_demo(
        tmp_path, monkeypatch) -> None:
    """``sparkcoord demo`` runs the coordinators demo with its defaults as before; ``sparkcoord
    demo pipeline`` runs the PostgreSQL -> Delta demo with its own sizes (no Spark here)."""
    import sparkcoord.demo
    import sparkcoord.demo_pipeline

    calls: list[tuple] = []
    monkeypatch.setattr(sparkcoord.demo, "run_demo", lambda workdir, fast, slow, **kw:
                        calls.append(("numbers", workdir, fast, slow)) or True)
    monkeypatch.setattr(sparkcoord.demo_pipeline, "run_pipeline_demo",
                        lambda workdir, rows, seconds, **kw:
                        calls.append(("pipeline", workdir, rows, seconds)) or False)
    assert main(["demo", "--dir", str(tmp_path / "a")]) == 0
    assert main(["demo", "numbers", "--dir", str(tmp_path / "b"), "--fast", "7"]) == 0
    assert main(["demo", "pipeline", "--dir", str(tmp_path / "c"), "--rows", "50",
                 "--seconds", "3"]) == 1  # a FAIL verdict is exit code 1
    assert main(["demo", "pipeline", "--dir", str(tmp_path / "d")]) == 1
    assert calls == [("numbers", str(tmp_path / "a"), 200, 10),
                     ("numbers", str(tmp_path / "b"), 7, 10),
                     ("pipeline", str(tmp_path / "c"), 50, 3.0),
                     ("pipeline", str(tmp_path / "d"), 2000, 20.0)]


def test_demo_refuses_the_other_demos_options_and_bad_sizes_before_touching_its_dir(
        tmp_path, capsys) -> None:
    import pytest

    for argv, message in [
            (["demo", "pipeline", "--master", "spark://h:7077"], "--master belong(s) to the other"),
            (["demo", "--rows", "10"], "--rows belong(s) to the other demo"),
            (["demo", "pipeline", "--rows", "0"], "--rows must be >= 1"),
            (["demo", "pipeline", "--seconds", "0"], "--seconds > 0")]:
        assert main([*argv, "--dir", str(tmp_path / "never")]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "never").exists()
    with pytest.raises(SystemExit):
        main(["demo", "pipelines"])
