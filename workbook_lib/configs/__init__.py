"""Configuration read by every layer: the params (``params`` re-exports the public names of
``schema``, ``checks``, ``specs``, ``loading``, ``validation``, ``filesystem`` and ``cells``)."""
