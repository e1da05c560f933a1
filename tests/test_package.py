"""The package installs as a regular wheel: its configs ship inside it, and `mhalab train` composes them from any
directory (no checkout, no editable install)."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.proc
def test_the_wheel_carries_every_config_and_trains_from_elsewhere(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "dist"), str(REPO)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("mhalab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.relative_to(REPO / "src").as_posix() for p in (REPO / "src" / "mhalab" / "conf").rglob("*.yaml")}
    assert shipped and shipped <= names, sorted(shipped - names)
    assert "mhalab/conf/train.yaml" in names and not any(n.startswith("build/") for n in names)
    assert "hydra_plugins/mhalab_sweeper/__init__.py" in names  # the grid sweeper, where Hydra takes plugins from
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


def _layout_block() -> str:
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text[text.index("## Layout\n"):]
    return section[section.index("```\n") + 4:section.index("\n```", section.index("```\n") + 4)]


def test_the_layout_names_every_module():
    """docs/architecture.md's tree is the code's: every module at the top and in the folders by concern is named
    under its folder, and every folder of src/mhalab is named."""
    import re

    block = _layout_block()
    pkg = REPO / "src" / "mhalab"
    folder, named = None, {}
    for line in block.splitlines():
        if not line.startswith("  "):  # docs/, experiments/, scripts/, tests/: outside the package
            continue
        m = re.match(r"^  (\w+)/", line)
        if m:
            folder = m.group(1)
        elif re.match(r"^  \S", line):
            folder = None
        for name in re.findall(r"\b(\w+\.py)\b", line):
            named.setdefault(folder if line.startswith("    ") else None, set()).add(name)
    folders = sorted(p.name for p in pkg.iterdir() if p.is_dir() and not p.name.startswith("__"))
    assert all(f"  {name}/" in block for name in folders), folders
    for where in (None, "config", "runs", "training", "analysis", "report"):
        modules = {p.name for p in (pkg / where if where else pkg).glob("*.py")} - {"__init__.py", "__main__.py"}
        assert modules == named.get(where, set()) - {"__main__.py"}, (where, modules ^ named.get(where, set()))


def test_mhalab_has_no_import_cycle():
    """No module imports one that imports it back, counting imports inside functions (annotations-only imports
    under TYPE_CHECKING aside): the layout's arrows all point one way."""
    import ast

    src = REPO / "src"
    modules = {".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__"): p
               for p in (src / "mhalab").rglob("*.py")}

    def imports(name: str) -> set[str]:
        out, tree = set(), ast.parse(modules[name].read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module:
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(modules)
                out |= subs or ({node.module} & set(modules))
        return out - {name}

    graph = {m: imports(m) for m in modules}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            assert state.get(n) != 1, " -> ".join(path[path.index(n):] + [n]) if n in path else n
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
