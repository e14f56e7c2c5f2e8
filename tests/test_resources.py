"""Resource pools: the run arithmetic by hand, the choice against brute force, bad pools."""

from __future__ import annotations

import itertools
import math

import pytest
from conftest import POOL_NODE

from meshplan.cli import main
from planner.errors import InfeasibleError, UserInputError
from planner.resources.choose import (
    OBJECTIVES,
    Option,
    PlanPoint,
    choose,
    evaluate,
    node_counts,
    objective_value,
    pareto,
)
from planner.resources.energy import busy_share, gpu_watts, run_cost, steps_for
from planner.resources.pool import NodeType, Pool, pool_from_dict


def node(name="h", profile="h100-sxm", nodes=2, **kw) -> NodeType:
    fields = dict(
        gpus_per_node=8,
        price_per_gpu_hour=2.0,
        gpu_busy_watts=700.0,
        gpu_idle_watts=100.0,
        node_watts=4600.0,
        carbon_g_per_kwh=390.0,
        pue=1.5,
    )
    fields.update(kw)
    return NodeType(name, profile, nodes, **fields)


# --------------------------------------------------------------------------- arithmetic


def test_run_cost_matches_hand_computation():
    # 2 nodes x 8 GPUs, 1000 steps of 3.6 s, busy half of each, 90% effective time:
    # wall = 3600 / 0.9 = 4000 s; GPU-hours = 16 x 4000 / 3600 = 17.777...; $ = 2 x that;
    # GPU power = 100 + 600 x 0.5 = 400 W; IT power = 16 x 400 + 2 x 4600 = 15,600 W;
    # energy = 15,600 W x 4000 s / 3.6e6 x PUE 1.5 = 26.0 kWh; carbon = 26 x 390 g = 10.14 kg.
    r = run_cost(node(), 2, 16, 1000, 3.6, 0.5, 0.9)
    assert r.steps == 1000
    assert r.wall_s == pytest.approx(4000.0)
    assert r.wall_h == pytest.approx(4000.0 / 3600.0)
    assert r.gpu_hours == pytest.approx(160.0 / 9.0)
    assert r.cost_usd == pytest.approx(320.0 / 9.0)
    assert r.gpu_watts == pytest.approx(400.0)
    assert r.energy_kwh == pytest.approx(26.0)
    assert r.carbon_kg == pytest.approx(10.14)


def test_steps_round_up_and_power_is_clamped():
    assert steps_for(1_000_000, 4096) == 245  # 244.14 -> 245 whole steps
    assert steps_for(8192, 4096) == 2
    n = node()
    assert gpu_watts(n, 1.7) == 700.0
    assert gpu_watts(n, -0.2) == 100.0


def test_the_gpu_is_busy_but_for_bubble_exposed_communication_and_offload_wait():
    # a 2.0 s step with a 0.3 s bubble, 0.1 s of exposed DP communication, 0.1 s offload wait
    assert busy_share(2.0, 0.3, 0.1, 0.1) == pytest.approx(0.75)
    assert busy_share(1.0, 0.0, 0.0, 0.0) == 1.0  # one GPU computing all step: full power
    assert busy_share(1.0, 0.8, 0.5, 0.0) == 0.0
    assert busy_share(0.0, 0.0, 0.0, 0.0) == 0.0
    # the H200 measurement behind it (energy's docstring): a step at MFU 0.41 drew 682 W of a
    # 692 W busy figure; priced at its busy share it is within 2%, at its MFU half
    n = node(gpu_busy_watts=692.0, gpu_idle_watts=120.0)
    assert gpu_watts(n, busy_share(0.335, 0.0, 0.0, 0.0)) == pytest.approx(682.0, rel=0.02)
    assert gpu_watts(n, 0.41) < 0.55 * 682.0


def test_node_counts_are_powers_of_two_and_the_availability():
    assert node_counts(1) == [1]
    assert node_counts(8) == [1, 2, 4, 8]
    assert node_counts(6) == [1, 2, 4, 6]


# --------------------------------------------------------------------------- the choice


def mock_planner(node_: NodeType, n: int) -> PlanPoint:
    """Step times that scale sub-linearly and differ by kind, so no one kind wins everything."""
    speed = {"slow": 1.0, "mid": 2.6, "fast": 3.4}[node_.name]
    step = 100.0 / (speed * n**0.8) + 0.5 * math.log2(n + 1)
    if node_.name == "slow" and n == 1:
        raise InfeasibleError("does not fit in memory; use more GPUs")
    return PlanPoint(step, 0.3 + 0.05 * speed / n, 4096 * 64, f"dp{n}", 1.0 - 0.04 * math.log2(n))


POOL = Pool(
    "test",
    (
        node("slow", nodes=5, price_per_gpu_hour=1.0, gpu_busy_watts=400.0, node_watts=3300.0),
        node("mid", nodes=4, price_per_gpu_hour=2.5, carbon_g_per_kwh=50.0),
        node("fast", nodes=3, price_per_gpu_hour=3.6, pue=1.1),
    ),
)


def brute_force(objective, deadline_h, budget):
    """Every (kind, count) the pool offers, priced from scratch, and the least objective."""
    best = None
    for nt in POOL.node_types:
        for n in node_counts(nt.nodes):
            try:
                p = mock_planner(nt, n)
            except InfeasibleError:
                continue
            steps = steps_for(10**9, p.tokens_per_step)
            r = run_cost(nt, n, n * nt.gpus_per_node, steps, p.step_time_s, p.busy, 0.9)
            if (deadline_h and r.wall_h > deadline_h) or (budget and r.cost_usd > budget):
                continue
            key = (objective_value(r, objective), r.wall_s, r.cost_usd, nt.name, n)
            best = min(best or (key, nt.name, n), (key, nt.name, n))
    return best


@pytest.mark.parametrize(
    "objective,deadline_h,budget",
    list(itertools.product(OBJECTIVES, (None, 200.0, 120.0), (None, 60_000.0, 30_000.0))),
)
def test_choice_is_the_brute_force_optimum(objective, deadline_h, budget):
    options = evaluate(POOL, mock_planner, tokens=10**9)
    assert len(options) == 4 + 3 + 3
    expected = brute_force(objective, deadline_h, budget)
    if expected is None:
        with pytest.raises(InfeasibleError, match="nearest is"):
            choose(options, objective, deadline_h, budget)
        return
    chosen = choose(options, objective, deadline_h, budget)
    assert (chosen.node.name, chosen.nodes) == expected[1:]


def test_the_objectives_pick_different_options():
    """Guards the brute-force test against a pool where one option wins every objective."""
    options = evaluate(POOL, mock_planner, tokens=10**9)
    picks = {o: choose(options, o).label for o in OBJECTIVES}
    assert len(set(picks.values())) >= 3, picks


def test_missed_deadline_names_the_nearest_option_and_what_it_needs():
    options = evaluate(POOL, mock_planner, tokens=10**9)
    fastest = min((o for o in options if o.run), key=lambda o: o.run.wall_h)
    with pytest.raises(InfeasibleError) as exc:
        choose(options, "cost", deadline_h=fastest.run.wall_h / 2)
    text = str(exc.value)
    assert exc.value.exit_code == 3
    assert f"nearest is {fastest.label}" in text
    assert f"{fastest.run.wall_h / 2:,.1f} h more time" in text
    assert "nodes instead of the" in text  # the fastest uses all its kind's nodes


def test_missed_budget_says_how_much_more_money():
    options = evaluate(POOL, mock_planner, tokens=10**9)
    cheapest = min((o for o in options if o.run), key=lambda o: o.run.cost_usd)
    with pytest.raises(InfeasibleError, match=rf"nearest is {cheapest.label}.*more money"):
        choose(options, "time", budget_usd=cheapest.run.cost_usd * 0.8)


def test_steps_budget_and_unfit_options():
    options = evaluate(POOL, mock_planner, steps=500)
    assert all(o.run.steps == 500 for o in options if o.run)
    unfit = [o for o in options if o.run is None]
    assert [(o.node.name, o.nodes) for o in unfit] == [("slow", 1)]
    assert "does not fit in memory" in unfit[0].why_not
    with pytest.raises(UserInputError):
        evaluate(POOL, mock_planner)


def test_pareto_front_is_the_non_dominated_set():
    options = [o for o in evaluate(POOL, mock_planner, tokens=10**9) if o.run]
    front = pareto(options)

    def vec(o: Option):
        return (o.run.wall_s, o.run.cost_usd, o.run.carbon_kg)

    for o in options:
        dominated = any(
            all(a <= b for a, b in zip(vec(q), vec(o), strict=True)) and vec(q) != vec(o)
            for q in options
        )
        assert (o in front) == (not dominated)
    assert 0 < len(front) < len(options)
    for objective in ("time", "cost", "carbon"):
        assert choose(options, objective) in front


# --------------------------------------------------------------------------- pool files


def test_pool_defaults_idle_to_busy_and_gpus_per_node_to_the_profile():
    pool = pool_from_dict({"node": [POOL_NODE]}, "p")
    (n,) = pool.node_types
    assert n.gpu_idle_watts == n.gpu_busy_watts == 700.0
    assert n.gpus_per_node == 8
    assert pool.effective_time_fraction == 0.9


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"profile": "tpu-v9"}, "unknown profile 'tpu-v9'"),
        ({"price_per_gpu_hour": -1.0}, "price_per_gpu_hour must be a number >= 0"),
        ({"pue": 0.8}, "pue must be a number >= 1"),
        ({"nodes": 0}, "nodes must be a positive integer"),
        ({"gpu_idle_watts": 900}, "gpu_idle_watts exceeds gpu_busy_watts"),
        ({"colour": "red"}, "unknown field(s) colour"),
        ({"pue": None}, "missing field(s) pue"),
    ],
)
def test_bad_pool_is_one_user_error(change, needle):
    row = {**POOL_NODE, **change}
    row = {k: v for k, v in row.items() if v is not None}
    with pytest.raises(UserInputError) as exc:
        pool_from_dict({"node": [row]}, "p")
    assert needle in str(exc.value)


def test_bad_pool_file_on_the_command_line_exits_2(tmp_path, capsys):
    path = tmp_path / "pool.toml"
    path.write_text('[[node]]\nname = "x"\nprofile = "h100-sxm"\nnodes = 1\n')
    code = main(["examples/mlp.py", "--resources", str(path), "--tokens", "1000"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "missing field(s) price_per_gpu_hour" in err
    assert main(["examples/mlp.py", "--gpus", "2", "--tokens", "1000"]) == 2
    assert "--tokens needs --resources" in capsys.readouterr().err
    assert main(["examples/mlp.py", "--gpus", "2", "--stage-degrees", "on"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--stage-degrees needs --resources" in err
    both = ["examples/mlp.py", "--resources", "profiles/pools/cloud.toml", "--tokens", "9"]
    assert main([*both, "--gpus", "8"]) == 2
    assert "--gpus and --resources exclude each other" in capsys.readouterr().err
    assert main(["examples/mlp.py", "--resources", "profiles/pools/cloud.toml"]) == 2
    assert "--tokens N or --steps N" in capsys.readouterr().err


def test_shipped_pools_load():
    from pathlib import Path

    from planner.resources.pool import load_pool

    for path in sorted(Path("profiles/pools").glob("*.toml")):
        assert load_pool(path).node_types


def test_every_figure_of_the_shipped_pools_names_the_line_it_is_typed_on():
    """The line ``figure_sources`` cites for each figure holds that field and that value."""
    from pathlib import Path

    from planner.resources.pool import figure_sources, load_pool

    for path in sorted(Path("profiles/pools").glob("*.toml")):
        pool = load_pool(path)
        text = path.read_text().splitlines()
        for t in pool.node_types:
            cited = pool.lines[t.name]
            assert cited["price_per_gpu_hour"] and cited["pue"]
            for key, line in cited.items():
                if key in ("name", "profile"):
                    continue
                field, _, value = text[line - 1].split("#")[0].partition("=")
                assert field.strip() == key
                assert float(value) == getattr(t, key), (path, t.name, key)
            said = figure_sources(pool, [t.name])
            assert (
                f"price_per_gpu_hour {t.price_per_gpu_hour:g} (line {cited['price_per_gpu_hour']})"
                in said
            )


def test_figure_lines_keep_nodes_top_level_keys_and_fabric_apart():
    from planner.resources.pool import figure_lines

    text = (
        "effective_time_fraction = 0.8  # a comment = not a key\n"
        '[[node]]\nname = "x"\npue = 1.1\n'
        '[[fabric]]\nbetween = ["x", "y"]\nlatency_s = 1e-5\n'
        '[[node]]\npue = 1.3\nname = "y"\n'
    )
    assert figure_lines(text) == {
        "": {"effective_time_fraction": 1},
        "x": {"name": 3, "pue": 4},
        "y": {"pue": 9, "name": 10},
    }


# --------------------------------------------------------------------------- end to end


def test_cli_chooses_and_a_missed_deadline_exits_3(tmp_path, capsys, monkeypatch):
    """The real planner on the meta-traced MLP over a two-kind pool, one node each."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    rows = []
    for name, profile, price in (("a", "a100-80g", 1.0), ("h", "h100-sxm", 3.0)):
        rows.append(
            f'[[node]]\nname = "{name}"\nprofile = "{profile}"\nnodes = 1\n'
            f"price_per_gpu_hour = {price}\ngpu_busy_watts = 500\nnode_watts = 1000\n"
            "carbon_g_per_kwh = 400\npue = 1.2\n"
        )
    pool = tmp_path / "pool.toml"
    pool.write_text("\n".join(rows))
    base = ["examples/mlp.py", "--resources", str(pool)]
    tokens = ["--tokens", "100000000000"]
    code = main([*base, *tokens, "--objective", "cost", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0
    text = " ".join(out.split())  # lines wrapped to the terminal, read as one
    assert "chosen: a x1 has the least cost" in text
    # every figure the choice was priced with names its line of the pool file
    said = text.split("figures from ", 1)[1]
    assert "a: price_per_gpu_hour 1 (line 5), gpu_busy_watts 500 (line 6)" in said
    assert "gpu_idle_watts 500 (not set: gpu_busy_watts)" in said and " h: " not in said
    assert (tmp_path / "out" / "resources.png").stat().st_size > 10_000
    steps = ["--steps", "1000"]  # a step budget instead of tokens
    code = main([*base, *steps, "--deadline", "1e-9", "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 3
    assert "no option of the pool meets the 1e-09 h deadline: the nearest is" in err


def test_why_chosen_names_the_runner_up_and_every_other_kind():
    from planner.resources.choose import why_chosen

    options = evaluate(POOL, mock_planner, tokens=10**9)
    chosen = choose(options, "cost")
    text = why_chosen(chosen, options, "cost", 9)
    assert text.startswith(f"{chosen.label} has the least cost (${chosen.run.cost_usd:,.0f})")
    for kind in ("slow", "mid", "fast"):
        if kind != chosen.node.name:
            assert f"; {kind} x" in text
    assert "%)" in text and "-" not in text.split("(+")[1][:2]  # others cost more
