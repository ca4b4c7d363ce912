"""The sample sizes The Consensus Trap's published numbers imply (report_sample_size.py): checked against
a brute force over every k of n with exact fractions, and on the shipped experiment files."""
import tomllib
from fractions import Fraction
from pathlib import Path

import pytest

from byzantium.experiments.report_sample_size import fits, implied_sizes, sample_size_table, smallest_n
from byzantium.sweep.config import _published

CONFIGS = Path(__file__).resolve().parents[1] / "byzantium" / "experiments" / "configs"


def brute(value, n):
    """Some k in 0..n prints as `value` at one decimal (exact arithmetic, halves either way)."""
    target = Fraction(str(value))
    return any(abs(Fraction(100 * k, n) - target) <= Fraction(1, 20) for k in range(n + 1))


@pytest.mark.parametrize("value", [0.0, 99.4, 97.2, 33.3, 50.0, 12.5, 100.0, 0.8])
def test_fits_agrees_with_the_brute_force(value):
    for n in range(1, 300):
        assert fits(value, n) == brute(value, n), (value, n)


def test_the_issues_examples():
    assert not fits(99.4, 128)  # 127/128 = 99.22 %, 128/128 = 100 %
    assert fits(97.2, 108) and not fits(97.2, 128)  # 105/108 = 97.22 %; 124/128 = 96.9 %, 125/128 = 97.7 %
    assert smallest_n([50.0]) == 2 and smallest_n([33.3, 66.7]) == 3
    with pytest.raises(ValueError, match="no published values"):
        smallest_n([])


def published(name):
    data = tomllib.loads((CONFIGS / name).read_text())

    def fail(where, what):
        raise ValueError(f"{where}: {what}")
    return _published(data.get("published", []), fail)


def test_the_shipped_tables():
    rows = {(r["table"], r["average"], r["task"]): r for r in
            implied_sizes(published("ct_table1.toml") + published("ct_table2.toml") + published("ct_table6_8.toml"))}
    gsm8k = rows[("Table 2", False, "gsm8k")]
    assert 99.4 in gsm8k["misfits"] and gsm8k["n"] > 128
    for table in ("Table 6", "Table 7", "Table 8"):  # averages, all multiples of 1/108
        r = rows[(table, True, None)]
        assert r["n"] is not None and 108 % r["n"] == 0 and r["misfits"]
    assert rows[("Table 1", False, "logic3")]["n"] <= 128 and not rows[("Table 1", False, "logic3")]["misfits"]


def test_the_report_table_reads_the_sweeps():
    sweep = {"paper": "consensus-trap", "published": published("ct_table6_8.toml")}
    table = sample_size_table([sweep])
    assert [r[0] for r in table.rows] == ["Table 6", "Table 7", "Table 8"]
    assert all(r[4].startswith("no:") for r in table.rows)
    assert sample_size_table([{"paper": "sac", "published": sweep["published"]}]) is None
