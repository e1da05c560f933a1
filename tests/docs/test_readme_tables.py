"""The design and result tables in experiments/README.md and experiments/*/README.md are the generated ones (never
typed)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.proc  # every test here starts real processes

REPO = Path(__file__).resolve().parents[2]


def test_generated_blocks_match_the_recorded_reports(tmp_path):
    """Checked from a folder outside the repository: the script's paths and links do not lean on the working one."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "embed_reports.py"), "--check"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
