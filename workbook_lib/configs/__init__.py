"""Configuration read by every layer: the params schema (``params``)."""
