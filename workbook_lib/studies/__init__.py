"""One module (or package) per notebook, named after it: the notebook's measurement and its
conclusions, each section one call (the notebook's view is ``report/<name>_view``).

``inventory`` 01, ``mask_cost`` 02, ``timing`` 03, ``ddp`` 04, ``verdict`` 05, ``adoption`` 06.
A package's ``__init__`` holds what its notebook calls; its other modules, the parts."""
