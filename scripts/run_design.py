"""Run a declared design (issue 27) in the background: stage A, the choice, stage B, the second numerics.

    nohup python scripts/run_design.py EXPERIMENT > logs/EXPERIMENT-design.log 2>&1 &
    python scripts/run_design.py EXPERIMENT [--numerics avx2,threads2] [--strata 0,2] [-- extra overrides]

The plan is the experiment config's (src/mhalab/conf/experiment/EXPERIMENT.yaml): stage A is its sweep (the grid
on endpoint.selection_seeds), once per design.strata entry; `mhalab report` then picks each arm's tuned value on
those seeds (scripts/tuned_sweep.py's rule) and it is frozen; stage B runs each arm's chosen value on
design.stage_b_seeds, and each design.numerics_seeds entry runs it again on its own fresh seeds: avx2 with
ATEN_CPU_CAPABILITY=avx2 (two jobs, one thread each; on a CPU whose default kernels are AVX2 already that would be
stage B's numerics again, so its seeds run with ATen's unvectorised kernels, scalar, and the state records it),
scalar with ATEN_CPU_CAPABILITY=default, threads2 with 2 torch threads (one job at a time), bf16 in bf16 mixed
precision (a design run on a GPU: `--numerics bf16 -- trainer=gpu trainer.precision=32-true`). Every
stage writes a report (stage A alone; A with each fresh stage) beside the runs, under
logs/EXPERIMENT/design/<stratum>/, and `mhalab report --numerics` reads them side by side into stability.md there:
each verdict stable under every numerics, or flipping.

Run from the folder that holds `logs/` (or set MHALAB_ROOT; an override of paths.* or hydra.sweep/run, which
would move the runs away from the state that names them, is refused). The code is a frozen copy of the committed src/
(git archive of HEAD when the design starts, under logs/EXPERIMENT/design/code-<commit>/, named in its state.json and
used to train every later stage), so editing the tree or committing while a design runs changes no run; a tree
with uncommitted changes under src/ is refused. The reports are this checkout's `mhalab report` (analysis fixes
reach a design started before them). Resumable: run the same command again; finished
stages are skipped (logs/EXPERIMENT/design/state.json) and a started one continues with resume=true. The stages
of one numerics (stage B, or a second numerics: one stage an arm) run on one kind of machine (GPU, or CPU):
another is refused them, since their arms would be compared across machines (stage A, which only chooses, may
span machines). A numerics (stage B, or a second one) stranded on a machine that does not come back runs again whole
on this one with `--set-aside NUMERICS --strata I`: its stages are kept in the state as "set-aside <stage>" (the
machine they ran on, never read by a report) and all its arms run again here on the same seeds. Stage B does
not start when the baseline's chosen cell left a stage-A run short of the endpoint threshold (censored baseline):
the design then needs a longer budget, declared before anything more runs.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import tuned_sweep  # noqa: E402  (one rule for running a sweep and reading each arm's choice)
from mhalab.atomic import write_atomic  # noqa: E402  (the project's one way to replace a file)
from mhalab.errors import ConfigError  # noqa: E402
from mhalab.runs.summary import machine, read_summary  # noqa: E402  (the one reader of a run's summary.json)

NUMERICS = {  # name -> (environment, overrides): the second numerics of design.numerics_seeds
    "default": ({}, []),
    "avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, ["torch_threads=1"]),
    "scalar": ({"ATEN_CPU_CAPABILITY": "default"}, ["torch_threads=1"]),  # ATen's unvectorised kernels
    "threads2": ({}, ["torch_threads=2", "hydra.launcher.n_jobs=1"]),
    "bf16": ({}, ["trainer.precision=bf16-mixed"]),  # a GPU design's second numerics (stage A and B in float32)
}
PLAN = """import json, sys
from omegaconf import OmegaConf
from mhalab.runs.preflight import compose, validate
cfg = compose(sys.argv[2:], config_dir=sys.argv[1] or None)
t = validate(cfg)
print(json.dumps({"task_name": t.task_name, "selection_seeds": t.endpoint.selection_seeds,
                  "threshold": t.endpoint.threshold, "sweep_seeds": str(cfg.hydra.sweeper.params.get("seed", "")),
                  "stage_b_seeds": t.design.stage_b_seeds, "numerics_seeds": t.design.numerics_seeds,
                  "strata": t.design.strata, "baseline": t.design.baseline}))
"""


def frozen_code(dest: Path, state: dict) -> Path:
    """A copy of the committed src/ under dest/code-<commit>: HEAD's when the design starts (recorded in its
    state), the recorded one when it resumes, so every stage of a design runs the same code; refuses to start a
    design from a tree with uncommitted src/ changes."""
    if state.get("code"):  # resuming: the recorded copy, rebuilt from its commit when it is gone (another machine)
        why = bad_state({"code": state["code"]}, "")
        if why:
            sys.exit(f"{dest}/state.json: {why}: refused")
        code = dest / state["code"]
        if not (code / "src" / "mhalab").is_dir():
            extract_src(state["code"].removeprefix("code-"), code)
        return code / "src"
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "src"], capture_output=True, text=True,
                           check=True).stdout.strip()
    if dirty:
        sys.exit("src/ has uncommitted changes: commit the design before running it (its README names the commit)")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    code = dest / f"code-{commit[:12]}"
    if not (code / "src" / "mhalab").is_dir():
        extract_src(commit, code)
    state["code"] = code.name
    return code / "src"


def extract_src(commit: str, code: Path) -> None:
    """The committed src/ of `commit` (git archive) unpacked under code/, whole or not at all. The commit must be in
    this checkout's history (HEAD or before it): a state handed over names no other code."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True)

    full = git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").stdout.decode().strip()
    if not full.startswith(commit) or git("merge-base", "--is-ancestor", full, "HEAD").returncode != 0:
        sys.exit(f"this design's code is commit {commit}, which is not in this checkout's history (HEAD or before): "
                 "check out a branch that holds it, or start anew")
    tar = git("archive", full, "src")
    tmp = code.with_name(code.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tarfile.open(fileobj=io.BytesIO(tar.stdout)).extractall(tmp, filter="data")
    shutil.rmtree(code, ignore_errors=True)
    tmp.rename(code)


def capability(env: dict) -> str:
    """torch's CPU kernels (`torch.backends.cpu.get_cpu_capability()`) in a process with `env` added (asked once
    per environment: each answer is a process that imports torch)."""
    return _capability(tuple(sorted(env.items())))


@functools.lru_cache(maxsize=None)
def _capability(env: tuple[tuple[str, str], ...]) -> str:
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                       env={**os.environ, **dict(env)}, capture_output=True, text=True, check=True)
    return r.stdout.strip()


def numerics_here(kind: str, probe=capability) -> tuple[str, str | None]:
    """The numerics that runs a declared one's fresh seeds on this machine, and why it is another: a kernel choice
    (ATEN_CPU_CAPABILITY=avx2) that is already this CPU's default would repeat stage B's numerics bit for bit (an
    AVX2-only CPU such as an AMD EPYC Zen 3), so ATen's unvectorised kernels (scalar) run them instead."""
    env = NUMERICS[kind][0]
    if "ATEN_CPU_CAPABILITY" not in env:
        return kind, None
    here = probe({})
    if probe(env) != here:
        return kind, None
    return "scalar", (f"{kind}: ATEN_CPU_CAPABILITY={env['ATEN_CPU_CAPABILITY']} gives this CPU's default kernels "
                      f"({here}), stage B's numerics; its fresh seeds run with ATen's unvectorised kernels instead "
                      "(scalar: ATEN_CPU_CAPABILITY=default)")


MACHINE = """import torch
from mhalab.runs.summary import cpu_name
print(torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_name())
"""


@functools.lru_cache(maxsize=None)
def this_machine() -> str:
    """This machine as `machine` names a run's: asked of the code on PYTHONPATH, the design's frozen copy, whose
    runs record their environment."""
    return subprocess.run([sys.executable, "-c", MACHINE], capture_output=True, text=True,
                          check=True).stdout.strip().splitlines()[-1]


def group_machines(done: dict, group: str, task: str) -> set[str]:
    """The machines the runs of one numerics of a stratum ran on (stage B, or one second numerics: the stages of all
    its arms, named "<group> <arm>"): each stage's recorded `machine` and that of each finished job in its folder
    (an older runner recorded none)."""
    seen = set()
    for name, stage in done.items():
        if name.split(" ")[0] != group or not isinstance(stage, dict):
            continue
        seen.update([stage["machine"]] if isinstance(stage.get("machine"), str) else [])
        folder = stage.get("dir") or stage.get("folder")
        for job in sorted(sweep_here(folder, task).glob("*/summary.json")) if folder else []:
            seen.add(machine(read_summary(job.parent).environment))
    return seen


def machine_clash(done: dict, name: str, task: str, here: str) -> str | None:
    """Why stage `name` must not run on this machine (`here`: its GPU, or CPU), or None. The arms of one
    numerics are compared with one another, so all their runs run on one kind of machine: another CPU's kernels and
    BLAS path (or another GPU) are another numerics, and arms split across two would compare machines as well as
    arms. Stage A only chooses each arm's rate, and its runs may span machines."""
    group = name.split(" ")[0]
    other = sorted(group_machines(done, group, task) - {here}) if group != "A" else []
    if not other:
        return None
    return (f"{name}: the {group} runs of this stratum ran on {', '.join(other)}, and this machine is {here}: its arms "
            "would be compared across machines. Resume it on that machine (python scripts/design_runs.py restore "
            f"{task})" + (f", leave {group} out with --numerics" if group != "B" else "")
            + f", or run it again whole here with --set-aside {group}")


def set_aside(done: dict, group: str, here: str, task: str) -> list[str]:
    """Set aside the stages of one numerics (`group`: stage B or a second numerics) of one stratum whose runs ran on
    another machine than `here`, so that it runs again whole here, every arm on this machine at its frozen choice:
    each stage is kept as "set-aside <stage>" with its machines, which no report reads. Returns the stages set aside
    (none when that was done before and its runs here resume, or its new runs finished elsewhere: each stage has its
    folder, so nothing of it runs here; an arm not yet begun still meets machine_clash); ValueError says why it
    cannot be: stage A (the choice, which may span machines), a numerics with no runs or whose runs all ran here
    (resume it instead), or one set aside before whose new runs, unfinished, ran on yet another machine (resume them
    there)."""
    if group == "A":
        raise ValueError("--set-aside A: stage A only chooses and may span machines; name B or a second numerics")
    ran = group_machines(done, group, task)
    before = any(n.startswith(f"set-aside {group} ") for n in done)
    names = [n for n, stage in done.items() if isinstance(stage, dict) and n.split(" ")[0] == group]
    if before and (ran <= {here} or all(done[n].get("dir") for n in names)):  # resumed here, or finished elsewhere
        return []
    if before:
        raise ValueError(f"--set-aside {group}: set aside once already, and its new runs ran on "
                         f"{', '.join(sorted(ran))}; resume them there")
    if not ran:
        raise ValueError(f"--set-aside {group}: this stratum has no {group} runs to set aside")
    if ran == {here}:
        raise ValueError(f"--set-aside {group}: its runs ran on this machine ({here}); resume them instead")
    for name in names:
        done[f"set-aside {name}"] = {**done.pop(name), "ran_on": sorted(ran), "set_aside_on": here}
    return names


def clashing(declared: list[str], here: dict) -> str | None:
    """Why the numerics `declared` cannot run as `here` maps them (a state read back names them too), or None:
    each must be a known one, and no two may run as the same (their stages and reports would share a name)."""
    ran = [here.get(n) for n in declared]
    if any(not isinstance(k, str) or k not in NUMERICS for k in ran) or len(set(ran)) < len(ran):
        return (f"the declared numerics {', '.join(declared)} would run as {ran}: each must be one of "
                f"{', '.join(NUMERICS)}, and no two the same (declare scalar or avx2, not both, on a CPU whose default "
                "kernels are AVX2)")
    return None


def root() -> Path:
    """The folder that holds logs/ (MHALAB_ROOT, or the current one)."""
    return Path(os.environ.get("MHALAB_ROOT", "."))


def bad_state(state: dict, task: str) -> str | None:
    """Why a design's state (read back, perhaps from another machine) must not be used, or None: its code is a
    frozen copy's name and each stage's folder a sweep under logs/<task>/multiruns (relative, or absolute as an
    older runner recorded it), so a state handed over cannot point the design at other code or other folders."""
    if not isinstance(state, dict) or not all(isinstance(v, (dict, str)) for v in state.values()):
        return "it is not a design's state (a JSON object of stages)"
    if "code" in state and not re.fullmatch(r"code-[0-9a-f]{12}", str(state["code"])):
        return f"it names the design's code {state['code']!r}, not code-<12 hex digits of a commit>"
    for stratum, name, d in stage_dirs(state) + stage_dirs(state, "folder"):
        if sweep_part(str(d), task) is None:
            return f"stage {stratum} {name} names the folder {d!r}, not a sweep under logs/{task}/multiruns"
    return None


def stage_dirs(state: dict, key: str = "dir") -> list[tuple[str, str, str]]:
    """(stratum, stage, recorded folder) of each stage of a state that has ended (recorded its sweep's folder as
    "dir"); with key="folder", of each stage whose sweep has announced its folder (recorded when it starts)."""
    return [(stratum, name, stage[key]) for stratum, stages in state.items() if isinstance(stages, dict)
            for name, stage in stages.items() if isinstance(stage, dict) and stage.get(key) is not None]


def sweep_part(recorded: str, task: str) -> Path | None:
    """logs/<task>/multiruns/<sweep> of a recorded stage folder, or None."""
    parts = Path(recorded).parts
    for i in range(len(parts) - 3, -1, -1):
        if parts[i:i + 3] == ("logs", task, "multiruns") and (i == 0 or Path(recorded).is_absolute()):
            rest = parts[i:]
            return Path(*rest) if ".." not in rest and len(rest) == 4 else None
    return None


def sweep_here(recorded: str, task: str) -> Path:
    """A recorded stage folder as it lies under this root (the state was checked by bad_state when it was read)."""
    return root() / sweep_part(recorded, task)


def relative(d: Path) -> Path:
    """d relative to the root when it lies under it: the state then holds on another machine or checkout
    (scripts/design_runs.py carries it)."""
    try:
        return d.resolve().relative_to(root().resolve())
    except ValueError:
        return d


def resume_args(stage: dict, task: str) -> list[str]:
    """How a stage that is not done starts again, from its recorded state: afresh when it never started or its sweep
    never announced a folder (the launcher names it before any job starts), on that folder when it did, and on the
    sweep that holds its jobs' configs (resume=true) when an older runner recorded no folder."""
    if not stage.get("started") or stage.get("folder", "") is None:
        return []
    if "folder" not in stage:
        return ["resume=true"]
    return [f"resume={sweep_here(stage['folder'], task).resolve()}"]


def plan(experiment: str, stratum: list[str], config_dir: str | None = None) -> dict:
    """The design as the experiment config declares it (composed and checked by mhalab's preflight)."""
    out = subprocess.run([sys.executable, "-c", PLAN, config_dir or "", f"experiment={experiment}", *stratum],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"experiment={experiment} {' '.join(stratum)} does not compose: {out.stderr.strip()[-2000:]}")
    p = json.loads(out.stdout.strip().splitlines()[-1])
    sweep = sorted(int(s) for s in p["sweep_seeds"].split(",")) if p["sweep_seeds"] else []
    if sorted(p["selection_seeds"]) != sweep:
        sys.exit(f"experiment={experiment}: the sweep's seeds {sweep} are not endpoint.selection_seeds "
                 f"{p['selection_seeds']} (stage A runs exactly the selection seeds)")
    return p


SAME_ARM = ("trainer", "trainer.precision")  # keys a numerics sets that the report must not read as an arm: the
#   device (trainer=gpu, where a stage ran again whole on a CPU) and the precision; torch_threads, hydra.* never are


def analysis_env() -> dict:
    """The environment a report runs in: this checkout's src/, not the design's frozen copy. The frozen code trains
    (so every run of a design is the same code); the analysis is the current `mhalab report`, so its fixes and
    options reach a design started before them. Other PYTHONPATH entries (packages carried to a GPU machine) stay,
    behind it."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *kept])}


def run_report(*args: str) -> None:
    """`mhalab report ARGS` with this checkout's analysis, printed first as a user types it (the design's log)."""
    print("$ mhalab report " + " ".join(args), flush=True)
    subprocess.run([*tuned_sweep.MHALAB, "report", *args], check=True, env=analysis_env())


def report(dirs: list[Path], out: Path, baseline: str | None) -> None:
    run_report(*map(str, dirs), "--out", str(out), "--same-arm", ",".join(SAME_ARM),
               *(["--baseline", baseline] if baseline else []))


def censored_baseline(a_dir: Path, baseline: str | None, threshold: float | None) -> str | None:
    """A sentence when the baseline arm's chosen cell has a stage-A run that did not reach the threshold."""
    if baseline is None or threshold is None:
        return None
    arms = json.loads((a_dir / "report" / "report.json").read_text())["arms"]
    for arm in arms:
        if arm["label"] == baseline or baseline in arm["label"].split(", "):
            cell = arm["cells"].get(arm["chosen"], {})
            k, n = cell.get("rate", [0, 0])
            if k < n:
                return (f"baseline {baseline} at its chosen {arm['chosen']} reached {threshold} on {k} of {n} stage-A "
                        "runs: the budget is too short (censored baseline); declare a longer one before stage B")
    return None


def run_stratum(experiment: str, stratum: list[str], p: dict, numerics: list[str], state: dict, save,
                folder: Path, extra: list[str], aside: list[str] = ()) -> None:
    key = " ".join(stratum) or "-"
    done = state.setdefault(key, {})
    for group in aside:
        try:
            moved = set_aside(done, group, this_machine(), p["task_name"])
        except ValueError as e:
            sys.exit(f"[{key}] {e}: refused")
        if moved:
            save()
            print(f"[{key}] {group}: {len(moved)} stages run on another machine set aside ("
                  f"{', '.join('set-aside ' + n for n in moved)}); it runs again whole here", flush=True)

    def stage(name: str, args: list[str], env: dict | None = None) -> Path:
        if name in done and done[name].get("dir"):
            print(f"[{key}] {name}: done, {done[name]['dir']}", flush=True)
            return sweep_here(done[name]["dir"], p["task_name"])
        before = done.get(name, {})
        resume = resume_args(before, p["task_name"])
        try:
            clash = machine_clash(done, name, p["task_name"], this_machine())
        except ConfigError as e:  # a job's summary.json that is not one
            sys.exit(f"[{key}] {name}: {e}")
        if clash:
            sys.exit(f"[{key}] {clash}: refused")
        done[name] = {"started": True, "folder": before.get("folder"), "machine": this_machine()}
        save()

        def announced(folder: Path) -> None:  # before any job starts: a resume continues exactly this sweep
            done[name]["folder"] = str(relative(folder))
            save()

        old = dict(os.environ)
        os.environ.update(env or {})
        try:
            d = tuned_sweep.train([*extra, f"experiment={experiment}", *stratum, *args, *resume], announced)
        finally:
            os.environ.clear()
            os.environ.update(old)
        done[name]["dir"] = str(relative(d))
        save()
        return d

    a_dir = stage("A", [])
    report([a_dir], a_dir / "report", p["baseline"])
    if p["threshold"] is not None:  # the curve: escape rate and median steps against the learning rate, per arm
        subprocess.run([sys.executable, str(REPO / "scripts" / "lr_curve.py"), str(a_dir / "report")], check=True,
                       env=analysis_env())
    stop = censored_baseline(a_dir, p["baseline"], p["threshold"])
    if stop:
        sys.exit(f"[{key}] {stop}")
    cells = tuned_sweep.chosen_cells([a_dir])
    here = done.setdefault("numerics", {})  # declared -> run here, decided once (the state carries it elsewhere)
    for n in numerics:
        if n in p["numerics_seeds"] and n not in here:
            here[n], why = numerics_here(n)
            save()
            if why:
                print(f"[{key}] {why}", flush=True)
    why = clashing([n for n in numerics if n in p["numerics_seeds"]], here)
    if why:
        sys.exit(f"[{key}] {why}: refused")
    runs = [("B", "default", p["stage_b_seeds"])] + [(here[n], here[n], p["numerics_seeds"][n]) for n in numerics
                                                    if n in p["numerics_seeds"]]
    for name, kind, seeds in runs:
        if not seeds:
            continue
        env, over = NUMERICS[kind]
        dirs = [stage(f"{name} {' '.join(arm)}", [f"seed={','.join(map(str, seeds))}", *arm, *chosen, *over], env)
                for arm, chosen in cells]
        report([a_dir, *dirs], folder / f"report-{name}", p["baseline"])
    made = [folder / f"report-{name}" / "report.json" for name, _, seeds in runs if seeds]
    if len(made) > 1:  # each verdict stable or flipping across the numerics (stability.md beside the reports)
        run_report("--numerics", *map(str, made), "--out", str(folder))


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment")
    ap.add_argument("--numerics", default="avx2,threads2", help="second numerics to run after stage B, in order")
    ap.add_argument("--strata", default=None, help="run only these strata (indices into design.strata, e.g. 0,2)")
    ap.add_argument("--set-aside", default="", help="a numerics (B, or a second one) whose runs ran on another "
                    "machine, run again whole on this one (with --strata)")
    ap.add_argument("--config-dir", default=None, help="your own config folder (mhalab train --config-dir)")
    ap.add_argument("--no-freeze", action="store_true", help="run the code on PYTHONPATH, not a frozen copy of HEAD "
                    "(tests; a design's recorded runs use the frozen copy)")
    args, extra = ap.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    moved = [a for a in extra if re.match(r"[+~]*(paths\b|hydra\.(sweep|run)\b)", a)]
    if moved:
        sys.exit(f"{moved[0]}: a design keeps its runs under <root>/logs (its state and `scripts/design_runs.py` "
                 "name them there); leave paths.* and hydra.sweep/run as they are and set MHALAB_ROOT instead")
    if args.config_dir:
        extra = ["--config-dir", args.config_dir, *extra]
    p = plan(args.experiment, [], args.config_dir)
    base = root() / "logs" / p["task_name"] / "design"
    base.mkdir(parents=True, exist_ok=True)
    numerics = [n for n in args.numerics.split(",") if n]
    aside = [n for n in args.set_aside.split(",") if n]
    if aside and args.strata is None:
        sys.exit("--set-aside: name the strata whose runs it sets aside with --strata (e.g. --strata 2)")
    for n in numerics:
        if n not in NUMERICS or n == "default":
            sys.exit(f"--numerics {n!r}: give a comma-separated list of "
                     f"{', '.join(k for k in NUMERICS if k != 'default')}")
    state_file = base / "state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    why = bad_state(state, p["task_name"])
    if why:
        sys.exit(f"{state_file}: {why}: refused")

    def save() -> None:
        write_atomic(state_file, json.dumps(state, indent=1))

    if not args.no_freeze:
        os.environ["PYTHONPATH"] = str(frozen_code(base, state))
        save()
    os.environ["PYTHONNOUSERSITE"] = "1"
    print(f"design {args.experiment}: code {os.environ.get('PYTHONPATH', 'installed')}; extra overrides "
          f"{extra or 'none'}", flush=True)

    strata = [s.split() for s in p["strata"]] or [[]]
    chosen = range(len(strata)) if args.strata is None else [int(i) for i in args.strata.split(",")]
    for i in chosen:
        folder = base / (f"stratum{i}" if p["strata"] else "all")
        folder.mkdir(exist_ok=True)
        run_stratum(args.experiment, strata[i], plan(args.experiment, strata[i], args.config_dir), numerics, state,
                    save, folder, extra, aside)
    print(f"design {args.experiment}: done; reports under {base}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
