"""The layers of docs/architecture.md, enforced: import-linter's contracts in pyproject.toml hold for the code, break
on an import that runs up a layer (inside a function too), and docs/architecture.md lists the same layers in order."""

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(src: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the mhalab found under `src`, with the repository's contracts (no cache written)."""
    return subprocess.run([str(LINT), "--config", str(REPO / "pyproject.toml"), "--no-cache"], cwd=src,
                          env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=300)


def test_the_code_keeps_every_contract():
    r = lint(REPO / "src")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout and "BROKEN" not in r.stdout


def test_an_import_up_a_layer_inside_a_function_breaks_the_layers(tmp_path):
    """A copy of the code where a shared leaf imports a command, in a function body: the contract names it."""
    shutil.copytree(REPO / "src" / "mhalab", tmp_path / "mhalab", ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "mhalab" / "stats.py").open("a") as f:
        f.write("\n\ndef _up():\n    from mhalab.report import arms\n")
    r = lint(tmp_path)
    assert r.returncode != 0
    assert "mhalab.stats is not allowed to import mhalab.report" in r.stdout, r.stdout[-4000:]


def test_docs_architecture_lists_the_contract_layers_in_order():
    """docs/architecture.md's table of layers names the modules of each layer of the contract, top to bottom."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    in_contract = [name for layer in layers for name in re.split(r"\s*[|:]\s*", layer.strip())]
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text[text.index("## The layers"):text.index("## Layout")]
    rows = [re.split(r"(?<!\\)\|", line) for line in table.splitlines() if line.startswith("| ") and "`" in line]
    in_docs = [name for row in rows for name in re.findall(r"`(\w+)`", row[2])]
    assert in_docs == in_contract
