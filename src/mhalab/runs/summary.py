"""The run contract: `summary.json`, written by `mhalab.training.train` and read back by report, ablate, convert
and plots.

One dataclass, `RunSummary`, with a `schema_version`; `write_summary` and `read_summary` are the only code that
touches the file. Paths inside it are relative to the run directory, so a copied run directory is self-contained.
Per-head results are (n_layers, n_heads) matrices (nested lists; `head_matrix` turns them back into tensors).

`read_summary` trusts nothing: the file size and nesting depth are bounded, every field is validated against
`RunSummary`'s own annotations (pydantic, strict: no coercion), then the bounds and paths the annotations cannot
say are checked; a bad file is one `ConfigError` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from typing_extensions import TypedDict

from mhalab.atomic import write_atomic
from mhalab.errors import ConfigError

SCHEMA_VERSION = 1
SUMMARY = "summary.json"
STATUSES = ("ok", "failed", "interrupted")
ENVIRONMENT = ("torch", "python", "machine", "processor", "device", "cpu_count", "torch_threads", "interop_threads",
               "cpu_capability", "aten_cpu_capability", "onednn_max_cpu_isa", "mkldnn", "blas", "lapack",
               "omp_num_threads", "precision")
#   the keys of a run's environment its published row carries (runs.csv's env_* columns: report and ablate)
ENV_COLUMNS = tuple(f"env_{k}" for k in ENVIRONMENT)


def env_row(environment: dict | None) -> dict:
    """A run's environment as runs.csv's env_* columns (a key it lacks: None)."""
    return {f"env_{k}": (environment or {}).get(k) for k in ENVIRONMENT}


VECTOR_ISA = (("avx512", "avx512f"), ("avx2", "avx2"), ("avx", "avx"), ("sse4.2", "sse4_2"), ("neon", "asimd"))
#   (name, /proc/cpuinfo flag), widest first: the vector instructions cpu_name reports


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU as /proc/cpuinfo names it: its model name, then its family and model numbers and the widest vector
    instructions it declares, e.g. "AMD EPYC (family 25 model 17, avx512)": a VM's bare model name hides which CPU
    runs (Zen 3 and Zen 4 both say "AMD EPYC"), and oneDNN chooses its kernels from the CPU itself, whatever
    ATEN_CPU_CAPABILITY caps (experiments/determinism). The environment's `processor`, and the machine line of every
    benchmark; without /proc/cpuinfo, platform.processor()."""
    try:
        info = dict(line.split(":", 1) for line in cpuinfo.read_text().split("\n\n")[0].splitlines()
                    if ":" in line)
    except OSError:
        return platform.processor()
    info = {k.strip(): v.strip() for k, v in info.items()}
    flags = set(info.get("flags", "").split())
    isa = next((name for name, flag in VECTOR_ISA if flag in flags), None)
    kind = ", ".join(x for x in (f"family {info['cpu family']} model {info['model']}"
                                 if "cpu family" in info and "model" in info else None, isa) if x)
    name = info.get("model name") or platform.processor()
    return f"{name} ({kind})" if kind else name


def machine(environment: dict) -> str:
    """What a run's numerics ran on, from its environment (a summary's, or runs.csv's env_* columns without the
    prefix): its GPU where it had one (device), else its CPU (processor, as cpu_name names this one, so the two
    compare)."""
    device = environment.get("device")
    return str(device if device not in (None, "", "cpu") else environment.get("processor"))


MAX_BYTES = 64 * 2**20  # a summary of a 1000-layer x 1000-head model is far below this
MAX_DEPTH = 12
MAX_HEADS = 1 << 16  # layers x heads of a per-head matrix
MAX_LIST = 10_000  # overrides, plots, errors


Number = Optional[float]  # None where the value was NaN or infinite (JSON has neither)


class Endpoint(TypedDict, total=False):
    """A run's endpoint: `mhalab.config.schema.EndpointConfig` as set, and where the run reached the threshold."""

    __pydantic_config__ = {"extra": "forbid"}  # type: ignore[misc]  # an unknown key is an error, not dropped
    metric: str
    threshold: Number
    stop_at_threshold: bool
    tuned: list[str]
    margin: Number
    selection_seeds: list[int]
    threshold_step: Optional[int]
    stopped_early: bool


@dataclass
class RunSummary:
    """Everything a finished, failed or interrupted run leaves for the tools that read it."""

    status: str  # ok | failed | interrupted
    task: str = ""
    objective: str = ""
    overrides: list[str] = field(default_factory=list)  # the command line's config overrides
    config: dict[str, Any] = field(default_factory=dict)  # the composed config, resolved
    architecture: dict[str, Any] = field(default_factory=dict)  # mhalab.architecture.Architecture.to_dict()
    label_names: Optional[list[str]] = None  # classification: the name of each class id
    metrics: dict[str, Number] = field(default_factory=dict)  # train/*, val/* at the end of training
    test_metrics: dict[str, Number] = field(default_factory=dict)  # test/* of the best checkpoint
    cost: dict[str, Number] = field(default_factory=dict)  # params, flops_per_token, kv_cache_bytes_per_token ...
    baselines: dict[str, Number] = field(default_factory=dict)  # the task's reference levels: chance_acc ...
    timings: dict[str, Number] = field(default_factory=dict)  # fit_s, test_s, total_s, train_steps, tokens_seen ...
    checkpoints: dict[str, Optional[str]] = field(default_factory=dict)  # best, last: relative to the run directory
    head_stats: dict[str, list[list[Number]]] = field(default_factory=dict)  # stat -> (n_layers, n_heads)
    head_importance: Optional[list[list[Number]]] = None  # (n_layers, n_heads), normalised per layer
    kv_groups: dict[str, list[Number]] = field(default_factory=dict)  # within/between_group_jsd -> (n_layers,)
    history: dict[str, list[Number]] = field(default_factory=dict)  # step and val/* of every validation in training
    endpoint: Endpoint = field(default_factory=dict)  # mhalab.config.schema.EndpointConfig, and what the run reached
    plots: list[str] = field(default_factory=list)  # relative to the run directory
    environment: dict[str, Any] = field(default_factory=dict)  # torch, python, machine, device ...
    error: Optional[dict[str, str]] = None  # failed / interrupted: {"kind", "message"}
    extras_errors: list[str] = field(default_factory=list)  # end-of-training extras that failed (run kept)
    schema_version: int = SCHEMA_VERSION

    def path(self, run_dir: str | Path, rel: str | None) -> Path | None:
        """A path stored in this summary, inside `run_dir` (None stays None)."""
        return None if rel is None else Path(run_dir) / rel

    def non_finite(self) -> list[str]:
        """The val/ and test/ metrics that were NaN or infinite (null in the file): a run with one has not
        finished well, whatever its status says."""
        return sorted(k for k, v in {**self.metrics, **self.test_metrics}.items()
                      if k.startswith(("val/", "test/")) and (v is None or not math.isfinite(v)))

    def metric(self, key: str) -> float | None:
        """A val/train metric or a test metric by name."""
        return self.metrics.get(key, self.test_metrics.get(key))


def write_summary(run_dir: str | Path, summary: RunSummary) -> Path:
    """Write <run_dir>/summary.json atomically (temporary file, fsync, rename): a reader never sees half a file."""
    path = Path(run_dir) / SUMMARY
    data = _finite(dataclasses.asdict(summary))
    return write_atomic(path, json.dumps(data, indent=2, allow_nan=False))


def read_summary(run_dir: str | Path) -> RunSummary:
    """<run_dir>/summary.json, checked against RunSummary; ConfigError naming the file and field if it is not one."""
    path = Path(run_dir) / SUMMARY
    if not path.exists():
        raise ConfigError(f"{path} does not exist: give the directory of a run written by mhalab.training.train")
    if not path.is_file() or path.is_symlink():
        raise ConfigError(f"{path} is not a regular file (a link or a device); refusing to read it")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ConfigError(f"{path} is {size} bytes, more than a summary can be ({MAX_BYTES}); refusing to read it")
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)  # bounded even if the file grows or is a device
    try:  # NaN and Infinity, which mhalab never writes (it writes null), are read as null too
        data = json.loads(raw.decode("utf-8"), parse_constant=lambda _: None)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ConfigError(f"{path} is not valid UTF-8 JSON ({type(e).__name__})") from None
    return from_dict(data, str(path))


def from_dict(data: Any, where: str = SUMMARY) -> RunSummary:
    """A RunSummary from parsed JSON, every field type-checked."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a JSON object, got {type(data).__name__}")
    _check_depth(data, where)
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ConfigError(f"{where} has schema_version={version!r}; this mhalab reads version {SCHEMA_VERSION}")
    known = {f.name for f in dataclasses.fields(RunSummary)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where} has an unknown field {unknown[0]!r}")
    if data.get("status") not in STATUSES:
        raise ConfigError(f"{where}: status={data.get('status')!r} must be one of {', '.join(STATUSES)}")
    summary = _validated(data, where)
    _check_bounds(summary, where)
    return summary


@functools.lru_cache(maxsize=1)
def _adapter():
    """pydantic's validator of RunSummary, built once per process (2 ms a build; `mhalab report` reads hundreds)."""
    from pydantic import TypeAdapter

    return TypeAdapter(RunSummary)


def _validated(data: dict, where: str) -> RunSummary:
    """RunSummary from its own annotations (pydantic, strict: a string is never a number, a bool never a float)."""
    from pydantic import ValidationError

    try:  # JSON mode: a JSON object is a dataclass's input, and strict keeps every type as written
        return _adapter().validate_json(json.dumps(data), strict=True)
    except ValidationError as e:
        first = e.errors()[0]
        at = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{where}: field {str(first['loc'][0])!r} does not have the type of a run summary ({at}: "
                          f"{first['msg']}; see mhalab.runs.summary)") from None


def _check_bounds(s: RunSummary, where: str) -> None:
    """What the annotations cannot say: bounded lists, rectangular per-head matrices, paths inside the run."""
    lists = {"overrides": s.overrides, "plots": s.plots, "extras_errors": s.extras_errors}
    checks = [(name, len(v) <= MAX_LIST and all(len(x) <= 4096 for x in v)) for name, v in lists.items()]
    seed = s.config.get("seed", 0)  # names files of `mhalab convert` (seed<n>-...)
    checks += [("config", isinstance(seed, int) and not isinstance(seed, bool)),
               ("plots", not any(_escapes(v) for v in s.plots)),
               ("checkpoints", not any(v is not None and _escapes(v) for v in s.checkpoints.values())),
               ("head_stats", all(_matrix(v) for v in s.head_stats.values()) and  # names name files (plots)
                not any(c in k for k in s.head_stats for c in "/\\\0") and "" not in s.head_stats),
               ("head_importance", s.head_importance is None or _matrix(s.head_importance)),
               ("kv_groups", all(len(v) <= MAX_HEADS for v in s.kv_groups.values())),
               ("history", all(len(v) <= MAX_HEADS for v in s.history.values()) and
                len({len(v) for v in s.history.values()}) <= 1)]
    for name, ok in checks:
        if not ok:
            raise ConfigError(f"{where}: field {name!r} does not have the shape of a run summary (see "
                              "mhalab.runs.summary)")


def _matrix(v: list[list]) -> bool:
    """A rectangular, non-empty (n_layers, n_heads) matrix of bounded size."""
    width = len(v[0]) if v else 0
    return width > 0 and len(v) * width <= MAX_HEADS and all(len(r) == width for r in v)


def _escapes(rel: str) -> bool:
    """A stored path that is absolute or climbs out of the run directory."""
    return os.path.isabs(rel) or ".." in Path(rel).parts


def _check_depth(x: Any, where: str, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise ConfigError(f"{where} nests deeper than {MAX_DEPTH} levels; a run summary does not")
    if isinstance(x, dict):
        for v in x.values():
            _check_depth(v, where, depth + 1)
    elif isinstance(x, list):
        for v in x:
            _check_depth(v, where, depth + 1)


def json_text(data: Any) -> str:
    """Data as strict JSON text (indented): NaN and inf become null (`_finite`), never bare NaN or Infinity."""
    return json.dumps(_finite(data), indent=2, allow_nan=False, default=str)


def _finite(x: Any) -> Any:
    """NaN and inf become None (JSON has no NaN); tensors and numpy scalars become numbers; paths strings."""
    if hasattr(x, "tolist") and not isinstance(x, (list, dict)):
        x = x.tolist()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x


def head_matrix(rows: list[list[float]] | None):
    """A per-head matrix of a summary as a float32 tensor (n_layers, n_heads), None values as nan."""
    import torch

    if rows is None:
        return None
    return torch.tensor([[float("nan") if v is None else v for v in r] for r in rows], dtype=torch.float32)
