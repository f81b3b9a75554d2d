"""What ``python -m workbook_lib equal`` prints and what notebook 06 shows of the same check."""
from __future__ import annotations

import math

from ..common.text import text_table
from ..results.adoption import EqualityResult, TensorDiff

RULE = ("a tensor is equal when max|fast - slow| <= max(tol x its size, how far a rounding probe "
        "of the slow pipeline moved it)")


def rule_text(res: EqualityResult) -> str:
    """The rule with this check's tolerance and probe, in one sentence."""
    return (f"{RULE}; tol = {res.tolerance:.2e} ({res.tolerance_basis}); the probe: "
            f"{res.probe or 'every module output rounded at relative size tol'}")


def _num(v: float) -> str:
    return "-" if v is None or math.isnan(v) else ("inf" if math.isinf(v) else f"{v:.2e}")


def _ratio(r: TensorDiff) -> str:
    return "-" if math.isnan(r.ratio) else ("inf" if math.isinf(r.ratio) else f"{r.ratio:.3g}")


def rows(res: EqualityResult) -> list[dict[str, str]]:
    """One row per compared tensor (gradients named by the slow model's parameter)."""
    return [{"tensor": r.name + (f" (fast: {r.fast_name})" if r.fast_name else ""),
             "kind": r.kind, "max |fast - slow|": _num(r.max_abs_diff),
             "its size": _num(r.scale), "relative": _num(r.rel_diff),
             "rounding probe": _num(r.probe), "allowed": _num(r.allowed),
             "difference / allowed": _ratio(r),
             "status": ("equal" if r.equal else "DIFFERS") + (f" ({r.note})" if r.note else "")}
            for r in res.rows]


def table_lines(res: EqualityResult) -> list[str]:
    """The check as plain text: the table, the rule, the verdict (last line)."""
    rs = rows(res)
    cols = list(rs[0]) if rs else []
    out = [f"{res.fast} against {res.slow}: {res.batches} batch(es) of {res.batch_size} on "
           f"{res.device}, the slow model's parameters copied into the fast one"
           + (f" (renamed: {', '.join(f'{a} -> {b}' for a, b in res.renames.items())})"
              if res.renames else ""),
           res.conditions(),
           *text_table([cols] + [[r[c] for c in cols] for r in rs])]
    out.append(f"Rule: {rule_text(res)}. Each row: the largest over the batches.")
    if res.randomness:
        out.append(f"Randomness: {res.randomness}.")
    if res.buffers_not_copied:
        out.append("Buffers of the fast model not copied (no same-named buffer of that shape "
                   f"and layout in the slow one): {', '.join(res.buffers_not_copied)}")
    out.append(("EQUAL: " if res.equal else "DIFFERENT: ") + res.summary())
    return out


def table(res: EqualityResult):
    """The check as a notebook table."""
    from .tables import table as styled

    return styled(rows(res), caption=(
        f"{res.fast} against {res.slow} on the same {res.batches} batch(es) of "
        f"{res.batch_size}, from the same parameters. {res.conditions()} Rule: "
        f"{rule_text(res)}."))
