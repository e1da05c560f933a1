"""The package installs as a regular wheel: its configs ship inside it, and `mhalab train` composes them from any
directory (no checkout, no editable install)."""

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_carries_every_config_and_trains_from_elsewhere(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "dist"), str(REPO)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("mhalab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.relative_to(REPO / "src").as_posix() for p in (REPO / "src" / "mhalab" / "conf").rglob("*.yaml")}
    assert shipped and shipped <= names, sorted(shipped - names)
    assert "mhalab/conf/train.yaml" in names and not any(n.startswith("build/") for n in names)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run([sys.executable, "-c", "import sys, mhalab; print(mhalab.__file__); "
                        "from mhalab.cli import main; sys.argv = ['mhalab', 'train', '--cfg', 'job']; main()"],
                       cwd=elsewhere, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[0].startswith(str(target)) and "task: bbc_news" in r.stdout
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                            text=True).stdout
    assert "build/" not in status and ".egg-info" not in status  # what the build leaves is ignored
