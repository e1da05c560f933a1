"""mhalab convert's negative controls (issue 27): with a margin, random and first-head KV inits before uptraining
must fail the same equivalence test as mean-pool, and a margin they pass is reported as unable to fail."""

from mhalab.analysis.convert import summarise


def rows(broken: float) -> list[dict]:
    """Ten sources: mean-pool uptrained within 0.001 of the MHA control; random / first inits `broken` below the
    source before uptraining."""
    out = []
    for s in range(10):
        jitter = 0.0005 * (s % 3 - 1)
        for arm, init, stage, acc in (("source (MHA)", "-", "trained", 0.99),
                                      ("source (MHA) + extra steps", "-", "same total steps", 0.99 + jitter),
                                      ("converted GQA-2", "mean", "after uptraining", 0.99 - jitter),
                                      ("converted GQA-2", "random", "before uptraining", 0.99 - broken + jitter),
                                      ("converted GQA-2", "first", "before uptraining", 0.99 - broken / 2 - jitter)):
            out.append({"arm": arm, "init": init, "stage": stage, "seed": s, "acc": acc, "total_steps": 1,
                        "params": 1})
    return out


def controls(comparisons: list[dict]) -> dict:
    return {c["comparison"].split(" init")[0]: c for c in comparisons if "negative control" in c["comparison"]}


def test_a_broken_init_fails_equivalence_as_it_must():
    _, comps = summarise(rows(broken=0.5), "acc", margin=0.02)
    neg = controls(comps)
    assert set(neg) == {"random", "first"}
    for c in neg.values():
        assert c["tost_p"] >= 0.05 and c["verdict"] == "negative control fails equivalence, as it must"
        assert c.get("p_holm") is None  # outside the Holm family of the claims
    main = next(c for c in comps if "MHA control" in c["comparison"])
    assert main["equivalence"].startswith("equivalent within ±0.02")


def test_a_margin_the_controls_pass_is_reported_as_unable_to_fail():
    _, comps = summarise(rows(broken=0.01), "acc", margin=0.02)  # the margin is wider than the damage
    neg = controls(comps)
    assert neg["random"]["tost_p"] < 0.05
    assert neg["random"]["verdict"] == "negative control PASSED equivalence: the margin cannot fail"


def test_no_margin_no_negative_controls():
    _, comps = summarise(rows(broken=0.5), "acc", margin=None)
    assert not controls(comps)


def test_conversions_under_two_numerics_are_judged_by_report_numerics(tmp_path):
    """conversion.json's comparisons carry `mhalab report`'s arm, baseline, endpoint and estimate, and runs.csv
    sits beside it: `mhalab report --numerics` reads two of them. The equivalence of mean-pool and the MHA control
    is part of the verdict: the same difference test with equivalence shown under one numerics only flips."""
    import csv
    import json

    from mhalab.report import numerics
    from mhalab.runs.summary import ENV_COLUMNS

    def conversion(name: str, spread: float) -> str:
        out = tmp_path / name
        out.mkdir()
        data = rows(broken=0.5)
        for r in data:  # mean-pool moves `spread` from the control, up on odd sources, down on even ones
            if r["init"] == "mean":
                r["acc"] += spread * (1 if r["seed"] % 2 else -1)
        _, comps = summarise(data, "acc", margin=0.02)
        (out / "conversion.json").write_text(json.dumps({"comparisons": comps}))
        with open(out / "runs.csv", "w", newline="") as f:
            w = csv.DictWriter(f, ["seed", "in_verdicts", *ENV_COLUMNS])
            w.writeheader()
            w.writerows({"seed": s, "in_verdicts": True, "env_cpu_capability": name} for s in range(10))
        return f"{name}:{out / 'conversion.json'}"

    result = numerics.stability([conversion("AVX512", 0.0), conversion("AVX2", 0.1)])
    by = {(r["arm"], r["baseline"]): r for r in result["rows"]}
    main = by[("mean-pool", "MHA control (same total steps)")]
    assert main["endpoint"] == "acc, paired by source" and main["stable"] is False
    assert main["AVX512/verdict"] == "not separated; equivalent within ±0.02"
    assert main["AVX2/verdict"] == "not separated; not shown equivalent within ±0.02"
    control = by[("random init", "source (before uptraining; negative control)")]
    assert control["stable"] is True and control["verdict"] == "not shown equivalent within ±0.02"
    assert result["environment"]["AVX2"]["cpu_capability"] == "AVX2"
