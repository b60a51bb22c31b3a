"""Exclusive output folders: one writer per folder, enforced with an OS file lock.

A sweep, a training run and a rho ablation hold `exclusive(folder)` while they run: an
`fcntl.flock` on `<folder>/.lock`, which the OS releases when the process dies (no stale
locks after a kill). The lock file holds a JSON record of the holder (PID, host, command,
start time), so a second run on the same folder stops at once with a message naming it
(or, with `wait=True`, waits for it to finish). A run that waits waits for every lock it
takes: `wait=True` holds for the locks taken inside the `with` body too (a sweep's
training of its pair).

Where a folder cannot be locked (object stores such as gs:// paths, some network file
systems), `exclusive` warns and runs unlocked: the rule is then the user's to keep, one
writer per folder (see docs/RELIABILITY.md).
"""

import contextlib
import contextvars
import datetime
import errno
import fcntl
import json
import os
import pathlib
import platform
import sys
from collections.abc import Iterator

from absl import logging

LOCK_FILE = ".lock"
# Folders this process holds (a nested `exclusive` on one of them is a no-op: flock
# locks of two open files of one process would exclude each other).
_HELD: set[pathlib.Path] = set()
# Whether the locks taken now wait: set by a `wait=True` lock for its `with` body.
_WAIT = contextvars.ContextVar("spectr_lock_wait", default=False)


class FolderLockedError(RuntimeError):
  """Another process holds the folder's lock."""


def _holder(lock_path: pathlib.Path) -> str:
  try:
    info = json.loads(lock_path.read_text())
  except (OSError, ValueError):
    return "an unknown process (its lock record is not readable yet)"
  return (
    f"PID {info.get('pid')} on host {info.get('host')} since {info.get('started_at')}, "
    f"command: {info.get('command')}"
  )


def _record() -> bytes:
  info = {
    "pid": os.getpid(),
    "host": platform.node(),
    "command": " ".join(sys.argv),
    "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
  }
  return (json.dumps(info) + "\n").encode()


def _acquire(fd: int, lock_path: pathlib.Path, what: str, wait: bool) -> bool:
  """Locks `fd` (True), or returns False where the file system cannot lock."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return True
  except BlockingIOError:
    if not wait:
      raise FolderLockedError(
        f"{lock_path.parent} is in use by another {what}: {_holder(lock_path)}. Wait for it "
        "to finish (or pass --wait), or use another folder"
      ) from None
  except OSError as error:
    if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
      raise
    return False
  logging.info("%s: waiting for %s", lock_path.parent, _holder(lock_path))
  fcntl.flock(fd, fcntl.LOCK_EX)
  return True


@contextlib.contextmanager
def exclusive(
  folder: str | os.PathLike, what: str = "run", wait: bool = False, holder: bool = True
) -> Iterator[None]:
  """Holds the exclusive lock of `folder` (created if missing) for the `with` body.

  Args:
    folder: the output folder (a "scheme://" path is not lockable: a warning, no lock).
    what: what the holder is doing, for the message ("sweep", "training run", ...).
    wait: wait for the holder to finish instead of raising; also for every lock taken in
      the `with` body (inside a waiting lock, every lock waits).
    holder: False on the processes of a multi-process run other than process 0 (they
      write nothing; the run locks once).

  Raises:
    FolderLockedError: another process holds the lock (and no lock waits); the message
      names its PID, host and command.
  """
  wait = wait or _WAIT.get()
  token = _WAIT.set(wait)
  try:
    with _exclusive(folder, what, wait, holder):
      yield
  finally:
    _WAIT.reset(token)


def _unusable(path: pathlib.Path, what: str, error: OSError) -> OSError:
  """An OSError (same errno, so the same subclass) that says in words why `path` cannot
  hold `what`, and what to do."""
  if error.errno in (errno.EEXIST, errno.ENOTDIR):
    why = "is a file, not a folder (or lies under one)"
    todo = "move the file away, or set another folder"
  elif error.errno == errno.ENOSPC:
    why, todo = "is on a full disk", "free some space, or set a folder on another disk"
  elif error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
    why = f"cannot be written ({error.strerror})"
    todo = "make it writable, or set a folder that is"
  else:
    why, todo = f"cannot be used ({error.strerror})", "set another folder"
  return OSError(error.errno, f"{path} {why}: the {what} needs a folder it can write; {todo}")


@contextlib.contextmanager
def _exclusive(folder: str | os.PathLike, what: str, wait: bool, holder: bool) -> Iterator[None]:
  """`exclusive` with `wait` decided."""
  if not holder:
    yield
    return
  if "://" in str(folder):
    logging.warning("%s cannot be locked: keep to one writer per folder", folder)
    yield
    return
  path = pathlib.Path(folder).expanduser().absolute()
  if path in _HELD:
    yield
    return
  lock_path = path / LOCK_FILE
  try:
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
  except OSError as error:
    raise _unusable(path, what, error) from error
  try:
    if not _acquire(fd, lock_path, what, wait):
      logging.warning("%s cannot be locked here: keep to one writer per folder", path)
    else:
      try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, _record(), 0)
      except OSError as error:
        raise _unusable(path, what, error) from error
    _HELD.add(path)
    try:
      yield
    finally:
      _HELD.discard(path)
  finally:
    os.close(fd)  # closing the file releases the lock
