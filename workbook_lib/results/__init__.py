"""What each notebook's results file holds, typed: one module per notebook.

Every class here is a :class:`~workbook_lib.records.Record`: everything needed to read a run
folder's results back (``running.results.load_result``), free of PyTorch and below every floor
that measures or reasons, so a reader imports results without the experiments that made them.
Methods read the record's own fields only.

    ``inventory``   01: bytes of every representation (``InventoryResult``)
    ``mask_cost``   02: cost model, mask generation, layer sweep, memory (``MaskCostResult``)
    ``timing``      03: the loop's arms, stages, syncs, profiles (``TimingResult``, ``ArmResult``)
    ``ddp``         04: plan, world sizes, ring fit, the gap's decomposition (``DDPResult``)
    ``verdict``     05: causes, claims, recommendation (``VerdictResult``)
    ``adoption``    06: the user's pipelines against the fix, equality (``AdoptionResult``)
    ``bench``       the full-size benchmark (``BenchResult``; quoted by 02 and 05)
"""
