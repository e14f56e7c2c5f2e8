"""User-facing errors: the CLI prints str(e) as one line and exits with ``exit_code``."""


class MeshplanError(Exception):
    """A problem the user can fix; the message says what was wrong and how to fix it."""

    exit_code = 2


class UserInputError(MeshplanError):
    """Bad input: a model file, a flag, a profile or a plan that cannot be used."""

    exit_code = 2


class InfeasibleError(MeshplanError):
    """A valid request that no plan can satisfy (for example, nothing fits in memory)."""

    exit_code = 3
