"""Paired comparisons over seeds (the claims' differences with their intervals) and the alternation row with as
many updates per network as 'sim'."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from coclr.config import from_dict, load_config
from coclr.study.config import StudyConfig
from coclr.study.plan import plan_study
from coclr.study.results import PAIRS, claims, paired_differences, seeds_markdown, summarise_seeds, t_quantile_975
from coclr.train.config import PipelineConfig
from coclr.train.pipeline import plan_stages


def t_cdf(t: float, dof: int, steps: int = 20000) -> float:
    """Student's t CDF by Simpson's rule on its density from 0 to t (symmetric around 0)."""
    def density(x: float) -> float:
        return (math.gamma((dof + 1) / 2) / (math.sqrt(dof * math.pi) * math.gamma(dof / 2))
                * (1 + x * x / dof) ** (-(dof + 1) / 2))
    h = t / steps
    total = density(0) + density(t) + sum((4 if i % 2 else 2) * density(i * h) for i in range(1, steps))
    return 0.5 + total * h / 3


@pytest.mark.parametrize("dof", [1, 2, 4, 9, 30, 31, 60, 200])
def test_t_quantile_is_the_975th_percentile(dof):
    assert t_cdf(t_quantile_975(dof), dof) == pytest.approx(0.975, abs=2e-5 if dof <= 30 else 1e-4)


def _result(seed: int, values: dict[str, float]) -> dict:
    rows = [{"row": key, "method": key, "view": "RGB", "labels": False, "retrieval": {"R@1": r1},
             "linear_top1": r1 + 10} for key, r1 in values.items()]
    return {"seed": seed, "columns": ["retrieval", "linear"], "rows": rows, "claims": claims(rows, ["retrieval"])}


def test_paired_differences_are_per_seed_with_a_t_interval():
    results = [_result(0, {"coclr_flow": 50.0, "infonce_flow": 48.0, "coclr_rgb": 40.0}),
               _result(1, {"coclr_flow": 61.0, "infonce_flow": 58.0, "coclr_rgb": 45.0}),
               _result(2, {"coclr_flow": 40.0, "infonce_flow": 39.0, "coclr_rgb": 30.0})]
    found = paired_differences(results)
    entry = found["CoCLR-Flow - InfoNCE-Flow (R@1)"]
    assert entry["per_seed"] == [2.0, 3.0, 1.0] and entry["mean"] == pytest.approx(2.0) and entry["seeds"] == 3
    half = 4.303 * 1.0 / math.sqrt(3)  # sample std of (2, 3, 1) is 1
    assert entry["interval"] == pytest.approx((2.0 - half, 2.0 + half))
    assert found["CoCLR-Flow - InfoNCE-Flow (linear probe)"]["per_seed"] == [2.0, 3.0, 1.0]
    # Only comparisons whose two rows every seed evaluated.
    assert all(name.startswith("CoCLR-Flow - InfoNCE-Flow") for name in found)
    # The unpaired spreads overlap widely; the paired interval excludes 0.
    summary = summarise_seeds(results)
    assert summary["paired"] == found
    text = seeds_markdown(summary)
    assert "- CoCLR-Flow - InfoNCE-Flow (R@1): +2.0 [-0.5, +4.5] (+2.0, +3.0, +1.0)" in text


def test_a_row_missing_on_one_seed_gives_no_pair_and_one_seed_no_interval():
    both = [_result(0, {"coclr_flow": 50.0, "infonce_flow": 48.0}), _result(1, {"coclr_flow": 50.0})]
    assert paired_differences(both) == {}
    one = paired_differences([_result(0, {"coclr_flow": 50.0, "infonce_flow": 48.0})])
    assert one["CoCLR-Flow - InfoNCE-Flow (R@1)"]["interval"] is None
    single = seeds_markdown(summarise_seeds([_result(0, {"coclr_flow": 5.0, "infonce_flow": 4.0})]))
    assert "no interval (one seed)" in single
    # one seed has no spread: it read "5.0 ± 0.0", a standard deviation of nothing
    assert "±" not in single and "The one seed's figures (no spread)" in single


def test_every_pair_names_rows_of_the_table():
    from coclr.study.config import ROWS

    assert all(a in ROWS and b in ROWS for _, a, b in PAIRS)


def test_equal_updates_alternates_with_as_many_updates_per_network_as_sim(tmp_path: Path):
    config = load_config(StudyConfig, overrides=["rows=[infonce_rgb,coclr_sim_rgb,coclr_equal_rgb]"])
    plan = plan_study(config, tmp_path / "out")
    sim = plan_stages(from_dict(PipelineConfig, plan.configs["coclr_sim"]))
    equal = plan_stages(from_dict(PipelineConfig, plan.configs["coclr_equal"]))
    last = f"cycle{config.schedule.cycles}"
    for view in ("rgb", "flow"):
        sim_stages = [s for s in sim if s.method == "coclr" and view in s.trains]
        equal_stages = [s for s in equal if s.method == "coclr" and view in s.trains]
        assert [s.epochs for s in equal_stages] == [s.epochs for s in sim_stages]
        assert [s.milestones for s in equal_stages] == [s.milestones for s in sim_stages]
        assert all(s.trains == [view] for s in equal_stages)  # alternating: one network at a time
    # Nothing else differs from the main pipeline: its InfoNCE stages are shared.
    main, equal_options = plan.configs["pipeline"], plan.configs["coclr_equal"]
    assert equal_options["pipeline"]["infonce_from"] == str(tmp_path / "out" / "pipeline")
    assert {k: v for k, v in equal_options["pipeline"].items() if k not in ("cycle_epochs", "cycle_milestones",
                                                                          "infonce_from")} == {
        k: v for k, v in main["pipeline"].items() if k not in ("cycle_epochs", "cycle_milestones")}
    assert equal_options["method"] == main["method"] and equal_options["optim"] == main["optim"]
    assert plan.encoders["coclr_equal_rgb"] == tmp_path / "out" / "coclr_equal" / f"{last}_rgb" / "encoder_rgb.pth"


def test_the_equal_updates_claim_compares_it_with_sim():
    rows = [{"row": key, "retrieval": {"R@1": r1}}
            for key, r1 in (("coclr_equal_rgb", 50.0), ("coclr_sim_rgb", 51.0), ("coclr_rgb", 52.0))]
    found = claims(rows, ["retrieval"])
    assert found["CoCLR-RGB alternating with equal updates >= sim (R@1)"] is False
    assert found["CoCLR-RGB alternating >= sim (R@1)"] is True


def test_the_miners_of_coclr_flow_are_paired_and_plotted_against_their_precision(tmp_path: Path):
    """Issue 48: each flow row's gain over InfoNCE-Flow against its mined positives' class precision, one point
    per (seed, row); the miners' comparisons are paired like the claims'."""
    from coclr.study.results import MINING_PLOT, mining_points, plot_mining

    def result(seed: int, r1: dict[str, float], precision: dict[str, float]) -> dict:
        rows = [{"row": key, "method": key, "view": "RGB" if key.endswith("rgb") else "Flow", "labels": False,
                 "retrieval": {"R@1": value}, **({"mined_precision": precision[key]} if key in precision else {})}
                for key, value in r1.items()]
        return {"seed": seed, "columns": ["retrieval"], "rows": rows, "claims": {}}

    results = [result(seed, {"infonce_flow": 50.0 + seed, "coclr_flow": 48.0 + 2 * seed, "coclr_rgb": 40.0,
                             "coclr_ubernce_miner_flow": 60.0, "coclr_infonce_miner_flow": 45.0},
                      {"coclr_flow": 35.0 + seed, "coclr_rgb": 50.0, "coclr_ubernce_miner_flow": 80.0,
                       "coclr_infonce_miner_flow": 30.0}) for seed in (0, 1)]
    points = mining_points(results)
    assert [(p["seed"], p["row"], p["mined_precision"], p["gain"]) for p in points] == [
        (0, "coclr_flow", 35.0, -2.0), (0, "coclr_ubernce_miner_flow", 80.0, 10.0),
        (0, "coclr_infonce_miner_flow", 30.0, -5.0), (1, "coclr_flow", 36.0, -1.0),
        (1, "coclr_ubernce_miner_flow", 80.0, 9.0), (1, "coclr_infonce_miner_flow", 30.0, -6.0)]  # no RGB row
    summary = summarise_seeds(results)
    assert summary["mining"] == points
    paired = summary["paired"]
    assert paired["CoCLR-Flow mined by UberNCE-RGB - InfoNCE-Flow (R@1)"]["per_seed"] == [10.0, 9.0]
    assert paired["CoCLR-Flow mined by UberNCE-RGB - CoCLR-Flow (R@1)"]["per_seed"] == [12.0, 10.0]
    assert paired["CoCLR-Flow - CoCLR-Flow mined by InfoNCE-RGB (frozen) (R@1)"]["per_seed"] == [3.0, 5.0]
    text = seeds_markdown(summary)
    assert "- coclr_flow (Flow): 35.5 ± 0.7" in text and MINING_PLOT in text
    assert plot_mining(points, tmp_path / MINING_PLOT).stat().st_size > 1000
    # Without InfoNCE-Flow there is nothing to measure the gain against.
    assert mining_points([result(0, {"coclr_flow": 48.0}, {"coclr_flow": 35.0})]) == []


def test_the_flow_claim_says_what_it_rests_on():
    """Issue 48 (confirmed): the line of "CoCLR-Flow > InfoNCE-Flow" in results.md and seeds.md names the class
    precision of RGB's mining for flow; no other claim line changes, nor any claim's key or verdict."""
    from coclr.study.results import CLAIM_NOTES, results_markdown

    results = [_result(seed, {"coclr_flow": 50.0 + 2 * seed, "infonce_flow": 51.0, "infonce_rgb": 30.0})
               for seed in (0, 1)]
    assert results[0]["claims"] == {"InfoNCE-Flow > InfoNCE-RGB (R@1)": True, "CoCLR-Flow > InfoNCE-Flow (R@1)": False}
    note = CLAIM_NOTES["CoCLR-Flow > InfoNCE-Flow"]
    assert "class precision" in note and "RGB mines" in note
    first = results[0]
    page = results_markdown(first["rows"], ["retrieval"], first["claims"], 60.0, 0)
    assert f"- CoCLR-Flow > InfoNCE-Flow (R@1): no — {note}\n" in page
    assert "- InfoNCE-Flow > InfoNCE-RGB (R@1): yes\n" in page
    text = seeds_markdown(summarise_seeds(results))
    assert f"- CoCLR-Flow > InfoNCE-Flow (R@1): 1 of 2 seeds; on the means: no — {note}\n" in text
    assert "- InfoNCE-Flow > InfoNCE-RGB (R@1): 2 of 2 seeds; on the means: yes\n" in text


def test_mined_precision_is_paired_where_both_rows_record_it():
    results = []
    for seed, (both, today) in enumerate(((60.0, 40.0), (55.0, 50.0), (70.0, 45.0))):
        result = _result(seed, {"coclr_both_flow": 50.0, "coclr_flow": 48.0, "infonce_flow": 40.0})
        for row in result["rows"]:
            row["mined_precision"] = {"coclr_both_flow": both, "coclr_flow": today}.get(row["row"])
        results.append(result)
    found = paired_differences(results)
    assert found["CoCLR-Flow mined in both views - CoCLR-Flow (mined precision)"]["per_seed"] == [20.0, 5.0, 25.0]
    assert "CoCLR-Flow mined in both views - InfoNCE-Flow (mined precision)" not in found  # InfoNCE mines nothing
    assert found["CoCLR-Flow mined in both views - InfoNCE-Flow (R@1)"]["mean"] == pytest.approx(10.0)
