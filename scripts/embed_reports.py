"""Copy each experiment's generated tables into its README and the experiments table into experiments/README.md,
so no README states a design or a result that did not run.

    python scripts/embed_reports.py          # rewrite the generated blocks
    python scripts/embed_reports.py --check  # exit 1 if any block differs (tests/docs/test_readme_tables.py)

An experiment README marks each block with `<!-- generated from <file>.md -->` ... `<!-- end generated -->` (a path
beside the README): from `mhalab report`'s `report.md` (a report.json beside it) it receives the report's design,
tuning, comparison and head sections; from any other generated file (`mhalab ablate`'s pruning.md, `mhalab
convert`'s conversion.md, `mhalab bench`'s report.md) the whole file below its title. experiments/README.md
marks `<!-- experiments table -->` ... `<!-- end experiments table -->`, filled by
`mhalab report --table experiments/*/results/report.json`, and `<!-- verdicts table -->` ... `<!-- end verdicts
table -->`, filled by `mhalab report --table experiments/**/stability.json` (every design's verdicts under its
numerics).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from mhalab.report.command import experiments_table
from mhalab.report.numerics import verdicts_table

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("## Design (read from the runs)", "## Each arm at each tuned value (validation)",
            "## Comparisons with the baseline", "## Head statistics per arm")
BLOCK = re.compile(r"(<!-- generated from (\S+\.md) -->\n)(.*?)(<!-- end generated -->)", re.S)
TABLE = re.compile(r"(<!-- experiments table -->\n)(.*?)(<!-- end experiments table -->)", re.S)
VERDICTS = re.compile(r"(<!-- verdicts table -->\n)(.*?)(<!-- end verdicts table -->)", re.S)


def sections(report_md: str) -> str:
    """The report's design, tuning, comparison and head sections, headings demoted one level."""
    parts = re.split(r"(?m)^(?=## )", report_md)
    keep = [p for p in parts if p.startswith(SECTIONS)]
    return "".join("#" + p for p in keep).rstrip() + "\n"


def generated(source: Path) -> str:
    """What a block copies from its generated file."""
    text = source.read_text()
    if source.name == "report.md" and source.with_name("report.json").is_file():  # `mhalab report`'s
        return sections(text)
    body = re.sub(r"\A# .*\n+", "", text)  # the file's title: the README has its own
    return re.sub(r"(?m)^(#+ )", r"#\1", body).rstrip() + "\n"


def designs_stability() -> list[Path]:
    """Every experiments/**/stability.json but one whose reports another holds too (gpu/h100's fp32 and bf16 are
    two of kv_sweep64's three numerics): the larger table reads them all."""
    files = sorted(ROOT.glob("experiments/**/stability.json"))  # absolute: the script runs from any folder
    sources = {f: set(json.loads(f.read_text())["sources"]) for f in files}
    return [f for f in files if not any(sources[f] < sources[g] for g in files)]


def expected() -> dict[Path, str]:
    out = {}
    for readme in sorted(ROOT.glob("experiments/*/README.md")):
        text = readme.read_text()
        if BLOCK.search(text):
            out[readme] = BLOCK.sub(lambda m: m.group(1) + generated(readme.parent / m.group(2)) + m.group(4), text)
    files = sorted(ROOT.glob("experiments/*/results/report.json"))
    main = ROOT / "experiments" / "README.md"
    table = experiments_table(files, base=main.parent)  # its links, from beside the experiments
    verdicts = verdicts_table(designs_stability(), base=main.parent)
    text = TABLE.sub(lambda m: m.group(1) + table + "\n" + m.group(3), main.read_text())
    out[main] = VERDICTS.sub(lambda m: m.group(1) + verdicts + "\n" + m.group(3), text)
    return out


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = [p for p, text in expected().items() if p.read_text() != text]
    if check:
        for p in stale:
            print(f"{p.relative_to(ROOT)}: its generated block differs; run python scripts/embed_reports.py")
        return 1 if stale else 0
    for p, text in expected().items():
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
