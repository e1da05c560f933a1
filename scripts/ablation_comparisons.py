"""Give an ablation.json written before `mhalab ablate` published its tests their `comparisons` and a runs.csv, so
`mhalab report --numerics` can read it beside newer ones.

    python scripts/ablation_comparisons.py ABLATION_JSON KEY=VALUE ...

The comparisons come from the file's own pruning table (`mhalab.analysis.ablate.comparisons`: the same figures,
nothing recomputed). The checkpoints' environments were not recorded in such a file: each KEY=VALUE (a key of
`mhalab.runs.summary.ENVIRONMENT`, e.g. cpu_capability=AVX512) is a fact stated elsewhere about the machine that
ran it, written to every row of runs.csv; keys not given are written as unknown ("-").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mhalab.analysis.ablate import comparisons
from mhalab.runs.summary import ENV_COLUMNS, ENVIRONMENT, env_row
from mhalab.tables import write_csv


def main(argv: list[str]) -> None:
    path, facts = Path(argv[0]), dict(a.split("=", 1) for a in argv[1:])
    unknown = set(facts) - set(ENVIRONMENT)
    if unknown:
        sys.exit(f"{', '.join(sorted(unknown))}: not environment keys; give some of {', '.join(ENVIRONMENT)}")
    data = json.loads(path.read_text())
    first = data["results"][0]
    data["comparisons"] = comparisons(data["pruning"], data["key"], first["n_layers"] * first["n_heads"])
    path.write_text(json.dumps(data, indent=2))
    rows = [{"seed": r["seed"], "checkpoint": r["checkpoint"], "in_verdicts": True,
             **env_row({k: facts.get(k, "-") for k in ENVIRONMENT})} for r in data["results"]]
    write_csv(path.parent / "runs.csv", ["seed", "checkpoint", "in_verdicts", *ENV_COLUMNS], rows)
    print(f"{path}: {len(data['comparisons'])} comparisons; {path.parent / 'runs.csv'}: {len(rows)} checkpoints")


if __name__ == "__main__":
    main(sys.argv[1:])
