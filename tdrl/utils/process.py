"""Process liveness, for files that record the pid of their writer."""

import os

__all__ = ["pid_alive"]


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this pid exists (one owned by another user counts)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
