"""One `mhalab` command: every subcommand answers --help without importing torch or Lightning (so at once), the
`python -m mhalab.<tool>` entry points still work, and argument errors are one sentence with exit status 2."""

import subprocess
import sys

import pytest

from mhalab.cli import COMMANDS

pytestmark = pytest.mark.proc  # every test here starts real processes

HEAVY = ("torch", "lightning", "datasets", "matplotlib")


def run(*args, module="mhalab"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_parses_before_any_heavy_import(command):
    code = (f"import sys\nfrom mhalab.cli import main\nsys.argv = ['mhalab', {command!r}, '--help']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout  # nothing heavy imported to answer --help
    assert "usage" in r.stdout.lower() or "== Config ==" in r.stdout or "train is powered by Hydra" in r.stdout


def test_usage_lists_every_command_and_unknown_commands_are_refused():
    r = run("--help")
    assert r.returncode == 0 and all(c in r.stdout for c in COMMANDS)
    r = run("trian")
    assert r.returncode == 2 and "unknown command 'trian'" in r.stderr
    assert run("--version").stdout.strip()


def test_module_entry_points_still_work():
    assert "usage: mhalab report" in run("--help", module="mhalab.report").stdout
    assert run("--cfg", "job", module="mhalab.training.train").stdout.count("attention:") == 1


def test_argument_errors_are_one_sentence(tmp_path):
    r = run("ablate", str(tmp_path / "x.ckpt"), "--eval-split", "train")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = run("bench", "complexity", "grid.n=[0]")
    assert r.returncode == 2 and "grid.n" in r.stderr and "Traceback" not in r.stderr
