"""Datasets of episodes: a TorchRL replay-buffer storage on disk, memory-mapped.

:meth:`torchrl_swm.World.collect` writes them and :func:`load_dataset` opens them.

Layout on disk (``DIR``)::

    DIR/dataset.json          what was collected, and how (format, counts, env, seeds, keys)
    DIR/storage/              the TorchRL storage: a memory-mapped TensorDict (one file per key)
    DIR/storage/storage_metadata.json, DIR/writer/, DIR/buffer_metadata.json, DIR/prefetch.pkl
                              written by ``ReplayBuffer.dumps``: a plain TorchRL buffer whose storage
                              has as many rows as the one on disk (``LazyMemmapStorage(storage_rows)``,
                              ``"storage_rows"`` in ``dataset.json``: ``num_steps`` once compacted,
                              as a collect does at its end, the capacity if not) can
                              ``rb.loads(DIR)`` (its batch size is reset: pass one to ``sample``);
                              :meth:`WorldDataset.replay_buffer` builds one for you

Data layout: TorchRL's own episode layout, one row per transition, episodes
stored contiguously. Row ``t`` of an episode of length ``L`` holds step ``t`` at
the root and step ``t + 1`` under ``"next"``:

* root: the observation keys (``"observation"`` or the Dict keys), ``"pixels"``,
  ``("info", k)`` (``(1, ...)`` per row: the pool's time dim of 1) and, for
  keys envs may omit, ``("info_mask", k)`` (``(1,)`` bool: reported at that step),
  ``"episode_seed"``, ``"done"``/``"terminated"``/``"truncated"`` (always False at
  the root), ``"is_init"`` (True on the reset row), ``"action"`` (the action
  taken at step ``t``), ``"episode"`` (int64 episode id), ``"step_count"``
  (int64 ``(1,)``: ``t``), and whatever else the policy wrote (log-probs...).
* ``"next"``: the same observation keys at ``t + 1``, ``"reward"``,
  ``"done"``/``"terminated"``/``"truncated"`` (True only on the last row; an
  episode cut by the step limit has ``truncated``), ``"step_count"`` (``t + 1``).

So an episode of ``L`` steps has ``L`` rows and ``L + 1`` observations: the
reset frame is the root of row 0 and the final frame is ``"next"`` of row
``L - 1``. Episode ids are the episode's index in the collection (seed
``seed + id`` when collected with a seed). A finished ``collect`` stores
episodes in id order; an interrupted one stores the completed episodes in
completion order (``dataset.episode_ids`` says which).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import glob
import json
import logging
import os
import shutil
import time
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock between writers
    fcntl = None

import numpy as np
import torch
from tensordict import MemoryMappedTensor, TensorDict, TensorDictBase, is_tensorclass

from ._interrupts import interrupts_held
from .errors import check_bool, check_int, check_number, counted, describe, error_text, user_stacklevel

# pauses (s) between reads of a dataset that a collection may be writing (see WorldDataset.__init__)
_LIVE_READ_PAUSES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4)

__all__ = ["load_dataset", "WorldDataset", "DatasetWriter", "DatasetError", "FORMAT", "FORMAT_VERSION"]

FORMAT = "torchrl_swm.dataset"
FORMAT_VERSION = 1
METADATA_FILE = "dataset.json"
_DONE = ("done", "terminated", "truncated")


class DatasetError(ValueError):
    """A path is not a (readable) torchrl_swm dataset."""


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torchrl-swm", "torchrl", "tensordict", "torch", "gymnasium"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:  # pragma: no cover
            out[name] = None
    return out


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _key_str(key) -> str:
    return ".".join(key) if isinstance(key, tuple) else str(key)


def _describe_keys(td: TensorDictBase) -> dict:
    """``{"a.b": {"shape": [...], "dtype": "torch.float32"}}`` per leaf, shapes without the batch dim."""
    nb = td.batch_dims
    return {
        _key_str(k): {"shape": list(v.shape[nb:]), "dtype": str(v.dtype)}
        for k, v in td.items(include_nested=True, leaves_only=True)
    }


# what the memory-mapped storage writes and reads back: no uint16/32/64 (torch has no index_put for them), no
# float8 (tensordict's memmap metadata has no name for them), no quantized or sparse tensors
STORABLE_DTYPES = (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
    torch.float32, torch.float64, torch.complex32, torch.complex64, torch.complex128,
)
_STORABLE = frozenset(STORABLE_DTYPES)


def unstorable_entry(td: TensorDictBase) -> tuple | None:
    """``(key, what it holds, what a dataset stores)`` for the first entry of ``td`` the storage cannot hold
    (non-tensor data, which TensorDict's leaves leave out: stored, it would vanish without a word; a tensorclass,
    whose fields it would not read back; a dtype or layout the memory map cannot write; no elements, for which it
    writes no file), else ``None``."""
    for key, value in td.items(True, True, is_leaf=_is_leaf_or_non_tensor):
        dense = (isinstance(value, torch.Tensor) and value.dtype in _STORABLE and value.layout is torch.strided
                 and not value.is_meta)  # (is_meta: 6x faster than device.type)
        if dense and value.numel():
            continue
        if dense:
            return key, f"is {describe(value)}, with no elements", "tensors with at least one element per row"
        if getattr(type(value), "_is_non_tensor", False):
            data = value.tolist() if hasattr(value, "tolist") else value
            return key, f"holds non-tensor data ({type(value).__name__}: {repr(data)[:80]})", "tensors only"
        if is_tensorclass(value):
            return key, f"is a tensorclass ({type(value).__name__})", "tensors and TensorDicts (its .to_tensordict())"
        dtypes = ", ".join(str(d).removeprefix("torch.") for d in STORABLE_DTYPES)
        layout = "" if getattr(value, "layout", torch.strided) is torch.strided else f", layout {value.layout}"
        device = ", on meta" if getattr(value, "is_meta", False) else ""
        return key, f"is {describe(value)}{layout}{device}", f"dense tensors with data, of dtype {dtypes}"
    return None


def _is_leaf_or_non_tensor(cls: type) -> bool:
    return not issubclass(cls, TensorDictBase) or getattr(cls, "_is_non_tensor", False)


def _disk_usage(path: Path) -> tuple[int, int]:
    """``(bytes on disk, apparent bytes)`` of every file under ``path``."""
    used = apparent = 0
    for root, _, files in os.walk(path):
        for name in files:
            st = os.stat(os.path.join(root, name))
            apparent += st.st_size
            used += getattr(st, "st_blocks", st.st_size // 512) * 512
    return used, apparent


def _check_target(path: Path, overwrite: bool, remove: bool = True) -> bool:
    """Refuse a path that is not free (or, with ``overwrite``, not a dataset); ``remove`` the dataset there.
    Returns whether there is a dataset to replace (``False`` when ``remove`` removed it)."""
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"dataset path {str(path)!r} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise FileExistsError(
                f"dataset path {str(path)!r} exists and is not empty; choose another path or pass "
                "overwrite=True (--overwrite) to replace a dataset there"
            )
        why = _not_a_dataset(path)
        if why:
            raise FileExistsError(
                f"refusing to overwrite {str(path)!r}: it is not empty and is not a torchrl_swm dataset ({why}); "
                "remove it yourself if it is yours to delete"
            )
        if not remove:
            return True
        shutil.rmtree(path)
    return False


def _not_a_dataset(path: Path) -> str | None:
    """Why ``path`` is not a torchrl_swm dataset that overwrite may delete, or None. ``dataset.json`` is a common
    name (other tools' metadata): only one whose format is ours marks the directory as a dataset."""
    meta_path = path / METADATA_FILE
    if not meta_path.exists():
        return f"no {METADATA_FILE}"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"its {METADATA_FILE} is unreadable: {type(err).__name__}: {err}"
    found = meta.get("format") if isinstance(meta, dict) else None
    if found != FORMAT:
        return f"its {METADATA_FILE} has format {found!r}, not {FORMAT!r}"
    return None


def _aside_prefix(path: Path) -> str:
    """The name's start of a dataset a lazy writer's overwrite of ``path`` set aside (``.NAME.replaced-...``)."""
    return f".{path.name}.replaced-"


class _WriterLock:
    """An exclusive ``flock`` on ``.NAME.lock`` beside a dataset, held by the one writer writing it, from its
    ``open()`` to its ``close()``: a second writer of the path (another process's collect, an overwrite of it)
    is refused, where it would set aside or remove the files the first is still writing. The kernel releases
    the lock of a killed process; its file, left behind, is taken over. No-op where ``fcntl`` is missing."""

    def __init__(self, dataset: Path):
        self.dataset = dataset
        self.path = dataset.with_name(f".{dataset.name}.lock")
        self.fd: int | None = None

    def _lock(self, fd: int) -> None:
        """Lock ``fd`` (the lock file, opened), or raise naming the writer holding it; ``fd`` stays open."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            raise FileExistsError(
                f"dataset path {str(self.dataset)!r} is being written by another DatasetWriter (pid {holder}, "
                f"which holds {str(self.path)!r}); wait for it to finish, or choose another path"
            ) from None

    def acquire(self) -> None:
        if fcntl is None:  # pragma: no cover - Windows
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                self._lock(fd)
                # the file a holder removed as it released it: lock the new one instead
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        # released by close(), or when a writer never closed is garbage-collected
        self._release = weakref.finalize(self, _WriterLock._unlock, self.path, fd)

    def check_free(self) -> None:
        """Refuse at once a path another writer holds, creating nothing and keeping no lock (a killed writer's
        file is left for the next open to take over)."""
        if fcntl is None:  # pragma: no cover - Windows
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            self._lock(fd)
        finally:
            os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            self._release()
            self.fd = None

    @staticmethod
    def _unlock(path: Path, fd: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # before the unlock: a writer waiting on this file then locks a new one
        os.close(fd)


#: dataset.json's keys the writer sets itself: a caller's metadata may not replace them
_OWN_METADATA = frozenset({
    "format", "version", "layout", "created", "versions", "complete", "num_episodes", "num_steps", "storage_rows",
    "keys", "updated", "interrupted", "compacted", "compaction_failed",
})


class DatasetWriter:
    """Appends complete episodes to a dataset directory (used by ``World.collect``).

    Episodes are written into a ``LazyMemmapStorage`` of ``capacity`` rows
    (files are sparse until written). After each episode the dataset on disk is
    *committed* (storage length and ``dataset.json``) at most every
    ``commit_every`` seconds, and always on :meth:`close`. A dataset is loadable
    after any commit and only ever contains complete episodes: the storage
    length advances by whole episodes.

    :meth:`close` with ``compact=True`` rewrites the storage at its exact size,
    episodes sorted by id (in completion order with ``complete=False``).

    ``metadata`` entries go into ``dataset.json`` beside the writer's own (``format``, ``version``,
    ``num_steps``...), which they may not replace.

    With ``lazy=True`` the path is only checked here; the directory is created by :meth:`open`, or
    the first :meth:`add`, and a dataset ``overwrite`` replaces is set aside then, to be removed at
    the first commit: a run that fails (or is interrupted) before its first episode is written
    leaves the path as it was, the replaced dataset included. (A process killed in between leaves
    that dataset beside the path, as ``.NAME.replaced-...``: rename it back to recover it.)

    One writer per path: from :meth:`open` to :meth:`close` the writer holds an exclusive ``flock`` on
    ``.NAME.lock`` beside the path (removed at close; a killed process's lock is released by the kernel),
    and another writer of that path, in any process, is refused (``FileExistsError``, naming the holder's pid).

    Example:
        Episodes of your own (here one pool rollout), written as a dataset that
        :func:`load_dataset` opens; each needs its integer ``"episode"`` id on every row:

        >>> import torch
        >>> from torchrl_swm import EnvPool, load_dataset
        >>> from torchrl_swm.data import DatasetWriter
        >>> _ = torch.manual_seed(0)               # the rollout's random actions
        >>> pool = EnvPool("CartPole-v1", num_envs=1, seed=0)
        >>> episode = pool.rollout(500)[0]        # stops at the first done: one episode, batch [L]
        >>> pool.close()
        >>> episode["episode"] = torch.zeros(episode.shape, dtype=torch.int64)
        >>> writer = DatasetWriter("data/mine", capacity=1000)
        >>> writer.add(episode)
        >>> writer.close(complete=True)           # commits, and compacts the storage to its 1 episode
        >>> ds = load_dataset("data/mine")
        >>> ds.num_episodes, len(ds) == len(episode)
        (1, True)
    """

    def __init__(
        self,
        path: str | os.PathLike,
        capacity: int,
        *,
        metadata: Mapping | None = None,
        overwrite: bool = False,
        commit_every: float = 2.0,
        lazy: bool = False,
    ):
        self.path = Path(os.path.abspath(path))  # ("." has no name to set a replaced dataset aside by)
        if self.path.is_symlink():  # the dataset goes where the link points (rmtree refuses a link; mkdir a dangling one)
            self.path = self.path.resolve()
        self.capacity = check_int(capacity, "DatasetWriter: capacity (rows)", minimum=1)  # never 2 for 2.9
        overwrite = check_bool(overwrite, "DatasetWriter: overwrite")  # "no" would replace a dataset
        lazy = check_bool(lazy, "DatasetWriter: lazy")
        commit_every = check_number(commit_every, "DatasetWriter: commit_every (seconds)")
        if not commit_every >= 0:  # NaN would never commit before close()
            raise ValueError(f"DatasetWriter: commit_every (seconds) must be >= 0, got {commit_every}")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"DatasetWriter: metadata: expected a mapping of JSON values, got {describe(metadata)}")
        metadata = dict(metadata or {})
        if clash := sorted(set(metadata) & _OWN_METADATA, key=str):
            raise ValueError(
                f"DatasetWriter: metadata keys {clash} are the dataset's own (dataset.json's {sorted(_OWN_METADATA)}): "
                "name yours otherwise"
            )
        self._lock = _WriterLock(self.path)
        self._lock.check_free()
        _check_target(self.path, overwrite, remove=False)
        self._overwrite = overwrite
        self.commit_every = commit_every
        self.metadata = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "layout": "torchrl episode layout: root = step t, 'next' = step t+1, one row per transition",
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **metadata,
            "versions": _versions(),
        }
        self.episode_ids: list[int] = []
        self._ids_written: set[int] = set()
        self.episode_lengths: list[int] = []
        self.num_steps = 0
        self.storage_rows = self.capacity  # the storage's rows on disk (num_steps once compacted)
        self._swapping, self._compacted = None, False
        self.keys: dict | None = None
        self._last_commit = 0.0
        self._committed = (0, 0)
        self.closed = False
        self.opened = False
        self._lazy = lazy
        self._replaced: Path | None = None  # a lazy writer's replaced dataset, set aside until the first commit
        self._made_dir = False
        if not lazy:
            self.open()

    def open(self) -> None:
        """Create the dataset directory (replacing the dataset ``overwrite`` names) and its storage."""
        if self.opened:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()  # held until close(): no other writer sets this dataset aside under it
        try:
            self._open()
        except BaseException:
            self._lock.release()
            raise

    def _open(self) -> None:
        # again: the path may have changed since; a lazy writer sets the dataset it replaces aside, not removes it
        replacing = _check_target(self.path, self._overwrite, remove=not self._lazy)
        stale = sorted(self.path.parent.glob(f"{glob.escape(_aside_prefix(self.path))}*"))
        if stale:
            warnings.warn(f"DatasetWriter: {[str(p) for p in stale]} hold datasets an overwrite of {str(self.path)!r} "
                          "set aside, from a run killed before its first commit: rename one back to recover it, or "
                          "delete them", stacklevel=user_stacklevel())
        with interrupts_held():  # set aside and replaced as one step: a Ctrl-C in between would leave neither
            if replacing:
                aside = self.path.with_name(f"{_aside_prefix(self.path)}{os.getpid()}-{id(self):x}")
                self.path.rename(aside)
                self._replaced = aside
            self._made_dir = not self.path.exists()
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                self._new_storage()
                self._write_metadata(complete=False)
            except BaseException:
                self._undo_open()
                raise
            self.opened = True

    def _drop_replaced(self) -> None:
        """The first commit: the dataset ``overwrite`` replaced is gone for good."""
        if self._replaced is not None:
            shutil.rmtree(self._replaced, ignore_errors=True)
            self._replaced = None

    def _undo_open(self) -> None:
        """A lazy writer closed before its first episode: the path as it was (a replaced dataset back)."""
        with interrupts_held():
            if self.path.exists():
                shutil.rmtree(self.path)
            if self._replaced is not None:
                self._replaced.rename(self.path)
                self._replaced = None
            elif not self._made_dir:
                self.path.mkdir()  # the empty directory that was there

    def _new_storage(self) -> None:
        from torchrl.data import LazyMemmapStorage, RandomSampler, ReplayBuffer, RoundRobinWriter

        shutil.rmtree(self.path / "storage", ignore_errors=True)
        self.storage = LazyMemmapStorage(self.capacity, scratch_dir=self.path / "storage", existsok=False)
        self.rb = ReplayBuffer(storage=self.storage, writer=RoundRobinWriter(), sampler=RandomSampler())

    def _check_episode(self, episode: TensorDictBase) -> tuple[int, dict]:
        """``(episode id, key layout)`` of an episode fit to append: one id on every row, not written before,
        and the entries (keys, shapes, dtypes) of the first episode, which the storage was laid out for (it
        would store a missing entry as zeros and drop an extra one)."""
        if not isinstance(episode, TensorDictBase) or episode.batch_dims != 1 or not episode.batch_size[0]:
            raise ValueError(f"DatasetWriter.add: expected one episode, a TensorDict of batch [L] with L >= 1, got "
                             f"{describe(episode)}")
        ids = episode.get("episode", None)
        if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dtype is torch.bool:
            raise ValueError(f"DatasetWriter.add: the episode has no integer 'episode' entry (its id on every row), "
                             f"got {describe(ids)}")
        flat = ids.reshape(len(ids), -1)
        episode_id = int(flat[0, 0])
        if not bool((flat == episode_id).all()):
            raise ValueError(f"DatasetWriter.add: one episode holds several 'episode' ids: "
                             f"{sorted(set(flat.unique().tolist()))}; add each episode on its own")
        if episode_id in self._ids_written:
            raise ValueError(f"DatasetWriter.add: episode {episode_id} is already in the dataset; each episode id "
                             "can be added once")
        unstorable = unstorable_entry(episode)
        if unstorable is not None:
            key, what, stored = unstorable
            raise TypeError(f"DatasetWriter.add: episode {episode_id}'s entry {key!r} {what}; a dataset stores "
                            f"{stored}: leave it out, or convert it")
        keys = _describe_keys(episode)
        if self.keys is not None and keys != self.keys:
            missing = sorted(set(self.keys) - set(keys))
            extra = sorted(set(keys) - set(self.keys))
            changed = sorted(k for k in set(keys) & set(self.keys) if keys[k] != self.keys[k])
            raise ValueError(
                f"DatasetWriter.add: episode {episode_id}'s entries differ from the dataset's (laid out by its first "
                f"episode): missing {missing}, extra {extra}, "
                f"changed {[(k, self.keys[k], keys[k]) for k in changed]} (expected, got)"
            )
        return episode_id, keys

    def add(self, episode: TensorDictBase) -> None:
        """Append one complete episode (batch ``[L]``) to the storage.

        Raises:
            ValueError: the episode has no integer ``"episode"`` id (one on every row), an id already
                added, or entries (keys, shapes, dtypes) other than the first episode's.
            TypeError: an entry the storage cannot hold (non-tensor data, a tensorclass, a dtype
                outside :data:`STORABLE_DTYPES`, a sparse or meta tensor, no elements).
        """
        if self.closed:
            raise RuntimeError("DatasetWriter: add() after close()")
        episode_id, keys = self._check_episode(episode)  # before open(): a refused episode creates nothing
        length = int(episode.batch_size[0])
        if self.num_steps + length > self.capacity:
            raise RuntimeError(
                f"DatasetWriter: episode of {length} steps does not fit ({self.num_steps}/{self.capacity} rows used)"
            )
        self._check_free_space(length, keys, f"episode {episode_id} ({length} steps)")
        self.open()
        if self.keys is None:
            self.keys = keys
        writer, storage = self.rb._writer, self.storage
        before = (writer._cursor, writer._write_count, storage._len)
        initialized, count = storage.initialized, len(self.episode_ids)
        try:
            with _quiet_storage_init() if not initialized else contextlib.nullcontext():
                self.rb.extend(episode)
            self.episode_ids.append(episode_id)
            self._ids_written.add(episode_id)
            self.episode_lengths.append(length)
            self.num_steps += length
        except BaseException:
            # TorchRL advances the cursor and the length before it writes: an interrupt (Ctrl-C) inside
            # extend would leave them counting rows of no episode, which commit() saves for rb.loads(path)
            writer._cursor, writer._write_count, storage._len = before
            del self.episode_ids[count:], self.episode_lengths[count:]
            self._ids_written = set(self.episode_ids)
            if not self.episode_ids:
                self.keys = None  # laid out again by the next first episode
            self.num_steps = sum(self.episode_lengths)
            if not initialized:  # its files may exist already: a fresh storage, or the next add would fail
                self._new_storage()
            raise
        if time.monotonic() - self._last_commit >= self.commit_every:
            self.commit()

    def _check_free_space(self, rows: int, keys: Mapping, what: str, advice: str | None = None) -> None:
        """Refuse to write ``rows`` rows of ``keys`` that the filesystem has no room for: the storage's files are
        sparse memory maps, and a write into a page the disk cannot back kills the process with SIGBUS, no
        exception. (Another process filling the disk in between can still do that.)"""
        path = self.path if self.path.exists() else next(p for p in self.path.parents if p.exists())
        free = shutil.disk_usage(path).free
        needed = rows * _row_bytes(keys) + _PAGE_SLACK * (len(keys) + 8)  # a partly written page per file, metadata
        if free < needed:
            raise OSError(
                errno.ENOSPC,
                f"DatasetWriter: {what} needs {needed / 2**20:.1f} MiB on the filesystem of {str(self.path)!r}, which "
                f"has {free / 2**20:.1f} MiB free; "
                + (advice or "free some space or write the dataset elsewhere (the dataset keeps its "
                             f"{len(self.episode_ids)} complete episodes)"),
            )

    def commit(self) -> None:
        """Make everything added so far durable and visible to readers."""
        if (len(self.episode_ids), self.num_steps) == self._committed or not self.episode_ids:
            return
        with interrupts_held():  # TorchRL truncates its json files, then writes them: a Ctrl-C between left one empty
            self.rb.dumps(self.path)  # storage_metadata.json (len), writer, sampler
        self._committed = (len(self.episode_ids), self.num_steps)
        self._write_metadata(complete=False)
        self._last_commit = time.monotonic()
        self._drop_replaced()

    def _write_metadata(self, complete: bool, **extra) -> None:
        n_eps, n_steps = self._committed
        meta = {
            **self.metadata,
            "complete": complete,
            "num_episodes": n_eps,
            "num_steps": n_steps,
            "storage_rows": self.storage_rows,
            "keys": self.keys,
            "updated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **extra,
        }
        self.metadata_written = meta
        _write_json_atomic(self.path / METADATA_FILE, meta)

    def close(self, *, complete: bool, interrupted: str | None = None, compact: bool = True) -> None:
        """Commit what was added. ``complete=False`` marks an interrupted collection. A lazy writer never
        opened, or closed with ``complete=False`` before any episode was added, writes nothing and leaves
        the path as it was (a dataset ``overwrite`` would replace included).

        ``compact``: rewrite the storage at its exact size (its capacity is a bound: a plain ``rb.loads`` of
        the directory would otherwise allocate all of it), episodes in id order, or in completion order
        for an interrupted collection. Skipped, with a warning, where the disk lacks room for the copy.
        A failed compaction leaves the dataset as it was (``"compaction_failed"`` in ``dataset.json``); it
        is raised for a complete collection, and only recorded for an interrupted one (the interruption is
        the caller's error to raise), unless it is itself an interrupt.
        """
        if self.closed:
            return
        self.closed = True
        if not self.opened:
            return
        try:
            self._finish(complete, interrupted, compact)
        finally:
            self._lock.release()

    def _finish(self, complete: bool, interrupted: str | None, compact: bool) -> None:
        if self._lazy and not self.episode_ids and not complete:
            self._undo_open()  # a failed or interrupted first episode: nothing was written
            return
        self.commit()
        compacted, extra = False, {}
        if compact and self.episode_ids:
            ids = np.asarray(self.episode_ids)
            order = np.argsort(ids, kind="stable") if complete else np.arange(len(ids))
            if self.num_steps < self.capacity or (order != np.arange(len(order))).any():
                try:
                    self._check_free_space(self.num_steps, self.keys, "compacting the storage (a copy)",
                                           f"the dataset is left uncompacted (its storage keeps its "
                                           f"{self.capacity} rows; every episode is there)")
                except OSError as err:
                    warnings.warn(str(err), stacklevel=user_stacklevel())
                    extra = {"compaction_skipped": str(err)[:500]}
                else:
                    try:
                        self._compact(order)
                        compacted = True
                    except BaseException as err:
                        # interrupted (Ctrl-C) or failed: the dataset stays as it was, compacted or not
                        with interrupts_held():
                            compacted = self._abandon_compaction()
                            extra = {} if compacted else {"compaction_failed": error_text(err)[:500]}
                            self._write_metadata(complete=complete, interrupted=interrupted, compacted=compacted,
                                                 **extra)
                        if complete or not isinstance(err, Exception):
                            raise
                        warnings.warn(f"DatasetWriter: compacting the interrupted dataset failed "
                                      f"({error_text(err)}); it is left uncompacted",
                                      stacklevel=user_stacklevel())
        with interrupts_held():
            self._write_metadata(complete=complete, interrupted=interrupted, compacted=compacted, **extra)
        self._drop_replaced()  # (a complete dataset of no episodes commits nothing before)

    def _compact(self, order: np.ndarray) -> None:
        """Rewrite the storage at its exact size, episodes in ``order``; swapped in atomically per entry."""
        from torchrl.data import LazyMemmapStorage, RandomSampler, ReplayBuffer, RoundRobinWriter

        starts = np.concatenate([[0], np.cumsum(self.episode_lengths)[:-1]])
        tmp = self.path / ".compact"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        source = self.storage._storage
        storage = LazyMemmapStorage(self.num_steps, scratch_dir=tmp / "storage", existsok=False)
        rb = ReplayBuffer(storage=storage, writer=RoundRobinWriter(), sampler=RandomSampler())
        with _quiet_storage_init():
            for k in order:
                rb.extend(source[int(starts[k]) : int(starts[k] + self.episode_lengths[k])])
        rb.dumps(tmp)
        del rb, storage, source
        self.rb = self.storage = None
        old = self.path / ".old"
        if old.exists():
            shutil.rmtree(old)
        old.mkdir()
        with interrupts_held():  # the copy is complete: move it into place in one go
            self._swapping = (order, tmp, old)
            self._swap_in()
            shutil.rmtree(old)
            shutil.rmtree(tmp)

    def _swap_in(self) -> None:
        """Move each compacted entry into place (the replaced one to ``.old``), then record the new order;
        resumable where an interrupt stopped it."""
        order, tmp, old = self._swapping
        for entry in sorted(os.listdir(tmp)):
            if (self.path / entry).exists():
                os.replace(self.path / entry, old / entry)
            os.replace(tmp / entry, self.path / entry)
        ids, lengths = [self.episode_ids[k] for k in order], [self.episode_lengths[k] for k in order]
        self.episode_ids, self.episode_lengths, self.storage_rows, self._swapping, self._compacted = (
            ids, lengths, self.num_steps, None, True
        )

    def _abandon_compaction(self) -> bool:
        """After an interrupted :meth:`_compact`: finish a swap that had begun (its copy is complete), else
        drop the partial copy, so the directory holds one storage and no leftover. Returns whether the
        storage ended up compacted."""
        if self._swapping is not None:
            self._swap_in()
        for leftover in (self.path / ".compact", self.path / ".old"):
            shutil.rmtree(leftover, ignore_errors=True)
        return self._compacted


class _NoStorageInitLine(logging.Filter):
    """Drops TorchRL's "Initialized LazyMemmapStorage with torch.Size([capacity]) shape" INFO line, which
    its logger prints on stdout when a storage is first written: a dataset's storage is its own inner
    detail (the capacity is a bound, not the dataset's size), and the line would land in a CLI user's
    stdout and a script's output."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Initialized LazyMemmapStorage")


@contextlib.contextmanager
def _quiet_storage_init():
    logger, line_filter = logging.getLogger("torchrl"), _NoStorageInitLine()
    logger.addFilter(line_filter)
    try:
        yield
    finally:
        logger.removeFilter(line_filter)


_PAGE_SLACK = 1 << 16  # bytes counted per storage file beyond its rows: partly written pages, filesystem blocks


def _row_bytes(keys: Mapping) -> int:
    """The bytes of one storage row, from ``_describe_keys``' layout."""
    total = 0
    for desc in keys.values():
        dtype = getattr(torch, str(desc["dtype"]).removeprefix("torch."))
        total += int(np.prod(desc["shape"], dtype=np.int64)) * dtype.itemsize
    return total


def _copy_on_write(td: TensorDictBase, rows: int) -> TensorDictBase:
    """``td``'s first ``rows`` rows, its memory-mapped leaves mapped again privately (copy-on-write, read lazily):
    tensordict maps writable files shared, so an in-place write would silently change the dataset on disk."""

    def remap(leaf: torch.Tensor) -> torch.Tensor:
        filename = getattr(leaf, "filename", None)
        if filename is None or leaf.numel() == 0 or getattr(leaf, "index", None) is not None:
            return leaf[:rows]
        return _PrivateMemmap.from_filename(filename, leaf.dtype, (rows, *leaf.shape[1:]))

    return td.apply(remap, batch_size=[rows])


class _PrivateMemmap(MemoryMappedTensor):
    """A ``MemoryMappedTensor`` mapped copy-on-write: writes stay in this process's memory. Pickled (to a
    worker process, a Ray actor), it maps the file privately again: in-memory edits are not carried over."""

    @classmethod
    def from_filename(cls, filename, dtype, shape, index=None):
        shape = torch.Size(shape)
        private = torch.from_file(str(filename), shared=False, size=shape.numel(), dtype=dtype).view(shape)
        out = cls(private if index is None else private[index])
        # the attributes tensordict's own from_filename sets (its __reduce__ reopens through this method)
        out.filename, out._handler, out.index, out.parent_shape = filename, None, index, shape
        return out

    def _index_wrap(self, tensor, item, check=False):
        # tensordict's wraps an indexed view (ds.td[k], an episode) as a plain MemoryMappedTensor, which
        # would map the file shared again when pickled: keep the class
        if check and tensor.untyped_storage().data_ptr() != self.untyped_storage().data_ptr():
            return tensor
        out = type(self)(tensor)
        out.filename, out._handler, out.index = getattr(self, "_filename", None), None, item
        out.parent_shape = getattr(self, "parent_shape", None)
        return out


class WorldDataset:
    """A dataset written by :meth:`torchrl_swm.World.collect`, opened lazily.

    Nothing is read at open time but ``dataset.json``; the data stays in
    memory-mapped files and is read when indexed. The files are mapped
    copy-on-write: writing into :attr:`td`, an episode or the replay buffer
    (``rb.extend`` overwrites the full storage's oldest rows) changes the data
    in memory only, never the dataset on disk (a pickled copy, sent to a worker
    process, maps the files privately again, without this process's edits). To
    add online data, copy it into a storage of its own (``LazyMemmapStorage(size)``,
    then ``rb.extend(ds.td)``).

    Attributes:
        path: the dataset directory.
        metadata: the content of ``dataset.json``.
        td: the transitions, a memory-mapped TensorDict of batch ``[num_steps]``
            (``None`` for an empty dataset).

    Example:
        :func:`~torchrl_swm.load_dataset` opens one (see it for replay buffers):

        >>> from torchrl_swm import World, load_dataset
        >>> with World("CartPole-v1", num_envs=2) as world:
        ...     _ = world.collect("data/four", episodes=4, seed=0, progress=False)
        >>> ds = load_dataset("data/four")
        >>> ds
        WorldDataset(path='data/four', episodes=4, steps=..., complete=True)
        >>> ds.episode_ids.tolist(), ds.episode_seeds.tolist()   # episode j started with seed 0 + j
        ([0, 1, 2, 3], [0, 1, 2, 3])
        >>> ds.step(0, 0)["observation"].shape                     # episode 0's reset observation
        torch.Size([4])
        >>> stats = ds.stats()                                     # per episode
        >>> bool((stats["returns"] == stats["lengths"]).all())     # CartPole: +1 per step
        True
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise DatasetError(f"no dataset at {str(self.path)!r}: the path does not exist")
        if not self.path.is_dir():
            raise DatasetError(f"no dataset at {str(self.path)!r}: not a directory")
        meta_path = self.path / METADATA_FILE
        if not meta_path.exists():
            raise DatasetError(f"{str(self.path)!r} is not a torchrl_swm dataset: {METADATA_FILE} is missing")
        # A collection in progress rewrites the storage's meta.json files at each commit (TorchRL's dumps) and
        # compacts the storage at its end before dataset.json says so: a reader can catch either half done. A
        # dataset not yet complete is read again, from dataset.json on, for about a second before it is called
        # damaged.
        for pause in (*_LIVE_READ_PAUSES, None):
            try:
                self._open(meta_path)
                return
            except DatasetError as err:
                if not isinstance(self.metadata, dict) or self.metadata.get("complete") is not False:
                    raise
                if pause is None:
                    raise DatasetError(f"{err} (or still being written: a collect in progress?)") from err
                time.sleep(pause)

    def _open(self, meta_path: Path) -> None:
        """Read ``dataset.json`` and map the storage, checked against it."""
        self.metadata = {}
        try:
            self.metadata = json.loads(meta_path.read_text())
        except json.JSONDecodeError as err:
            raise DatasetError(f"{str(meta_path)!r} is not valid JSON: {err}") from err
        if not isinstance(self.metadata, dict):
            raise DatasetError(f"{str(meta_path)!r}: expected a JSON object, got {type(self.metadata).__name__}")
        if self.metadata.get("format") != FORMAT:
            raise DatasetError(
                f"{str(self.path)!r}: unknown format {self.metadata.get('format')!r}, expected {FORMAT!r}"
            )
        version, self.num_steps = (self._meta_int(name) for name in ("version", "num_steps"))
        if version > FORMAT_VERSION:
            raise DatasetError(
                f"{str(self.path)!r}: dataset format version {version} is newer than this "
                f"torchrl_swm reads ({FORMAT_VERSION}); upgrade torchrl-swm"
            )
        self.td: TensorDictBase | None = None
        if self.num_steps:
            storage = self.path / "storage"
            if not storage.is_dir():
                raise DatasetError(f"{str(self.path)!r}: the storage directory is missing")
            self._check_storage_files(storage)
            try:
                full = TensorDict.load_memmap(storage)
            except Exception as err:  # a file tensordict needs is gone or damaged (meta.json...)
                raise DatasetError(
                    f"{str(self.path)!r}: the storage cannot be read ({error_text(err)}); the dataset is "
                    "damaged or incomplete (a partial copy?)"
                ) from err
            if full.batch_size[0] < self.num_steps:
                raise DatasetError(
                    f"{str(self.path)!r}: storage has {full.batch_size[0]} rows, dataset.json says {self.num_steps}"
                )
            self._check_entries(full)
            # the committed rows only: an uncompacted storage keeps its whole capacity, which a private
            # mapping (copy-on-write, sized in full) could exceed the memory the kernel lets a process commit
            self.td = _copy_on_write(full, self.num_steps)
        self._episodes = None
        self._obs_keys = None

    def _check_entries(self, full: TensorDictBase) -> None:
        """The storage holds every entry ``dataset.json`` lists, with its shape and dtype (a storage whose own
        ``meta.json`` says otherwise would load reshaped or reinterpreted), and the ``"episode"`` ids."""
        stored = {_key_str(k): v for k, v in full.items(True, True)}
        listed = self.metadata.get("keys") or {}
        missing = sorted(set(listed) - set(stored))
        if missing:
            raise DatasetError(f"{str(self.path)!r}: the storage lacks the entries {missing} that dataset.json lists")
        if "episode" not in stored:
            raise DatasetError(f"{str(self.path)!r}: the storage has no 'episode' entry (each row's episode id), "
                               "which a dataset needs; it is damaged or was not written by torchrl_swm")
        if not isinstance(listed, dict):
            return
        for name, desc in listed.items():
            value = stored[name]
            if not isinstance(desc, dict):
                continue
            if list(value.shape[1:]) != desc.get("shape") or str(value.dtype) != desc.get("dtype"):
                raise DatasetError(
                    f"{str(self.path)!r}: entry {name!r}: dataset.json says shape {desc.get('shape')} and dtype "
                    f"{desc.get('dtype')} per row, the storage holds shape {list(value.shape[1:])} and dtype "
                    f"{value.dtype}; the dataset is damaged (its storage's meta.json and dataset.json disagree)"
                )

    def _meta_int(self, name: str) -> int:
        """``dataset.json``'s integer ``name`` (0 when absent); a damaged value is a DatasetError."""
        value = self.metadata.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DatasetError(
                f"{str(self.path / METADATA_FILE)!r}: {name!r} must be a non-negative integer, got {value!r}; "
                "the dataset's metadata is damaged"
            )
        return value

    def _check_storage_files(self, storage: Path) -> None:
        """Every entry ``dataset.json`` lists has its memmap file, at its full size: tensordict would load
        without a missing file (the entry silently gone) and grow a short one (its rows read as zeros)."""
        keys, rows = self.metadata.get("keys"), self._meta_int("storage_rows")
        if not isinstance(keys, dict) or not rows:
            return
        # the files by entry name, named as dataset.json names them (the key's parts joined by "."; a part
        # may hold a "." itself: "info.cost.total" is info/cost.total.memmap)
        files = {}
        for root, _, names in os.walk(storage):
            parts = Path(root).relative_to(storage).parts
            for file_name in names:
                if file_name.endswith(".memmap"):
                    files[".".join((*parts, file_name[: -len(".memmap")]))] = Path(root) / file_name
        for name, desc in keys.items():
            file = files.get(name)
            dtype = getattr(torch, str(desc.get("dtype", "")).removeprefix("torch."), None)
            if file is None:
                raise DatasetError(
                    f"{str(self.path)!r}: entry {name!r} is missing from the storage (no memmap file for it); the "
                    "dataset is incomplete (a partial copy?)"
                )
            if not isinstance(dtype, torch.dtype):
                continue
            expected = rows * int(np.prod(desc.get("shape", []), dtype=np.int64)) * dtype.itemsize
            size = file.stat().st_size
            if size < expected:
                raise DatasetError(
                    f"{str(self.path)!r}: entry {name!r} is cut short: {str(file)!r} holds {size} bytes, expected "
                    f"{expected} ({rows} rows of shape {desc.get('shape')} and dtype {desc.get('dtype')}); the dataset "
                    "is damaged or incomplete"
                )

    # -- episodes -------------------------------------------------------------------------------------
    def _index(self):
        if self._episodes is None:
            if self.td is None:
                empty = np.zeros(0, dtype=np.int64)
                self._episodes = (empty, empty, empty)
            else:
                ids = self.td.get("episode").reshape(self.num_steps).numpy()
                change = np.flatnonzero(np.diff(ids) != 0) + 1
                starts = np.concatenate([[0], change]).astype(np.int64)
                lengths = np.diff(np.concatenate([starts, [self.num_steps]])).astype(np.int64)
                self._episodes = (ids[starts].astype(np.int64), starts, lengths)
        return self._episodes

    @property
    def num_episodes(self) -> int:
        return len(self._index()[0])

    @property
    def episode_ids(self) -> np.ndarray:
        """The id of each stored episode (its index in the collection), in storage order."""
        return self._index()[0]

    @property
    def episode_starts(self) -> np.ndarray:
        """The first row of each stored episode."""
        return self._index()[1]

    @property
    def episode_lengths(self) -> np.ndarray:
        """The number of steps (rows) of each stored episode; it has ``length + 1`` observations."""
        return self._index()[2]

    @property
    def episode_seeds(self) -> np.ndarray | None:
        """The seed each stored episode started from (``None`` if not recorded)."""
        if self.td is None or "episode_seed" not in self.td.keys():
            return None
        return self.td.get("episode_seed")[torch.as_tensor(self.episode_starts)].reshape(-1).numpy()

    def _check_episode(self, k: int) -> int:
        n = self.num_episodes
        k = check_int(k, "episode")
        if not -n <= k < n:
            raise IndexError(f"episode {k} out of range: the dataset has {n} episodes")
        return k % n

    def episode(self, k: int) -> TensorDictBase:
        """Stored episode ``k`` (position, not id): a memory-mapped TensorDict ``[L]``.
        Negative positions count from the end, as Python's (``-1`` is the last stored episode)."""
        k = self._check_episode(k)
        start, length = int(self.episode_starts[k]), int(self.episode_lengths[k])
        return self.td[start : start + length]

    @property
    def observation_keys(self) -> list:
        """Keys present both at the root and under ``"next"``: observations, pixels, infos, seeds."""
        if self._obs_keys is None:
            if self.td is None:
                self._obs_keys = []
            else:
                root = set(self.td.exclude("next").keys(True, True))
                nxt = set(self.td.get("next").keys(True, True))
                skip = {*_DONE, "step_count"}
                self._obs_keys = sorted((k for k in root & nxt if k not in skip), key=str)
        return self._obs_keys

    def step(self, k: int, t: int) -> TensorDictBase:
        """The observation keys of stored episode ``k`` at step ``t`` in ``0..L``
        (``t = L`` is the final observation, read from ``"next"`` of the last row).
        Negative positions ``k`` count from the end, as Python's (``-1`` is the last stored episode)."""
        k = self._check_episode(k)
        length = int(self.episode_lengths[k])
        t = check_int(t, "step")
        if not 0 <= t <= length:
            raise IndexError(f"step {t} out of range for episode {k} of length {length} (valid: 0..{length})")
        start = int(self.episode_starts[k])
        keys = self.observation_keys
        if t < length:
            return self.td[start + t].select(*keys)
        return self.td.get("next")[start + length - 1].select(*keys)

    # -- TorchRL access -----------------------------------------------------------------------------------
    def storage(self):
        """A ``TensorStorage`` over the memory-mapped data (no copy)."""
        from torchrl.data import TensorStorage

        if self.td is None:
            raise DatasetError(f"{str(self.path)!r} holds no episodes")
        return TensorStorage(self.td)

    def replay_buffer(
        self,
        *,
        slice_len: int | None = None,
        num_slices: int | None = None,
        batch_size: int | None = None,
        sampler=None,
        strict_length: bool = True,
        **kwargs,
    ):
        """A ``TensorDictReplayBuffer`` over this dataset (memory-mapped, no copy).

        With ``slice_len`` and ``num_slices``, each sample holds ``num_slices``
        sub-trajectories of ``slice_len`` consecutive steps of one episode each
        (``SliceSampler(traj_key="episode")``), flat as TorchRL returns them:
        ``batch.reshape(num_slices, slice_len)`` gives ``(batch, time, ...)``.
        With ``strict_length=False``, episodes shorter than ``slice_len`` give
        shorter slices, so a sample may hold fewer rows and does not reshape
        (TorchRL's ``split_trajectories`` pads it). Otherwise pass ``sampler=`` and
        ``batch_size=`` as for any TorchRL replay buffer.
        """
        from torchrl.data import SliceSampler, TensorDictReplayBuffer

        for name, value in (("slice_len", slice_len), ("num_slices", num_slices), ("batch_size", batch_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
                raise ValueError(f"replay_buffer: {name} must be a positive int, got {value!r}")
        if slice_len is not None:
            if sampler is not None:
                raise ValueError("replay_buffer: pass either slice_len/num_slices or sampler, not both")
            if num_slices is None and batch_size is None:
                raise ValueError("replay_buffer: slice_len needs num_slices (or batch_size = num_slices * slice_len)")
            if batch_size is None:
                batch_size = int(num_slices) * int(slice_len)
            elif num_slices is not None and int(batch_size) != int(num_slices) * int(slice_len):
                raise ValueError(
                    f"replay_buffer: batch_size {batch_size} is not num_slices * slice_len = {num_slices} * "
                    f"{slice_len} = {int(num_slices) * int(slice_len)}; pass one of batch_size or num_slices"
                )
            if batch_size % int(slice_len):
                raise ValueError(f"replay_buffer: batch_size {batch_size} is not a multiple of slice_len {slice_len}")
            sampler = SliceSampler(
                slice_len=int(slice_len), traj_key="episode", strict_length=strict_length, cache_values=True
            )
        elif num_slices is not None:
            raise ValueError("replay_buffer: num_slices needs slice_len (the steps per slice)")
        return TensorDictReplayBuffer(storage=self.storage(), sampler=sampler, batch_size=batch_size, **kwargs)

    # -- summaries ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """The number of transitions (rows)."""
        return self.num_steps

    def __repr__(self) -> str:
        return (
            f"WorldDataset(path={str(self.path)!r}, episodes={self.num_episodes}, steps={self.num_steps}, "
            f"complete={self.metadata.get('complete')})"
        )

    def stats(self) -> dict:
        """Per-episode returns, lengths and successes (reads the reward/success columns)."""
        lengths = self.episode_lengths
        out = {"lengths": lengths, "returns": None, "successes": None}
        if self.td is None:
            return out
        idx = np.repeat(np.arange(len(lengths)), lengths)
        reward = self.td.get(("next", "reward"), None)  # None: collected with exclude_keys=["reward"]
        if reward is not None:
            reward = reward.reshape(self.num_steps, -1).sum(-1).double().numpy()
            out["returns"] = np.bincount(idx, weights=reward, minlength=len(lengths))
        from .world import SUCCESS_KEYS

        for key in (("next", *k) for k in SUCCESS_KEYS):
            if key in self.td.keys(True, True):
                flag = self.td.get(key).reshape(self.num_steps, -1).any(-1).numpy()
                out["successes"] = np.bincount(idx, weights=flag, minlength=len(lengths)) > 0
                break
        return out

    def summary(self) -> str:
        """A human-readable description: counts, env, seeds, lengths, returns, keys, size."""
        m = self.metadata
        lines = [f"dataset {self.path}"]
        reason = m.get("interrupted") or "collection did not finish"
        state = "complete" if m.get("complete") else f"INCOMPLETE ({reason})"
        lines.append(
            f"  {counted(self.num_episodes, 'episode')}, {counted(self.num_steps, 'step')} ({state}; "
            f"{m.get('episodes_requested', '?')} requested)"
        )
        if m.get("env"):
            lines.append(f"  env        {m['env']}  (num_envs={m.get('num_envs')}, reset_mode={m.get('reset_mode')})")
        if m.get("policy"):
            lines.append(f"  policy     {m['policy']}")
        seeds = self.episode_seeds
        if seeds is not None and len(seeds):
            lines.append(f"  seeds      {int(seeds.min())}..{int(seeds.max())} (collect seed {m.get('seed')})")
        if self.num_episodes:
            st = self.stats()
            lengths = st["lengths"]
            lines.append(
                f"  length     mean {lengths.mean():.1f}, min {lengths.min()}, max {lengths.max()} "
                f"(step limit {m.get('max_steps')})"
            )
            if st["returns"] is not None:
                r = st["returns"]
                lines.append(f"  return     mean {r.mean():.3f} ± {r.std():.3f}, min {r.min():.3f}, max {r.max():.3f}")
            if st["successes"] is not None:
                lines.append(f"  success    {st['successes'].mean():.3f} ({int(st['successes'].sum())}/{len(lengths)})")
        used, apparent = _disk_usage(self.path)
        lines.append(f"  size       {used / 2**20:.1f} MiB on disk ({apparent / 2**20:.1f} MiB apparent)")
        if self.td is not None:
            lines.append("  keys (per row):")
            for key, v in sorted(_describe_keys(self.td).items()):
                lines.append(f"    {key:<32} {v['dtype'].replace('torch.', ''):<8} {tuple(v['shape'])}")
        return "\n".join(lines)


def load_dataset(path: str | os.PathLike) -> WorldDataset:
    """Open a dataset written by :meth:`torchrl_swm.World.collect`, lazily (memory-mapped).

    Raises:
        DatasetError: the path does not exist or is not a torchrl_swm dataset.

    Examples:
        >>> from torchrl_swm import World, load_dataset
        >>> with World("CartPole-v1", num_envs=4) as world:
        ...     _ = world.collect("data/cartpole", episodes=8, seed=0, progress=False)
        >>> ds = load_dataset("data/cartpole")
        >>> ds.num_episodes, len(ds)              # episodes, transitions
        (8, 170)
        >>> ep = ds.episode(0)                    # TensorDict [L], root = step t, "next" = t + 1
        >>> ep["observation"].shape, ep["next", "observation"].shape
        (torch.Size([41, 4]), torch.Size([41, 4]))
        >>> rb = ds.replay_buffer(num_slices=4, slice_len=8)
        >>> rb.sample().reshape(4, 8).batch_size  # TorchRL samples flat ([32]): [slices, time]
        torch.Size([4, 8])
    """
    return WorldDataset(path)
