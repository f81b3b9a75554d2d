"""Configuration read by every layer: the params. Import each name from the module that holds
it: ``schema``, ``checks``, ``specs``, ``loading``, ``validation`` (``validate``, ``Params``,
``load_params_file``), ``filesystem`` and ``cells``."""
