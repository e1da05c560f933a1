"""Does a bf16-mixed job on the CPU repeat bit for bit? The same tiny masked-LM job (tests/runs/test_resume.py's,
`trainer=gpu trainer.accelerator=cpu`) run N times in fresh processes with `trainer.deterministic` false (the
recipe's setting: SDPA picks torch's CPU flash kernel) and true (`mhalab.attention.sdpa_backends` names the math
backend), and in float32 (the default precision, where the flash kernel stays), in alternating rounds; oneDNN's
verbose log gives the sequence of its kernel calls in each run (float32's matrix products go to MKL, which that log
does not show). Prints, per setting, how many distinct results (every metric of summary.json) and distinct oneDNN
call sequences the runs gave.

    python scripts/measure_bf16_repeats.py 20
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "runs")]
from conftest import TINY  # noqa: E402  (the suite's tiny model)
from test_resume import RUN  # noqa: E402  (the resume test's job: three short epochs with checkpoints)

JOB = [*TINY, *RUN, "trainer=gpu", "trainer.accelerator=cpu"]
SETTINGS = {"bf16, deterministic=false (flash kernel)": ["trainer.deterministic=false"],
            "bf16, deterministic=true (math backend)": ["trainer.deterministic=true"],
            "float32, deterministic=true (the default; flash kernel)": ["trainer.precision=32-true",
                                                                      "trainer.deterministic=true"]}


def run_once(overrides: list[str], root: Path, cache: Path) -> tuple[str, tuple[int, str]]:
    """(a digest of the run's metrics, (the number of oneDNN kernel calls, a digest of their sequence))."""
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "WANDB_SILENT": "true"}
    env.pop("MHALAB_RUN_ID", None)
    job = subprocess.run([sys.executable, "-m", "mhalab.training.train", *JOB, *overrides, f"paths.root_dir={root}",
                          f"data.cache_dir={cache}"], env=env, capture_output=True, text=True)
    if job.returncode != 0:
        raise SystemExit(f"the job with {overrides} failed (exit {job.returncode}):\n{job.stderr[-3000:]}")
    out = job.stdout
    calls = [",".join(line.split(",")[4:12]) for line in out.splitlines()
             if line.startswith("onednn_verbose,v1,primitive,exec")]  # kind, kernel, layouts, shapes; not the time
    (summary,) = root.glob("logs/**/summary.json")
    s = json.loads(summary.read_text())
    metrics = {k: s[k] for k in ("metrics", "test_metrics", "head_stats", "head_importance")}
    return _digest(json.dumps(metrics, sort_keys=True)), (len(calls), _digest("\n".join(calls)))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def main(n: int) -> None:
    import torch

    from mhalab.bench.output import machine_line
    from mhalab.bench.timing import loadavg, machine_info

    machine = machine_info(torch.device("cpu"))
    seen = {name: ([], []) for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        for i in range(n):  # alternating rounds: one run of each setting per round
            for k, (name, overrides) in enumerate(SETTINGS.items()):
                result, calls = run_once(overrides, Path(tmp) / f"round{i}-setting{k}", cache)
                seen[name][0].append(result)
                seen[name][1].append(calls)
            print(f"round {i + 1}/{n} done", file=sys.stderr, flush=True)
    print(f"{n} runs per setting; " + machine_line({**machine, "loadavg_end": loadavg()}))
    for name, (results, calls) in seen.items():
        counts = sorted(Counter(results).values(), reverse=True)
        n_calls = sorted(count for count, _ in calls)
        print(f"{name}: {len(counts)} distinct result(s) {counts}, {len(set(calls))} distinct sequence(s) of "
              f"{n_calls[0]}-{n_calls[-1]} oneDNN kernel calls a run")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
