"""One `mhalab` command: every subcommand answers --help without importing torch or Lightning (so at once), the
`python -m mhalab.<tool>` entry points still work, and argument errors are one sentence with exit status 2."""

import subprocess
import sys

import pytest

from mhalab.cli import COMMANDS, Command, load
from mhalab.options import parse

pytestmark = pytest.mark.proc  # every test here starts real processes

HEAVY = ("torch", "lightning", "datasets", "matplotlib")
EVERY = [[name] if isinstance(c, Command) else [name, sub] for name, c in COMMANDS.items()
         for sub in ([None] if isinstance(c, Command) else c)]  # every command and bench subcommand, as argv


def run(*args, module="mhalab"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", [*COMMANDS, *(" ".join(c) for c in EVERY if len(c) > 1)])
def test_help_parses_before_any_heavy_import(command):
    code = (f"import sys\nfrom mhalab.cli import main\nsys.argv = ['mhalab', *{command.split()!r}, '--help']\n"
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


def test_every_command_is_a_typed_function_of_its_options_dataclass():
    """The map's two names agree: each function's one parameter is annotated with the dataclass its entry names."""
    import dataclasses
    import typing

    for argv in EVERY:
        entry = COMMANDS[argv[0]] if len(argv) == 1 else COMMANDS[argv[0]][argv[1]]
        fn = load(entry.run)
        if entry.options is None:  # train: Hydra's overrides
            continue
        cls = load(entry.options)
        assert dataclasses.is_dataclass(cls), argv
        hints = typing.get_type_hints(fn)
        assert [h for k, h in hints.items() if k != "return"] == [cls], argv


@pytest.mark.parametrize("argv", [["--threads", "2"], ["threads=2"], ["--threads=2"]])
def test_one_threads_option_in_one_spelling_for_every_command(argv):
    from mhalab.analysis.options import AblateOptions, ConvertOptions
    from mhalab.bench.config import ComplexityConfig, StartupConfig

    assert parse(AblateOptions, ["a.ckpt", *argv]).threads == 2
    assert parse(ConvertOptions, ["a.ckpt", "--n-kv-heads", "1", *argv]).threads == 2
    assert parse(ComplexityConfig, argv).threads == 2 and parse(StartupConfig, argv).threads == 2


def test_the_forms_users_know_parse_alike():
    from mhalab.analysis.options import AblateOptions, ConvertOptions, PlotsOptions
    from mhalab.bench.config import ComplexityConfig, GpuConfig
    from mhalab.report.options import ReportOptions

    r = parse(ReportOptions, ["d1", "d2", "--no-plots", "--out", "o", "metric=val/bpb", "--baseline=seed=0"])
    assert [str(d) for d in r.dirs] == ["d1", "d2"] and not r.plots and str(r.out) == "o"
    assert r.metric == "val/bpb" and r.baseline == "seed=0" and not r.table and not r.wandb
    a = parse(AblateOptions, ["c.ckpt", "--allow", "p1", "--allow", "p2,p3", "--no-prune", "eval_split=validation",
                              "--batch-size", "4"])
    assert a.allow == ["p1", "p2", "p3"] and not a.prune and a.eval_split == "validation" and a.batch_size == 4
    c = parse(ConvertOptions, ["c.ckpt", "n_kv_heads=2", "--init", "mean", "--scratch", "none", "--no-mha-control"])
    assert (c.n_kv_heads, c.init, c.scratch, c.mha_control) == (2, ["mean"], ["none"], False)
    assert parse(ConvertOptions, ["c.ckpt", "--n-kv-heads", "2"]).init == ["mean", "first", "random"]
    p = parse(PlotsOptions, ["run", "--html", "--no-maps", "--max-tokens", "8"])
    assert p.html and not p.maps and p.max_tokens == 8
    x = parse(ComplexityConfig, ["--grid.n", "[16,32]", "grid.d_head=[null,8]", "plots=false", "--backends", "math"])
    assert x.grid.n == [16, 32] and x.grid.d_head == [None, 8] and not x.plots and x.backends == ["math"]
    assert parse(ComplexityConfig, ["backends=[sdpa,math]", "backends=[math]"]).backends == ["math"]  # [..] sets
    g = parse(GpuConfig, ["--dry-run", "compile=[false]", "train_overrides=[a.b=[1,2],c=3]"])
    assert g.dry_run and g.compile == [False] and g.train_overrides == ["a.b=[1,2]", "c=3"]


@pytest.mark.parametrize("argv,names", [
    (["report"], "dirs"), (["report", "d", "--no-such"], "--no-such"), (["report", "d", "wandb=maybe"], "wandb"),
    (["convert", "c.ckpt"], "--n-kv-heads"), (["ablate", "c.ckpt", "--batches", "x"], "--batches"),
    (["bench", "complexity", "grid.n=[1,x]"], "grid.n"), (["bench", "train", "threads=0"], "threads"),
    (["plots", "run", "--threads", "1"], "--threads")])
def test_each_bad_argument_is_one_sentence_naming_it_and_exit_2(argv, names, capsys):
    """Every command's argument errors come from one parser: one line on stderr, exit status 2, nothing run."""
    from mhalab.cli import run_command

    assert run_command(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and names in err and len(err.splitlines()) == 1, err


def test_python_dash_m_of_each_command_module_is_the_command():
    for module, usage in (("mhalab.bench", "usage: mhalab bench {"), ("mhalab.analysis.plots", "usage: mhalab plots")):
        r = run("--help", module=module)
        assert r.returncode == 0 and usage in r.stdout, r.stderr[-2000:]
