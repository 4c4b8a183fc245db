"""The error of a user's model or data that breaks a convention (workers/model_io.py): alone in its
module so that the supervisor, which recognises it in a rank's failure, need not import torch."""


class UserModelError(ValueError):
    """The user's model or data breaks a convention: the same on every rank, so restarting cannot help."""
