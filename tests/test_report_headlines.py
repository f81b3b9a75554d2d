"""What notebooks 03 and 06 show a reader follows what was measured: headlines and colours."""
from workbook_lib.analysis.adoption import AdoptionResult
from workbook_lib.measurement.timing import Stat
from workbook_lib.report import adoption_view as view


def _result(max_rel_diff):
    losses = [0.002 * 0.97 ** i for i in range(40)]
    return AdoptionResult(
        steps=39, warmup_steps=1, batch_size=7, lr=0.05, optimizer="sgd",
        losses={"replicated": losses, "fix": losses}, rel_diff=[max_rel_diff] * 40,
        max_rel_diff=max_rel_diff, step={"replicated": Stat.from_samples([0.3, 0.31, 0.29]),
                                         "fix": Stat.from_samples([0.023, 0.024, 0.022])},
        speedup=Stat.from_samples([13.0, 13.5, 12.5]))


def test_headline_says_same_training_only_within_the_tolerance():
    within = view.headline(_result(3e-6))
    assert within.startswith("same loss curve to 3.0e-06 (within 1.0e-05)")
    # a default CPU run's 4.2e-5: above the 1e-5 tolerance, not "the same loss curve"
    above = view.headline(_result(4.2e-5))
    assert "same loss curve" not in above and "above the 1.0e-05 tolerance" in above
    assert "4.2e-05" in above


def test_03_headline_quotes_the_data_stages_not_the_harness():
    """The data-only step carries the harness's trivial loss and loop (7.5x where the data
    stages give 21.5x): the headline's data figure is the stages', the step's named as such."""
    from workbook_lib.report import timing_view

    class F:
        def __init__(self, v):
            self.measured = Stat.from_samples([v * 0.99, v, v * 1.01])

    class R:
        fastest_exact = None
        loops = None
        sanity = []
        figs = {"data_stages_ratio": F(21.5), "data_only_ratio": F(7.5),
                "data_model_ratio": F(18.3)}

        def figure(self, k):
            return self.figs.get(k)
    text = timing_view.headline(R())
    assert "21.5x data stages" in text
    assert "7.5x the whole data-only step, its trivial loss included" in text
    R.figs = {"data_only_ratio": F(7.5)}  # an older result without the stages figure
    assert "7.5x data-only step, its trivial loss included" in timing_view.headline(R())


def test_03_modes_chart_draws_forward_and_backward_in_the_stage_charts_colours():
    """03's mode chart and its stage charts: '+ forward' in forward's colour, '+ backward' in
    backward's, so that no colour means forward in one chart and backward in the next."""
    from workbook_lib.report import timing_view as tv
    from workbook_lib.training.loop import MODES

    assert tv.mode_colour("forward") == tv.stage_colour("forward", 0)
    assert tv.mode_colour("forward_backward") == tv.stage_colour("backward", 0)
    assert len({tv.mode_colour(m) for m in MODES}) == len(MODES)
