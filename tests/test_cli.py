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
