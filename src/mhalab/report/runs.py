"""The runs a report reads: every summary.json under the given folders (through the run contract, so a damaged or
foreign file is listed as failed, never trusted), each placed in its arm (its overrides minus seed, the tuned keys
and how it was run) and its cell (the values of the tuned keys)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mhalab.data.config import DataConfig
from mhalab.errors import ConfigError
from mhalab.stats import lower_is_better
from mhalab.runs.summary import SUMMARY, RunSummary, read_summary

IGNORED_KEYS = ("seed", "resume", "fault.", "hydra.", "hydra/", "data.num_workers", "paths.", "torch_threads",
                "endpoint.selection_seeds")  # a run's stage is not its arm; `fault.`: overrides of runs recorded
# before fault injection moved to the MHALAB_FAULTS environment variable
DESIGN = ("n_heads", "n_kv_heads", "d_head", "d_model", "d_ff", "n_layers")
COST = ("params", "flops_per_token", "attention_flops_per_token", "kv_cache_bytes_per_token")


@dataclass
class Run:
    """One finished run as the report sees it."""

    dir: Path
    summary: RunSummary
    arm: tuple[str, ...]  # overrides that define the arm
    cell: tuple[str, ...]  # tuned overrides (e.g. optim.lr=0.001)

    @property
    def seed(self) -> Any:
        return self.summary.config.get("seed")

    @property
    def endpoint(self) -> dict:
        return self.summary.endpoint or {}

    @property
    def stage(self) -> str:
        """'A': a selection seed (endpoint.selection_seeds), which chooses its arm's tuned value; 'B': a fresh seed,
        which tests the chosen value; 'A+B': the experiment declared no selection seeds, so its seeds do both."""
        chosen_on = self.endpoint.get("selection_seeds")
        if not chosen_on:
            return "A+B"
        return "A" if self.seed in chosen_on else "B"

    def value(self, metric: str) -> float | None:
        return self.summary.metric(metric)

    def reached(self) -> bool | None:
        """Whether the run reached its endpoint threshold on validation (None: no threshold)."""
        if self.endpoint.get("threshold") is None:
            return None
        return self.endpoint.get("threshold_step") is not None

    def steps(self) -> float | None:
        """Steps to the threshold, or the steps run when it was never reached (censored)."""
        if self.reached() is None:
            return None
        step = self.endpoint.get("threshold_step")
        return float(step if step is not None else self.summary.timings.get("train_steps") or 0)


def seed_order(seed) -> tuple:
    """Sort key: seeds in numeric order (0, 1, 2, 10), anything else after them."""
    return (0, seed, "") if isinstance(seed, int) else (1, 0, str(seed))


def find_runs(dirs: list[Path]) -> tuple[list[tuple[Path, RunSummary]], list[dict]]:
    """(readable finished runs, failed jobs) under `dirs`: every summary.json, and every Hydra job without one."""
    runs, failed, seen = [], [], set()
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise ConfigError(f"{d} is not a directory (give a multirun directory, e.g. "
                              "logs/kv_sweep/multiruns/<id>)")
        for path in sorted(d.rglob(SUMMARY)):
            job = path.parent
            if "report" in job.relative_to(d).parts or job in seen:
                continue
            seen.add(job)
            try:
                s = read_summary(job)
            except ConfigError as e:
                failed.append({"dir": str(job), "overrides": [], "kind": "unreadable", "error": str(e)})
                continue
            if s.status == "ok" and s.non_finite():
                failed.append({"dir": str(job), "overrides": s.overrides, "kind": "non-finite",
                               "error": f"status ok, but NaN or infinite: {', '.join(s.non_finite())}"})
            elif s.status == "ok":
                runs.append((job, s))
            else:
                failed.append({"dir": str(job), "overrides": s.overrides, "kind": (s.error or {}).get("kind", s.status),
                               "error": (s.error or {}).get("message", s.status)})
        for hydra_dir in sorted(d.rglob(".hydra")):
            job = hydra_dir.parent
            if job not in seen and job != d and (hydra_dir / "overrides.yaml").is_file():
                seen.add(job)
                failed.append({"dir": str(job), "overrides": [], "kind": "missing",
                               "error": "no summary.json (the job was killed or is still running)"})
    if not runs and not failed:
        raise ConfigError(f"no summary.json under {', '.join(map(str, dirs))}: run a sweep first "
                          "(mhalab train -m experiment=kv_sweep)")
    return runs, failed


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def place(runs: list[tuple[Path, RunSummary]], tuned: list[str], same_arm: tuple[str, ...] = ()) -> list[Run]:
    """Each run with its arm and cell; overrides of a key in same_arm (a design's second numerics, e.g.
    trainer.precision) do not make an arm of their own."""
    for key in same_arm:
        if not any(_has_key(s.config, key) for _, s in runs):
            raise ConfigError(f"--same-arm {key}: not a key of these runs' configs; give keys such as "
                              "trainer.precision")
    out = []
    for job, s in runs:
        kept = [o for o in s.overrides if not key_of(o).startswith(IGNORED_KEYS) and key_of(o) not in same_arm]
        arm = tuple(sorted(o for o in kept if key_of(o) not in tuned))
        cell = tuple(sorted(o for o in kept if key_of(o) in tuned))
        out.append(Run(job, s, arm, cell))
    return out


def _has_key(config: dict, dotted: str) -> bool:
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def declared(runs: list[tuple[Path, RunSummary]], key: str) -> tuple[list, set]:
    """The value of endpoint.<key> the runs' experiment declared (a list), and every distinct declaration found."""
    found = {tuple((s.endpoint or {}).get(key) or ()) for _, s in runs}
    return (list(next(iter(found))) if len(found) == 1 else []), found


def tuned_keys(runs: list[tuple[Path, RunSummary]]) -> list[str]:
    """The keys the runs' experiments declared as tuned per arm (endpoint.tuned); all runs must agree."""
    value, found = declared(runs, "tuned")
    if len(found) > 1:
        raise ConfigError(f"these runs declare different tuned keys ({'; '.join(map(str, sorted(found)))}): report "
                          "each experiment's runs together, not runs of different designs")
    return value


def selection_seeds(runs: list[tuple[Path, RunSummary]]) -> list[int]:
    """The stage-A seeds the runs' experiment declared (endpoint.selection_seeds); all runs must agree."""
    value, found = declared(runs, "selection_seeds")
    if len(found) > 1:
        raise ConfigError(f"these runs declare different endpoint.selection_seeds ({'; '.join(map(str, sorted(found)))}"
                          "): give stage A and stage B runs the same declaration")
    return value


def the_metric(runs: list[tuple[Path, RunSummary]], metric: str | None) -> str:
    """The metric every run is compared on: --metric, else the endpoint's, else val/bpb (text LM) or val/acc.
    Runs whose objectives give different metrics (accuracy vs bits per byte) are refused, never mixed."""
    if metric is not None:
        missing = [str(j) for j, s in runs if s.metric(metric) is None and metric not in s.metrics]
        if len(missing) == len(runs):
            raise ConfigError(f"--metric {metric!r}: no run recorded it; the runs' metrics are "
                              f"{', '.join(sorted(runs[0][1].metrics))}")
        return metric
    by_run = {}
    for job, s in runs:
        m = (s.endpoint or {}).get("metric") if (s.endpoint or {}).get("threshold") is not None else None
        by_run.setdefault(m or ("val/bpb" if "val/bpb" in s.metrics else "val/acc"), []).append(job)
    if len(by_run) > 1:
        parts = "; ".join(f"{m}: {len(jobs)} runs, e.g. {jobs[0]}" for m, jobs in by_run.items())
        raise ConfigError(f"these runs are measured in different metrics ({parts}); report them separately or give "
                          "--metric")
    return next(iter(by_run))


def design(s: RunSummary) -> dict[str, Any]:
    """The resolved sizes and training budget of a run (from what it recorded, never re-derived)."""
    m, a = s.architecture.get("model", {}), s.architecture.get("attention", {})
    cfg = s.config
    data, trainer, optim = cfg.get("data", {}) or {}, cfg.get("trainer", {}) or {}, cfg.get("optim", {}) or {}
    n_train = DataConfig(**data).train_examples if data else None  # the task says, where its settings fix it
    steps, batch = s.timings.get("train_steps"), data.get("batch_size")
    return {"n_heads": a.get("n_heads"), "n_kv_heads": a.get("n_kv_heads"), "d_head": a.get("d_head"),
            "d_model": m.get("d_model"), "d_ff": m.get("d_ff"), "n_layers": m.get("n_layers"),
            "batch_size": batch, "max_steps": trainer.get("max_steps"), "val_every": trainer.get("val_check_interval"),
            "n_train": n_train, "passes": (trainer.get("max_steps") * batch / n_train
                                           if n_train and batch and (trainer.get("max_steps") or -1) > 0 else None),
            "lr": optim.get("lr"), "steps_run": steps, **{c: s.cost.get(c) for c in COST}}


def better(metric: str):
    """A key that sorts values best first."""
    return (lambda v: v) if lower_is_better(metric) else (lambda v: -v)
