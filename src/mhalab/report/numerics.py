"""Whether a design's verdicts survive a change of numerics (issue 27): the reports of one design whose fresh seeds
ran under different numerics (the default kernels, `ATEN_CPU_CAPABILITY=avx2`, 2 torch threads; one report each,
as `scripts/run_design.py` writes them), read side by side. A comparison is **stable** when every numerics gives it
the same verdict (not separated; or separated, the arm on the same side of the baseline) and **flips** otherwise
(also when one numerics has no test); a flip is not a verdict. Beside it, what each numerics' tested runs recorded
of their environment (CPU capability, BLAS, oneDNN, threads, processor), so a flip can be traced to its kernels.

    mhalab report --numerics logs/kv_bpb/design/stratum0/report-{B,avx2,threads2}/report.json [--out DIR]

writes `stability.md`, `stability.csv` and `stability.json` into `--out` (default: the folder holding the first
report's folder). Each report is named by its folder (`report-avx2` -> `avx2`) or as given (`B:results/report.json`)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from mhalab.config.writes import check_links
from mhalab.errors import ConfigError
from mhalab.relative_path import relative
from mhalab.tables import Link, Table, fmt_p, interval, write_csv

FILES = ("stability.md", "stability.csv", "stability.json")
FIGURES = ("estimate", "ci95_low", "ci95_high", "p", "p_holm")  # each numerics' figures of a comparison
ENVIRONMENT = ("env_device", "env_cpu_capability", "env_aten_cpu_capability", "env_onednn_max_cpu_isa",
               "env_torch_threads", "env_blas", "env_mkldnn", "env_processor", "env_torch", "env_precision")  # runs.csv columns: which kernels ran


def verdict_class(c: dict) -> str:
    """A comparison's verdict as the stability check compares it: no test, not separated, or separated with the
    side the arm lies on (a separation in opposite directions is a flip): the estimate's sign, or for steps to the
    threshold the log-rank's `direction` (+ = the arm takes more steps); a report without either says only
    "separated". A comparison with an equivalence test (`equivalent`, TOST within ±`tost_margin`: mhalab convert)
    adds its outcome, alone where the comparison has no Holm-adjusted difference test (a negative control)."""
    if c.get("equivalent") is not None:
        eq = f"{'equivalent' if c['equivalent'] else 'not shown equivalent'} within ±{c['tost_margin']:g}"
        return eq if c.get("p_holm") is None else f"{difference_class(c)}; {eq}"
    return difference_class(c)


def difference_class(c: dict) -> str:
    """No test, not separated, or separated with the arm's side (`verdict_class`)."""
    if c.get("p") is None or c.get("degenerate"):
        return "no test"
    if c["verdict"] != "separated":
        return "not separated"
    side = c["estimate"] if c.get("estimate") is not None else c.get("direction")
    if side is None:
        return "separated"
    return "separated, arm higher" if side > 0 else "separated, arm lower"


def named(item: str | Path) -> tuple[str, Path]:
    """A `--numerics` item: `NAME:path/report.json`, or a path named by its folder (`report-avx2` -> `avx2`)."""
    text = str(item)
    name, sep, path = text.partition(":")
    if sep and name and "/" not in name:
        return name, Path(path)
    folder = Path(text).resolve().parent.name
    return folder.removeprefix("report-"), Path(text)


def environment(report_json: Path) -> dict[str, str]:
    """The environment of the runs a report tested (runs.csv beside it, rows in its verdicts): each column's values."""
    path = report_json.parent / "runs.csv"
    if not path.is_file():
        raise ConfigError(f"{path} is missing: give report.json files written by `mhalab report` (runs.csv beside)")
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("in_verdicts") == "True"]
    return {k.removeprefix("env_"): ", ".join(sorted({r.get(k, "") or "-" for r in rows})) for k in ENVIRONMENT}


def stability(files: list[Path]) -> dict:
    """{'numerics': names, 'environment': {name: {...}}, 'rows': one per comparison with each numerics' figures and
    'stable'}. Every report must hold the same comparisons (the same design), or a ConfigError names the gap."""
    if len(files) < 2:
        raise ConfigError("--numerics: give at least two report.json files of the same design (e.g. report-B and "
                          "report-avx2)")
    names, files = zip(*map(named, files))
    if len(set(names)) != len(names):
        raise ConfigError(f"--numerics: two reports have the same name ({', '.join(names)}): name each as "
                          "NAME:path/report.json (a path alone is named by its folder, report-avx2 -> avx2)")
    if len({Path(f).resolve() for f in files}) != len(files):
        raise ConfigError("--numerics: one report is given twice; give each numerics' own report.json")
    reports = {}
    for name, f in zip(names, files):
        try:
            data = json.loads(Path(f).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"--numerics: {f} is not a report.json ({e})") from None
        reports[name] = {(c["arm"], c["baseline"], c["endpoint"]): c for c in data.get("comparisons", [])}
    keys = list(reports[names[0]])
    for name in names[1:]:
        if set(reports[name]) != set(keys):
            gap = sorted(set(keys) ^ set(reports[name]))
            raise ConfigError(f"--numerics: {names[0]} and {name} hold different comparisons ({gap[0][0]} vs "
                              f"{gap[0][1]}, {gap[0][2]}): give reports of one design")
    rows = []
    for key in keys:
        per = {name: reports[name][key] for name in names}
        classes = {name: verdict_class(c) for name, c in per.items()}
        same = len(set(classes.values())) == 1
        stable = None if same and classes[names[0]] == "no test" else same  # None: tested under no numerics
        rows.append({"arm": key[0], "baseline": key[1], "endpoint": key[2],
                     "stable": stable, "verdict": classes[names[0]] if same else "flips",
                     **{f"{name}/{k}": per[name].get(k) for name in names for k in FIGURES},
                     **{f"{name}/verdict": classes[name] for name in names}})
    return {"numerics": list(names), "sources": [str(f) for f in files],
            "environment": {name: environment(Path(f)) for name, f in zip(names, files)}, "rows": rows}


def verdict_words(row: dict) -> str:
    """A stability row's verdict as the tables print it."""
    return {True: f"stable: {row['verdict']}", False: "flips: no verdict", None: "no test under any numerics"}[
        row["stable"]]


def verdicts_table(files: list[Path], base: Path = Path(".")) -> str:
    """experiments/README.md's verdicts table from stability.json files: one row per comparison, each numerics'
    Holm p and the verdict across them (stable verdicts in bold), each design linked from `base` (the folder the
    table is read from)."""
    t = Table(["design", "arm vs baseline", "endpoint", "numerics", "difference under each", "Holm p under each",
               "verdict"])
    for f in files:
        result = json.loads(Path(f).read_text())
        names, design = result["numerics"], Link(relative(Path(f).parent, base), Path(f).with_name("stability.md"), base)
        for r in result["rows"]:
            diffs = (interval(r[f"{n}/estimate"], None, None) for n in names)
            t.add([design, f"{r['arm']} vs {r['baseline']}", r["endpoint"],
                   " / ".join(names), " / ".join(diffs), " / ".join(fmt_p(r[f"{n}/p_holm"]) for n in names),
                   verdict_words(r)], bold=(6,) if r["stable"] else ())
    return t.markdown()


def markdown(result: dict) -> str:
    names = result["numerics"]
    t = Table(["arm vs baseline", "endpoint", *(f"{n}: difference [95% CI], Holm p" for n in names), "verdict"])
    for r in result["rows"]:
        t.add([f"{r['arm']} vs {r['baseline']}", r["endpoint"],
               *(f"{interval(r[f'{n}/estimate'], r[f'{n}/ci95_low'], r[f'{n}/ci95_high'])}, "
                 f"{fmt_p(r[f'{n}/p_holm'])}: {r[f'{n}/verdict']}" for n in names),
               verdict_words(r)], bold=(len(names) + 2,))
    env = Table(["numerics", *(k for k in next(iter(result["environment"].values())))])
    for n, e in result["environment"].items():
        env.add([n, *e.values()])
    return ("# Verdicts under each numerics\n\n"
            "Each comparison of the design under every numerics its fresh seeds ran with (one report each: "
            + ", ".join(f"`{s}`" for s in result["sources"]) + "). A verdict is stable when every numerics gives it "
            "(not separated; or separated with the arm on the same side); otherwise it flips and is no verdict.\n\n"
            + t.markdown() + "\n\n## Environment of the tested runs\n\n" + env.markdown() + "\n")


def write(result: dict, out: Path) -> Path:
    """The three files, by fixed names into `out` (which may sit among runs someone else made: a link at one of
    those names is refused, not followed)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        check_links(out / name, out, f"write {name} there")
    columns = ["arm", "baseline", "endpoint", "stable", "verdict"] + [
        f"{n}/{k}" for n in result["numerics"] for k in (*FIGURES, "verdict")]
    write_csv(out / "stability.csv", columns, result["rows"])
    (out / "stability.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    (out / "stability.md").write_text(markdown(result))
    return out / "stability.md"
