"""benchmarks/generated_mutants.py's merge of an ``--only`` run into a module's report: the
per-module figures in docs/mutation.md are sums over it, so a merge that drops or double
counts a function's mutants misstates a module's kill share."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from generated_mutants import function_of, merge_groups  # noqa: E402

M = "planner.cost.x"


def _report(tests: list[str], by_function: dict, survivors=(), timed_out=()) -> dict:
    return {
        "tests": tests,
        "by_function": by_function,
        "survivors": {s: {"change": []} for s in survivors},
        "timed_out": list(timed_out),
    }


def test_a_mutant_name_gives_its_function_or_method():
    assert function_of(f"{M}.x__solve__mutmut_12") == "_solve"
    assert function_of(f"{M}.xǁ_TermsǁQ__mutmut_3") == "_Terms.Q"


def test_an_only_run_keeps_the_functions_it_did_not_run_from_a_report_on_fewer_tests():
    earlier = _report(
        ["tests/a.py"],
        {"f": {"killed": 3, "survived": 1}, "g": {"killed": 1, "timeout": 1}},
        survivors=[f"{M}.x_f__mutmut_2"],
        timed_out=[f"{M}.x_g__mutmut_1"],
    )
    run = _report(
        ["tests/a.py", "tests/b.py"],
        {"f": {"not checked": 4}, "g": {"killed": 2}, "h": {"killed": 1, "survived": 1}},
        survivors=[f"{M}.x_h__mutmut_2"],
    )
    merged = merge_groups(run, earlier)
    assert merged["by_function"] == {
        "f": {"killed": 3, "survived": 1},
        "g": {"killed": 2},
        "h": {"killed": 1, "survived": 1},
    }
    assert merged["counts"] == {"killed": 6, "survived": 2}
    assert merged["mutants"] == 8
    assert merged["killed_share"] == 0.75
    assert set(merged["survivors"]) == {f"{M}.x_f__mutmut_2", f"{M}.x_h__mutmut_2"}
    assert merged["timed_out"] == []  # g's timeout was run again and killed
    assert merged["functions_from_earlier_runs"] == ["f"]


def test_a_report_on_tests_no_longer_run_is_not_kept():
    earlier = _report(["tests/c.py"], {"f": {"killed": 3}})
    run = _report(["tests/a.py"], {"f": {"not checked": 3}, "g": {"killed": 1}})
    merged = merge_groups(run, earlier)
    assert merged["by_function"] == {"f": {"not checked": 3}, "g": {"killed": 1}}
    assert merged["functions_from_earlier_runs"] == []
    assert merged["killed_share"] == 1.0
