"""Whether the compilation cache directory may be trusted, and the key its entries are
authenticated with.

A cache entry is code: loading one unpickles part of it and maps compiled machine
code. So, like ssh with its files, the cache uses a directory only if nobody but the
user can have put anything there:

- the directory is created 0700 (every missing parent we create too) and entries
  0600; an existing directory must be owned by the user and not writable by group
  or others, and every directory above it must be owned by the user or root and not
  writable by group or others unless it is sticky (like /tmp, where nobody can
  rename what another user owns);
- every entry carries an HMAC under a secret key (`key` in the directory, created
  0600 on first use, never printed); an entry that does not verify is never
  deserialized.

Sharing a cache between users (a CI fleet) is an explicit opt-in:
`TORCH_TPU_CACHE_KEY_FILE` names a key file whose readers are trusted to write
entries. Then the directory may belong to another user and be group-writable
(never world-writable unless sticky), and the key file must not be writable by
group or others nor readable by others.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

KEY_NAME = "key"
_KEY_BYTES = 32
_SHARED_KEY_ENV = "TORCH_TPU_CACHE_KEY_FILE"


class UntrustedDirectory(RuntimeError):
    """The cache directory cannot be used safely; the message names the fix."""


@dataclass(frozen=True)
class Trusted:
    root: Path
    secret: bytes


def open_directory(root: Path) -> Trusted:
    """Create or check root, and load (or create) its key. Raises UntrustedDirectory."""
    shared_key = os.environ.get(_SHARED_KEY_ENV, "").strip()
    root = Path(os.path.abspath(root))
    try:
        _make_private(root)
        root = Path(os.path.realpath(root))  # check where a symbolic link leads
        _check_tree(root, shared=bool(shared_key))
        if shared_key:
            return Trusted(root, _read_shared_key(Path(shared_key)))
        return Trusted(root, _own_key(root))
    except OSError as e:
        raise UntrustedDirectory(f"compilation cache directory {root} is unusable: {e}") from None


def private_subdirectory(path: Path) -> None:
    """An entry shard directory inside a checked root: created 0700."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask


def _make_private(root: Path) -> None:
    """Create root and its missing parents with mode 0700."""
    missing = []
    path = root
    while not os.path.lexists(path):
        missing.append(path)
        path = path.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)


def _check_tree(root: Path, shared: bool) -> None:
    st = os.stat(root)
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedDirectory(
            f"compilation cache directory {root} is not a directory: remove it or set "
            "TORCH_TPU_CACHE_DIR to another path"
        )
    uid = os.getuid()
    mode = stat.S_IMODE(st.st_mode)
    if shared:
        if mode & 0o002 and not mode & stat.S_ISVTX:
            raise UntrustedDirectory(
                f"shared compilation cache directory {root} is writable by every user "
                f"(mode {mode:o}): make it group-writable only (chmod o-w)"
            )
    else:
        if st.st_uid != uid:
            raise UntrustedDirectory(
                f"compilation cache directory {root} belongs to uid {st.st_uid}, not to you "
                f"(uid {uid}): anything in it could run as you. Use a directory of your own "
                f"(TORCH_TPU_CACHE_DIR), or share deliberately with {_SHARED_KEY_ENV}"
            )
        if mode & 0o022:
            raise UntrustedDirectory(
                f"compilation cache directory {root} is writable by group or others "
                f"(mode {mode:o}): anything planted in it could run as you. Fix it with "
                f"`chmod 700 {root}`, or share deliberately with {_SHARED_KEY_ENV}"
            )
    for parent in root.parents:
        pst = os.stat(parent)
        pmode = stat.S_IMODE(pst.st_mode)
        if pst.st_uid not in (uid, 0) and not shared:
            raise UntrustedDirectory(
                f"{parent}, above the compilation cache directory {root}, belongs to uid "
                f"{pst.st_uid}: its owner could replace the cache. Use a directory under "
                "your own home (TORCH_TPU_CACHE_DIR)"
            )
        if pmode & 0o022 and not pmode & stat.S_ISVTX:
            raise UntrustedDirectory(
                f"{parent}, above the compilation cache directory {root}, is writable by "
                f"group or others (mode {pmode:o}): they could replace the cache. Use "
                "another TORCH_TPU_CACHE_DIR or `chmod go-w` that directory"
            )


def _own_key(root: Path) -> bytes:
    """The directory's key, created 0600 on first use. Written to a private temporary
    file and linked into place, so concurrent first uses agree on one key."""
    path = root / KEY_NAME
    if not os.path.lexists(path):
        tmp = root / f".{KEY_NAME}-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(_KEY_BYTES))
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise UntrustedDirectory(
            f"compilation cache key {path} is not a private file of yours (mode "
            f"{stat.S_IMODE(st.st_mode):o}, uid {st.st_uid}): delete it and the cache "
            "(`python -m torch_tpu cache clear`) to start afresh"
        )
    return _read_key(path)


def _read_shared_key(path: Path) -> bytes:
    st = os.stat(path)
    if st.st_mode & 0o022 or st.st_mode & 0o004:
        raise UntrustedDirectory(
            f"{_SHARED_KEY_ENV}={path} is writable by group or others, or readable by "
            f"everyone (mode {stat.S_IMODE(st.st_mode):o}): make it `chmod 640` and "
            "give the group that shares the cache read access"
        )
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    secret = path.read_bytes()
    if len(secret) < _KEY_BYTES:
        raise UntrustedDirectory(
            f"compilation cache key {path} holds {len(secret)} bytes, fewer than "
            f"{_KEY_BYTES}: write {_KEY_BYTES} random bytes to it "
            f"(`head -c {_KEY_BYTES} /dev/urandom > {path}`)"
        )
    return secret
