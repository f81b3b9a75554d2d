"""The commands that are no notebook: ``compare`` (runs side by side, on their ``headlines``),
``stability`` (do two runs agree) and ``selftest`` (a machine checked before a long run)."""
