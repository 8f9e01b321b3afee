"""The one error class for bad input, at the bottom of the layers so every layer can raise it.

A recipe's command line (:func:`tdrl.config.run_recipe`) prints a :class:`UserError` as one line and exits with
status 2; anything else is a bug and keeps its traceback.
"""

__all__ = ["UserError"]


class UserError(ValueError):
    """Input that cannot work: a config key or value, an env id, an algorithm the env does not fit, a resource this
    machine lacks. The message names the setting and says what to do."""
