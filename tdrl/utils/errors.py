"""The one error class for bad input, at the bottom of the layers so every layer can raise it, and the one
exception that is not an error.

A recipe's command line (:func:`tdrl.config.run_recipe`) prints a :class:`UserError` as one line and exits with
status 2, a :class:`NothingToDo` as one line and exit status 0; anything else is a bug and keeps its traceback.
"""

__all__ = ["NothingToDo", "UserError"]


class UserError(ValueError):
    """Input that cannot work: a config key or value, an env id, an algorithm the env does not fit, a resource this
    machine lacks. The message names the setting and says what to do."""


class NothingToDo(Exception):
    """The launch has nothing left to do (its run finished before) and changed nothing; the message says so and
    where the result is."""
