"""How a program rank fails: `retryable` says whether restarting the group could help."""

from __future__ import annotations

import signal
import time


class ProgramFailed(RuntimeError):
    """The rank's program exited non-zero or raised: the group restarts (the user's loop resumes
    from its own checkpoint). `failed_at` (when its end was seen) lets the group name the rank that
    failed first: its peers fail a moment later, on the broken connection. `killed`: SIGKILL ended
    it, which only something outside the group sends (the OOM killer, an operator, an injected
    crash), never a peer's reaction to a failure, so it is the root cause whatever the clocks say."""

    retryable = True

    def __init__(self, message: str, failed_at: float | None = None, killed: bool = False):
        super().__init__(message)
        self.failed_at = time.time() if failed_at is None else failed_at
        self.killed = killed


class ProgramUnfixable(ProgramFailed):
    """The program cannot start or rejects its arguments (the command or module not found, exit code 2
    from argument parsing): every attempt would fail the same way, so the job fails at once."""

    retryable = False


# The last line of a Python traceback that no restart can fix.
UNFIXABLE_ERRORS = ("ModuleNotFoundError", "ImportError", "SyntaxError")
USAGE_EXIT_CODE = 2  # argparse and most CLIs: the arguments are wrong


def exit_failure(rank: int, executable: str, code: int, tail: list[str],
                 exited_at: float | None = None) -> ProgramFailed:
    """The failure of a command that exited with `code` (seen at `exited_at`), from the last lines of its output."""
    last = next((line.strip() for line in reversed(tail) if line.strip()), "")
    how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
    message = f"rank {rank}: {executable} {how}" + (f": {last[:300]}" if last else "")
    unfixable = code == USAGE_EXIT_CODE or last.split(":", 1)[0] in UNFIXABLE_ERRORS
    return (ProgramUnfixable if unfixable else ProgramFailed)(message, exited_at, killed=code == -signal.SIGKILL)
