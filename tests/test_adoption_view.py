"""What notebook 06's headline says about the two loss curves follows the measured difference."""
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
