"""The method table is the one place a method is named: the configuration, the report and the study ask it."""

from __future__ import annotations

import pytest

from coclr.config import from_dict
from coclr.core.methods import CONTRASTIVE, METHODS, display_name, find_method, methods_help
from coclr.errors import ConfigError
from coclr.eval.report import describe_encoders
from coclr.study.config import ROWS, supervised_row
from coclr.train.config import MethodOptions


def test_cross_entropy_is_a_row_of_the_table_but_not_a_pretraining_method() -> None:
    row = METHODS["cross_entropy"]
    assert row.uses_labels and not row.contrastive and row.display == "Cross-Ent."
    assert "cross_entropy" not in CONTRASTIVE and set(CONTRASTIVE) == {"infonce", "ubernce", "coclr", "cmc"}
    with pytest.raises(ConfigError, match="cross_entropy"):
        from_dict(MethodOptions, {"name": "cross_entropy"})
    assert find_method("supervised") is row  # older records' name for it
    assert find_method("random") is None and display_name("random") == "random"


def test_help_text_names_every_pretraining_method() -> None:
    text = methods_help()
    for name, spec in CONTRASTIVE.items():
        assert f"{name} ({spec.summary})" in text
    assert "cross_entropy" not in text
    assert MethodOptions.__dataclass_fields__["name"].metadata["help"] == text


def test_report_labels_and_names_come_from_the_table() -> None:
    def record(*methods: str) -> dict:
        return {"streams": [{"view": "rgb", "checkpoint": f"/x/{m}.pth", "meta": {"method": m}} for m in methods]}

    for name, spec in METHODS.items():
        cells = describe_encoders(record(name))
        assert cells["Method"] == spec.display
        assert cells["Labels"] == ("✓" if spec.uses_labels else "✗")
    assert describe_encoders(record("supervised"))["Labels"] == "✓"
    assert describe_encoders(record("random"))["Method"] == "random"


def test_study_rows_follow_the_table() -> None:
    for key, row in ROWS.items():
        spec = METHODS[row.method_name]
        miner_labels = bool(row.miner) and ROWS[row.miner].labels  # mined by an encoder trained with labels
        assert row.method.startswith(spec.display) and row.labels == (spec.uses_labels or miner_labels)
        assert key.startswith(row.method_name)
        assert supervised_row(key) == (not spec.contrastive)
    assert [key for key in ROWS if supervised_row(key)] == ["cross_entropy_rgb"]
    assert ROWS["coclr_two_stream"].streams == (("coclr_rgb", "rgb"), ("coclr_flow", "flow"))
    assert ROWS["coclr_k1_rgb"].method == "CoCLR K=1" and ROWS["cmc_rgb"].labels is False

