"""User-facing errors: the CLI prints ``str(e)`` as one line and exits with ``exit_code``.

Anything raised as a MeshplanError is a problem the user can fix, so its message must say what was
wrong and how to fix it; any other exception is a bug and keeps its traceback.
"""


def brief(text: str, limit: int = 400) -> str:
    """``text`` on one line, cut at a word boundary with an ellipsis past ``limit``
    characters: torch's messages put what matters (the module path of a lifted tensor, the
    op a meta kernel lacks) after their first sentence, so a blind cut loses it mid-word.
    Every one-line error quoting another library's message shortens it here."""
    words = " ".join(str(text).split())
    if len(words) <= limit:
        return words
    return words[:limit].rsplit(" ", 1)[0] + " ..."


class MeshplanError(Exception):
    """A user-facing problem: the CLI prints str(e) as one line and exits with exit_code."""

    exit_code = 2


class UserInputError(MeshplanError):
    """Bad input (a model file, a flag, a profile, a plan): the message names it and the fix."""

    exit_code = 2


class InfeasibleError(MeshplanError):
    """A valid request no plan can satisfy (e.g. nothing fits in memory); exits 3 so scripts can
    tell "change the request" from "fix the input"."""

    exit_code = 3
