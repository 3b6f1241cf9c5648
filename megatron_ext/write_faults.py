"""The filesystem refusals a writer meets that a user can act on: one table of what each means and what to do.

Used by every tool that writes for the user (the data tools, checkpoints, the Hugging Face converter), so
that a full disk reads the same everywhere: ``cannot write X: no space left on device (ENOSPC); … ``.
"""

from __future__ import annotations

import errno
from pathlib import Path

WRITE_FAULTS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on device", "free space or choose another {flag}"),
    errno.EDQUOT: ("disk quota exceeded", "free space within the quota or choose another {flag}"),
    errno.EFBIG: ("file too large for that filesystem", "choose another {flag}"),
    errno.EROFS: ("read-only file system", "choose {flag} on a writable filesystem"),
    errno.EACCES: ("permission denied", "make {dir} writable for this user or choose another {flag}"),
    errno.EPERM: ("operation not permitted", "make {dir} writable for this user or choose another {flag}"),
}
"""errno → (what the filesystem said, what to do: ``{flag}`` the option naming the output, ``{dir}`` where)."""


def describe(
    code: int | None, *, flag: str, directory: str | Path = "that directory", words: str = ""
) -> tuple[str, str]:
    """(what happened with its errno name, e.g. ``"no space left on device (ENOSPC)"``; what to do). A code
    outside the table keeps the system's ``words``."""
    name = errno.errorcode.get(code or 0, "")
    what, fix = WRITE_FAULTS.get(
        code or 0, (words.rstrip(".").lower() or "an error", "check that path or choose another {flag}")
    )
    return (f"{what} ({name})" if name else what), fix.format(flag=flag, dir=directory)
