import pytest
import torch

from workbook_lib.analysis import costmodel
from workbook_lib.measurement import timing


def _synthetic_rows(coef):
    rows = []
    for e in (1000, 2000, 4000, 8000):
        rows.append({"kind": "keep_mask", "E": e, "H": 0, "p": 0.0, "median": coef["gamma"] * e})
        for p in (0.1, 0.5):
            rows.append({"kind": "gather", "E": e, "H": 0, "p": p, "median": coef["delta"] * e})
        for h in (8, 16, 32):
            rows.append({"kind": "masked", "E": e, "H": h, "p": 0.01,
                         "median": costmodel.predict_mask(coef, e, h)})
            for p in (0.1, 0.5):
                rows.append({"kind": "filter_layer", "E": e, "H": h, "p": p,
                             "median": costmodel.predict_filter(coef, e, h, p)})
    return rows


def test_fit_recovers_coefficients_and_validates():
    true = {"alpha": 2e-9, "beta": 1e-10, "gamma": 3e-9, "delta": 1e-9, "c": 1e-5}
    rows = _synthetic_rows(true)
    got = costmodel.fit(rows)
    for k in true:
        assert got[k] == pytest.approx(true[k], rel=1e-6, abs=1e-15), k
    val = costmodel.validate(got, rows)
    assert val["max_abs_rel"] < 1e-6 and val["n_points"] == 3 + 4 * 3 * 2


def test_crossover_formula():
    coef = {"alpha": 1e-9, "beta": 1e-10, "gamma": 3e-9, "delta": 2e-9, "c": 0.0}
    p = costmodel.crossover_p(coef, 64)
    assert p == pytest.approx((5e-9 - 1e-9) / (1e-10 * 64))
    e, h = 1e6, 64
    assert costmodel.predict_filter(coef, e, h, p) == pytest.approx(costmodel.predict_mask(coef, e, h))
    assert costmodel.crossover_p({**coef, "gamma": 1.0}, 64) is None


def test_small_sweep_runs():
    cfg = costmodel.SweepConfig(num_nodes=50, edges=[200, 400], hidden=[4], p=[0.1], device=torch.device("cpu"),
                                warmup=0, repeats=1)
    rows = costmodel.sweep(cfg, progress=False)
    kinds = {r["kind"] for r in rows}
    assert kinds == {"keep_mask", "gather", "csr_build", "masked", "unmasked", "spmm", "filter_layer"}
    assert all(r["median"] > 0 for r in rows)


def test_measure_and_stage_timer():
    calls = []
    st = timing.measure(lambda: calls.append(1), warmup=2, repeats=3)
    assert len(calls) == 5 and st.n == 3 and st.q1 <= st.median <= st.q3
    with pytest.raises(ValueError, match="'repeats' must be a positive integer"):
        timing.measure(lambda: None, repeats=0)
    t = timing.StageTimer("cpu")
    for _ in range(3):
        with t.stage("a"):
            pass
        t.add("b", 0.5)
        t.next_step()
    med = t.medians()
    assert med["b"] == 0.5 and med["a"] >= 0 and len(t.completed()) == 3
