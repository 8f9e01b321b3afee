"""Atomic, checksummed checkpoints with rlpyt's snapshot modes.

Not ``torch.save`` over the old file (rlpyt): a kill mid-write leaves an unloadable file. Not ``torchrl.checkpoint``:
it keeps no checksums, so a truncated tensor file loads as zeros. A checkpoint here is a directory written under a
temporary name, fsynced, then renamed into place, with a manifest of every file's sha256 and size. One that does
not match its manifest is never loaded: it is named in a warning, moved to ``corrupt/``, and the previous valid
one is used (``strict=True``: an error). A verified checkpoint is remembered while its files are unchanged (size,
mtime, inode), so checking before loading does not hash a large replay twice.

Layout of ``directory`` (usually ``<run_dir>/checkpoints``): ``itr_00000012/`` holding ``MANIFEST.json``,
``state.pt`` and one folder per ``extra_writers`` entry (e.g. a replay buffer's ``checkpoint_writer()``: its
``replay_state.pt`` and ``segments/``, see :mod:`tdrl.replay.segments`); ``.tmp-*`` folders being written (stale
ones are removed by the first save or load); ``corrupt/``.

Files shared between checkpoints: a :class:`LinkingWriter` is handed the same component's folder in the newest
published checkpoint and may hard-link files from it that its data has not changed since (a replay links the time
segments nothing was written to), so a checkpoint costs what changed, not the whole replay. A linked file is one
inode under several names: it is never written again (new data always goes to a new file), and rotating or
quarantining a checkpoint only renames or unlinks names, so a surviving checkpoint keeps every file it lists. The
manifest still lists every file with its sha256; a linked file whose size and mtime match the previous manifest's
entry carries that entry's sha256 instead of being read again (so the hashing cost follows the new data too), and
one that changed since it was published is not trusted: the component is written again without links. A shared
file corrupted in place fails the verification of every checkpoint that links it.

Snapshot modes (rlpyt's): ``none`` never writes; ``last`` keeps the newest two; ``all`` keeps every one; ``gap``
writes only when ``iteration % gap == 0``; ``gap_and_last`` keeps the multiples of ``gap`` plus the newest two.
Rotation never removes the two newest checkpoints: one bad file (a flipped bit, a truncated copy) in the newest
leaves the one before it to resume from, at the cost of twice the disk. Rotation runs after the new checkpoint is
published and renames before deleting, so a kill at any moment leaves at least one complete checkpoint once one
has been written.

Loading uses ``torch.load(weights_only=False)`` (checkpoints hold python values): only load checkpoints you
wrote. The checksum guards against corruption, not tampering.
"""

from tdrl.ckpt.checkpointer import Checkpointer
from tdrl.ckpt.files import *  # noqa: F403 - the format's public names, tdrl.ckpt.files.__all__
from tdrl.ckpt.files import __all__ as _FORMAT_NAMES
from tdrl.utils.files import LinkingWriter

__all__ = ["Checkpointer", "LinkingWriter", *_FORMAT_NAMES]
