"""Files that readers in other processes never see half-written: temp file, fsync, rename."""

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LinkingWriter", "disk_bytes", "write_atomic", "write_json_atomic"]


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (the temp name holds the pid, so concurrent writers never mix)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """:func:`write_atomic` of ``data`` as indented JSON (values JSON lacks become their ``str``)."""
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def disk_bytes(*paths: str | os.PathLike) -> int:
    """Bytes the files under ``paths`` take on disk, as ``du`` counts them: allocated blocks (a sparse file counts
    what was written), each inode once however many hard links name it."""
    seen, total = set(), 0
    for top in paths:
        for root, _, names in os.walk(os.fspath(top)):
            for name in names:
                st = os.lstat(os.path.join(root, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


@dataclass(frozen=True)
class LinkingWriter:
    """An ``extra_writers`` entry that may share unchanged files with the previous checkpoint.

    ``write(directory, previous)`` writes the component into ``directory`` like a :data:`PathWriter`; ``previous``
    is the same component's folder in the newest published checkpoint (``None`` when there is none, it lacks the
    component or its manifest is unreadable). The writer may ``os.link`` a file of ``previous`` into ``directory``
    under the same relative name when its content is what it would write; it must never open a file of
    ``previous`` for writing. Called as a plain writer (``writer(directory)``) it writes everything.
    """

    write: Callable[[Path, Path | None], Any]

    def __call__(self, directory: Path) -> Any:
        return self.write(directory, None)
