"""The one compilation cache: every XLA executable torch_tpu runs comes from here.

Strict per-op programs, fused segments and torch.compile graphs all call
`compile()`. An executable is keyed by its lowered StableHLO text, the
compiler options, the platform and the JAX version, and kept in memory and
on disk, so a second process running the same program loads what the first
compiled instead of compiling it again.

Disk entries are written atomically (a private temporary file, then
`os.replace`), so processes sharing the directory never see half an entry. The
directory is capped at `TORCH_TPU_CACHE_MAX_BYTES`, least recently used entries
evicted first.

Trust (see `cache_trust.py`): loading an entry unpickles part of it and maps
compiled code, so an entry is code. The directory is used only when it is the
user's own and nobody else can write to it (created 0700, entries 0600), and
every entry carries an HMAC under a secret key kept in the directory: an entry
whose MAC does not verify is never deserialized — it is counted as rejected,
recompiled and replaced. A directory that cannot be used is reported once and
the process runs with the memory layer alone.

Configuration (read when first used; `set_directory` changes it at run time):
- `TORCH_TPU_CACHE_DIR`: the directory (TorchTPU's
  `TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT` is honoured when it is unset);
  default `$XDG_CACHE_HOME/torch_tpu` (`~/.cache/torch_tpu`).
- `TORCH_TPU_PERSISTENT_CACHE=0`: memory only, nothing read from or written to disk.
- `TORCH_TPU_CACHE_MAX_BYTES`: size cap of the directory (default 4 GiB).
- `TORCH_TPU_MAX_EXECUTABLES`: executables kept in memory at most (default 4096).
- `TORCH_TPU_CACHE_KEY_FILE`: a key file shared on purpose (a cache shared between
  users, e.g. a CI fleet); see `cache_trust.py`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib.metadata
import math
import os
import re
import struct
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.experimental import serialize_executable

from . import cache_trust, env, mappings, metrics, platform

_MAGIC = b"TTPUXC2\n"
_OLDER_MAGIC = b"TTPUXC1\n"  # unauthenticated entries of earlier releases: replaced quietly
_HEADER = struct.Struct("<Q32s")  # payload length, HMAC-SHA256 of (magic, key, length, payload)
_SUFFIX = ".xc"
_DEFAULT_MAX_BYTES = 4 << 30

_memory: dict[str, Callable] = {}
_clear_hooks: list[Callable[[], None]] = []  # lookup tables that point into _memory
_stats: Counter = Counter()
_options: dict[str, object] = {}
_directory: Path | None = None
_configured = False
_disk_bytes: int | None = None  # running estimate, from a scan at first write
_trusted: cache_trust.Trusted | None = None  # the checked directory and its MAC key
_problem: str | None = None  # why the directory is not used, once found
_warned: set[str] = set()  # warning categories already shown for this directory
_RUNTIME = f"jax {jax.__version__} jaxlib {importlib.metadata.version('jaxlib')}"
# executables kept in memory at most (TORCH_TPU_MAX_EXECUTABLES): ~5.5 GB of small
# programs' code on XLA:CPU, far above a training step's working set (gpt_small's strict
# step: 115 programs; efficientnet_b0's: ~1100), which a lower bound would make recompile
# or reload at every step
_DEFAULT_IN_MEMORY = 4096
_CHECK_EVERY = 64  # new executables between two looks at the process's memory mappings
_FEWEST_TO_FORGET = 256  # with fewer executables in memory, forgetting them frees too little
_new_executables = 0  # since the last look


# ------------------------------------------------------------------ config


def _configure() -> None:
    global _directory, _configured
    _configured = True
    if not env.flag("TORCH_TPU_PERSISTENT_CACHE", default=True):
        _directory = None
        return
    root = os.environ.get("TORCH_TPU_CACHE_DIR") or os.environ.get(
        "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"
    )
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "torch_tpu")
    _directory = Path(root)


def directory() -> Path | None:
    """The persistent cache directory, or None when the disk cache is off."""
    if not _configured:
        _configure()
    return _directory


def set_directory(path: str | os.PathLike | None) -> None:
    """Use another directory from now on (None: memory only). The memory layer is kept."""
    global _directory, _configured, _disk_bytes
    _configured = True
    _directory = None if path is None else Path(path)
    _disk_bytes = None
    _forget_trust()


def _forget_trust() -> None:
    global _trusted, _problem
    _trusted = None
    _problem = None
    _warned.clear()  # a new directory: its problems are news


def _usable() -> cache_trust.Trusted | None:
    """The checked directory and its key, or None (memory only) with the reason warned
    about once per process and kept for `problem()`."""
    global _trusted, _problem
    if _trusted is not None or _problem is not None:
        return _trusted
    root = directory()
    if root is None:
        return None
    try:
        _trusted = cache_trust.open_directory(root)
    except cache_trust.UntrustedDirectory as e:
        _problem = str(e)
        _warn_once("unusable", f"{e}; compiling without a persistent cache in this process")
    return _trusted


def problem() -> str | None:
    """Why the configured directory is not used (None when it is fine or the disk cache
    is off). Checks the directory if this process has not yet."""
    _usable()
    return _problem


def max_bytes() -> int:
    return env.integer("TORCH_TPU_CACHE_MAX_BYTES", _DEFAULT_MAX_BYTES, 0)


@contextlib.contextmanager
def compiler_options(**options: object) -> Iterator[None]:
    """XLA compiler options for every compile inside the block (they are part of the key).
    Nested blocks add to, and may override, the outer options. Entering and leaving
    forgets which executable each op or segment uses (the executables stay cached
    under their options), so ops inside the block run with the block's options."""
    global _options
    saved = _options
    _options = {**saved, **options}
    forget_lookups()
    try:
        yield
    finally:
        _options = saved
        forget_lookups()


# ----------------------------------------------------------------- compile


def compile(
    fn: Callable,
    example_args: tuple,
    *,
    kind: str,
    name: str,
    signature: list[tuple] | None = None,
    options: dict | None = None,
    donate_argnums: tuple[int, ...] = (),
    traced=None,
) -> Callable:
    """An executable for fn at the avals of example_args, from memory, disk or XLA.

    kind ("op", "segment", "graph", ...) and name (stable for the same code) say what
    is compiled, for metrics and recompile diagnostics; signature lists the inputs
    as (name, shape, dtype) so that a recompile can say which one changed. options are
    XLA compiler options for this executable, on top of any `compiler_options` block.
    donate_argnums: arguments whose buffers the executable may reuse for its results
    (they are deleted by each call; the lowered text records the aliasing, so the key
    tells donating and plain executables apart). traced: fn already traced at
    example_args (`jax.jit(fn).trace`, no donation), by a caller that looked at it first.
    """
    key, lowered, options, executable = _prepare(
        fn, example_args, kind, options, donate_argnums, traced
    )
    if executable is None:
        executable, seconds = _timed_compile(lowered, options, kind, name)
        _file(key, executable, seconds, kind, name, signature)
    return executable


def compile_soon(
    fn: Callable,
    example_args: tuple,
    *,
    kind: str,
    name: str,
    signature: list[tuple] | None = None,
    donate_argnums: tuple[int, ...] = (),
    traced=None,
) -> Callable | Compiling:
    """`compile`, with XLA's part on a worker thread (`env.compile_threads()`): tracing,
    lowering and the cache lookups run here, so a lowering's error is raised here.
    Returns the executable when memory or disk held it, else a `Compiling`. Once the
    interpreter is exiting (the workers are gone) it compiles here, as `compile`."""
    key, lowered, options, executable = _prepare(
        fn, example_args, kind, None, donate_argnums, traced
    )
    if executable is not None:
        return executable
    future = _in_flight.get(key)
    if future is None:  # (two ops lowered to one program share its compile)
        try:
            future = _workers().submit(_timed_compile, lowered, options, kind, name)
        except RuntimeError:  # (exiting: "cannot schedule new futures after shutdown")
            executable, seconds = _timed_compile(lowered, options, kind, name)
            _file(key, executable, seconds, kind, name, signature)
            return executable
        _in_flight[key] = future
    return Compiling(future, key, (kind, name, signature), lowered, options)


class Compiling:
    """An executable compiling on a worker thread (`compile_soon`). `result()` waits
    for it, files it as `compile` does (metrics, disk, memory) and returns it; it raises
    XLA's error, if any. Call it from the thread that started the compile. A compile
    still queued when the interpreter began to exit was cancelled (`_cancel_queued`):
    it runs here then, for a read in an atexit handler (a last checkpoint, a log)."""

    __slots__ = ("future", "key", "about", "lowered", "options", "executable")

    def __init__(self, future, key: str, about: tuple, lowered, options: dict) -> None:
        self.future = future
        self.key = key
        self.about = about  # (kind, name, signature)
        self.lowered, self.options = lowered, options
        self.executable = None

    def result(self) -> Callable:
        if self.executable is None:
            try:
                try:
                    executable, seconds = self.future.result()
                except CancelledError:
                    kind, name, _ = self.about
                    executable, seconds = _timed_compile(self.lowered, self.options, kind, name)
            except BaseException:
                _in_flight.pop(self.key, None)  # (the next call of it compiles again)
                raise
            if _in_flight.pop(self.key, None) is not None:  # (the first sharer files it)
                _file(self.key, executable, seconds, *self.about)
            self.executable = executable
            self.lowered = self.options = None  # (kept only for a cancelled compile)
        return self.executable


_in_flight: dict = {}  # key -> the Future of its compile, until filed
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, workers)


def _workers() -> ThreadPoolExecutor:
    """The compile threads of this process (a forked child makes its own: the parent's
    threads do not exist there, and work given to them would never run)."""
    global _pool
    if _pool is None or _pool[0] != os.getpid():
        _in_flight.clear()
        _pool = (os.getpid(), ThreadPoolExecutor(env.compile_threads(), "torch_tpu-compile"))
        # run before concurrent.futures' own exit hook (registered at its import, so
        # earlier: these hooks run last-registered first), which waits for the queue
        threading._register_atexit(_cancel_queued)
    return _pool[1]


def _cancel_queued() -> None:
    """At interpreter exit: drop the compiles not yet started, so the exit waits for
    the running ones only (a script ending with unread first calls waited for every
    queued compile: about 1.5 s more after 120 first calls at 40 shapes). A later read
    compiles what it needs itself (`Compiling.result`, `compile_soon`)."""
    if _pool is not None and _pool[0] == os.getpid():
        _pool[1].shutdown(wait=False, cancel_futures=True)


def _prepare(fn, example_args, kind, options, donate_argnums, traced) -> tuple:
    """(key, lowered, options, the executable from memory or disk or None)."""
    if traced is None or donate_argnums:
        traced = _trace(fn, example_args, donate_argnums)
    lowered = _lower(traced)
    options = {**_default_options(kind, traced), **_options, **(options or {})}
    if "float64" not in _warned and platform.platform() == "tpu":
        _warn_of_emulated_float64(traced)
    text = _program_text(lowered)
    key = _key(_placement_free(text) if kind == "op" else text, options)
    executable = _memory.get(key)
    if executable is not None:
        _stats["memory_hits"] += 1
        return key, lowered, options, executable
    executable = _load(key, lowered)
    if executable is not None:
        _make_room()
        _memory[key] = executable
    return key, lowered, options, executable


def _timed_compile(lowered, options: dict, kind: str, name: str) -> tuple:
    start = time.perf_counter()
    return _xla_compile(lowered, options, kind, name), time.perf_counter() - start


def _file(key: str, executable, seconds: float, kind: str, name: str, signature) -> None:
    """Record a new compile, write it to disk and keep it in memory."""
    metrics.record_compile(seconds, kind, name, signature)
    _store(key, executable)
    _make_room()
    _memory[key] = executable


def max_in_memory() -> int:
    return env.integer("TORCH_TPU_MAX_EXECUTABLES", _DEFAULT_IN_MEMORY, 1)


def _make_room() -> None:
    """Forget every executable in memory when they reach TORCH_TPU_MAX_EXECUTABLES (each
    holds its code and buffers: about 1.35 MB for a small op's on XLA:CPU, so a program
    that compiles for every new shape grew by that per shape without bound), or, looked
    at every _CHECK_EVERY new executables, when the process's memory mappings near the
    kernel's cap (`mappings.py`; a crash in the next compile would lose the job). Every
    lookup table lets go too, so their code is unmapped; those used again are loaded
    back from disk (a fraction of a millisecond) or recompiled."""
    global _new_executables
    most = max_in_memory()
    if len(_memory) >= most:
        _stats["memory_resets"] += 1
        _warn_once(
            "count",
            f"{len(_memory)} executables in memory (TORCH_TPU_MAX_EXECUTABLES={most}): "
            "forgetting them; those used again are reloaded from the disk cache or "
            "recompiled. A program that compiles for every new shape (see "
            "torch_tpu.metrics.report()) may want bucketing (docs/architecture.md)",
        )
        _memory.clear()
        forget_lookups()
        return
    _new_executables += 1
    if _new_executables < _CHECK_EVERY or len(_memory) < _FEWEST_TO_FORGET:
        return
    _new_executables = 0
    near = mappings.near_cap()
    if near is None:
        return
    used, cap = near
    _stats["memory_resets"] += 1
    _warn_once(
        "mappings",
        f"{len(_memory)} executables in memory and {used} of this process's {cap} memory "
        "mappings (vm.max_map_count) in use: forgetting the executables before compiling "
        "fails; those used again are reloaded from the disk cache or recompiled",
    )
    _memory.clear()
    forget_lookups()


# XLA:CPU compiles a small program about a third faster with its older fusion emitters
# (LLVM IR emitted directly; the default MLIR emitters set up an MLIR context per
# fusion). The two emitters' approximations of transcendental functions differ (tan,
# atan, erfc, cbrt, float16 log, ...), and reductions may be ordered differently, so
# only programs made of exactly rounded elementwise arithmetic and data movement use
# them: their results are the same bits either way (tests/test_first_call.py). Their
# code runs slower on big arrays, so only small per-op programs qualify; a strict op's
# first call at a new shape is mostly compile time. They also compile at LLVM
# optimization level 1 instead of XLA's default 3 (a quarter less compile time; a
# 4096-element program runs as fast; level 0 would run it 3-4x slower), with the same
# bits again (the same test).
_SMALL_PROGRAM_ELEMENTS = 1 << 12
_SMALL_PROGRAM_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}
_EXACT_PRIMITIVES = frozenset(
    """add sub mul div neg abs max min sign floor ceil round sqrt clamp select_n
    eq ne lt le gt ge and or not xor shift_left shift_right_logical shift_right_arithmetic
    convert_element_type bitcast_convert_type reshape transpose broadcast_in_dim squeeze
    expand_dims slice dynamic_slice dynamic_update_slice concatenate pad iota copy copy_p
    gather scatter rev pjit jit closed_call custom_jvp_call custom_vjp_call
    random_bits random_wrap random_unwrap random_seed random_fold_in threefry2x32""".split()
)


# XLA on a TPU (and XLA:GPU) may skip a rounding a program asks for: a bfloat16 or
# float16 value widened again in the same program keeps its float32 bits ("excess
# precision"). CPU rounds every op's result, so every program there is compiled without
# it: on a v5e, `add(bf16, bf16, out=float32)` then gives CPU's rounded sum, and an
# autocast MLP's losses are the same bits in strict, fused and compiled mode (without it
# the three differed, and the sum kept its float32 bits). XLA:CPU already rounds.
_ROUNDED_AS_ASKED = {"xla_allow_excess_precision": False}


def _default_options(kind: str, traced) -> dict:
    if platform.platform() != "cpu":
        return _ROUNDED_AS_ASKED
    if kind != "op":
        return {}
    jaxpr = traced.jaxpr
    avals = list(jaxpr.in_avals) + list(jaxpr.out_avals)
    if any(math.prod(getattr(a, "shape", ())) > _SMALL_PROGRAM_ELEMENTS for a in avals):
        return {}
    if any(jnp.issubdtype(getattr(a, "dtype", jnp.float32), jnp.complexfloating) for a in avals):
        return {}  # (complex products may be contracted differently)
    if not _only_exact(jaxpr.jaxpr):
        return {}
    return _SMALL_PROGRAM_OPTIONS


def _warn_of_emulated_float64(traced) -> None:
    """A TPU has no float64 arithmetic: XLA emulates it with pairs of float32, with
    float32's exponent range. Measured on a v5e: float64 `x * 1e300` gave inf, `x * 1e-45`
    gave 0 and `-0.0 * 1.5` gave 0.0, where CPU keeps all three; no error says so.
    Results are looked at, not arguments: Python numbers travel as float64 scalars."""
    if any(getattr(a, "dtype", None) == jnp.float64 for a in traced.jaxpr.out_avals):
        _warn_once(
            "float64",
            "float64 on a TPU is emulated by XLA with float32's exponent range: magnitudes "
            "above about 3.4e38 become inf, below about 1.2e-38 become 0, and about 3 more "
            "digits than float32 are kept, not float64's 16 (docs/differences.md). Results "
            "can differ from CPU's without an error; compute in float32, or keep float64 "
            "work on the CPU",
        )


def _only_exact(jaxpr) -> bool:
    """Whether every primitive of the jaxpr (and of the jaxprs it calls) is exact."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name not in _EXACT_PRIMITIVES:
            return False
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns") and not _only_exact(inner):
                    return False
    return True


# The phases of a compile, as functions of their own so that
# benchmarks/bench_first_call.py can time each one.


def _trace(fn: Callable, example_args: tuple, donate_argnums: tuple[int, ...] = ()):
    """A donating program keeps its unused arguments: JAX drops them before it pairs each
    donated input with the first result of its shape, so a donated buffer the program
    only overwrites (fill_, an optimizer's zeros_like state) shifted every later pairing
    by one, and XLA copied around the mismatches (a 738 MB temporary in fused AdamW's
    first step). Kept, it is paired with its own new value and written in place."""
    jitted = jax.jit(fn, donate_argnums=donate_argnums, keep_unused=bool(donate_argnums))
    return jitted.trace(*example_args)


def _lower(traced):
    return traced.lower()


def _program_text(lowered) -> str:
    """The program as its key sees it: the argument avals and result tree, the
    arguments it reads, and its text. The HLO omits unused arguments, so two programs
    of one name (every fused segment is `segment`) that read different arguments of the
    same avals had equal text: a fused `clone` then `abs_` loaded the executable of a
    segment that read its other input, and returned that input's zeros."""
    kept = sorted(lowered._lowering.compile_args["kept_var_idx"])
    return f"{lowered.in_avals}\n{lowered.out_tree}\nreads {kept}\n{lowered.as_text()}"


# A single-device placement in a program's text: committed inputs lower with it,
# uncommitted ones (a factory's results) and abstract ones without. Strict mode
# compiles an op from its inputs' avals when they are still pending, so the same op
# could lower either way from one run to the next; both programs are the same.
_EMPTY_MESH = re.compile(r"\n *sdy\.mesh @empty_mesh = <\[\]> \{[^\n]*\}")
_EMPTY_MESH_SHARDING = re.compile(
    r"(, )?sdy\.sharding = #sdy\.sharding<@empty_mesh, \[(?:\{\}|, )*\]>(, )?"
)


def _placement_free(text: str) -> str:
    """A per-op program's text without single-device placements (its cache key)."""
    text = _EMPTY_MESH.sub("", text)
    text = _EMPTY_MESH_SHARDING.sub(lambda m: ", " if m.group(1) and m.group(2) else "", text)
    return text.replace(" {}", "")


def _xla_compile(lowered, options: dict, kind: str, name: str):
    try:
        return lowered.compile(compiler_options=options or None)
    except Exception as e:
        if options:
            raise RuntimeError(
                f"XLA could not compile {kind} {name!r} with compiler options {options}: {e}"
            ) from e
        raise


def _key(text: str, options: dict) -> str:
    """The entry's name. Serialized executables are bound to their devices, so in a
    multi-process job each process (its index, the job size, its device ids) keys its own."""
    devices = platform.devices()
    h = hashlib.sha256()
    for part in (
        _RUNTIME,
        platform.platform(),
        devices[0].device_kind,
        (jax.process_index(), jax.process_count(), tuple(d.id for d in devices)),
        repr(sorted(options.items())),
        text,
    ):
        h.update(str(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def _path(key: str) -> Path | None:
    trusted = _usable()
    return None if trusted is None else trusted.root / key[:2] / (key + _SUFFIX)


def _load(key: str, lowered) -> Callable | None:
    path = _path(key)
    if path is None:
        return None
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        _stats["disk_misses"] += 1
        return None
    except OSError as e:
        _warn_once("read", f"cannot read compilation cache entry {path}: {e}; compiling instead")
        return None
    if blob.startswith(_OLDER_MAGIC):
        _stats["outdated_entries"] += 1
        return None
    payload = _verified(blob, key, _trusted.secret)
    if payload is _REJECTED:
        _stats["rejected_entries"] += 1
        _warn_once(
            "rejected",
            f"compilation cache entry {path} is not authenticated by this cache's key "
            "(planted, copied from another user, or written with another key); it was not "
            "loaded and is recompiled and replaced",
        )
        return None
    if payload is not None:
        try:
            executable = serialize_executable.deserialize_and_load(
                payload,
                lowered.in_tree,
                lowered.out_tree,
                execution_devices=[platform.device()],
            )
        except Exception as e:  # an entry from an incompatible runtime: treat as corrupt
            payload = None
            reason = f"{type(e).__name__}: {e}"
        else:
            _stats["disk_hits"] += 1
            metrics.count("compile_cache_disk_hits")
            with contextlib.suppress(OSError):
                os.utime(path)  # least recently used eviction goes by mtime
            return executable
    else:
        reason = "bad header, length or checksum"
    _stats["corrupt_entries"] += 1
    _warn_once(
        "corrupt",
        f"compilation cache entry {path} is corrupt ({reason}); recompiling and replacing it",
    )
    return None


_REJECTED = b""  # sentinel: whole entry, MAC does not verify


def _mac(secret: bytes, key: str, payload: bytes) -> bytes:
    """Binds the payload to this cache's key and to the entry's name: an authentic entry
    moved to another name does not verify either."""
    message = _MAGIC + key.encode() + struct.pack("<Q", len(payload))
    mac = hmac.new(secret, message, hashlib.sha256)
    mac.update(payload)
    return mac.digest()


def _verified(blob: bytes, key: str, secret: bytes) -> bytes | None:
    """The payload if the entry is whole and authentic; None if it is damaged (or of an
    older format); _REJECTED if it is whole but its MAC does not verify. Only the
    header is parsed here: nothing is deserialized before the MAC verifies."""
    start = len(_MAGIC) + _HEADER.size
    if len(blob) < start or not blob.startswith(_MAGIC):
        return None
    length, mac = _HEADER.unpack_from(blob, len(_MAGIC))
    payload = blob[start:]
    if len(payload) != length:
        return None
    if not hmac.compare_digest(_mac(secret, key, payload), mac):
        return _REJECTED
    return payload


def _store(key: str, compiled) -> None:
    path = _path(key)
    if path is None:
        return
    try:
        payload, _, _ = serialize_executable.serialize(compiled)
    except (ValueError, NotImplementedError):
        _stats["unserializable"] += 1  # e.g. closed-over constants: stays in memory only
        return
    blob = _MAGIC + _HEADER.pack(len(payload), _mac(_trusted.secret, key, payload)) + payload
    try:
        cache_trust.private_subdirectory(path.parent)
        # mkstemp creates the file 0600: entries are readable by their owner only
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)  # atomic: readers see the old entry or the new, never half
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        _stats["write_errors"] += 1
        _warn_once("write", f"cannot write compilation cache entries in {path.parent.parent}: {e}")
        return
    _stats["disk_writes"] += 1
    _account(len(blob))


def _account(added: int) -> None:
    """Keep the directory under its cap, evicting least recently used entries."""
    global _disk_bytes
    cap = max_bytes()
    if _disk_bytes is None:
        _disk_bytes = sum(size for _, _, size in _entries())
    else:
        _disk_bytes += added
    if _disk_bytes <= cap:
        return
    entries = sorted(_entries(), key=lambda e: e[1])  # oldest mtime first
    total = sum(size for _, _, size in entries)
    for path, _, size in entries:
        if total <= cap:
            break
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            _stats["evictions"] += 1
        total -= size
    _disk_bytes = total


def _entries() -> list[tuple[Path, float, int]]:
    trusted = _usable()
    if trusted is None:
        return []
    root = trusted.root
    out = []
    for path in root.glob("*/*" + _SUFFIX):
        if path.name.startswith(".tmp-"):
            continue
        with contextlib.suppress(FileNotFoundError):
            st = path.stat()
            out.append((path, st.st_mtime, st.st_size))
    return out


def _warn_once(category: str, message: str) -> None:
    """One warning per category and process: a broken directory must not print one
    warning per op."""
    if category in _warned:
        return
    _warned.add(category)
    warnings.warn(f"torch_tpu: {message}", RuntimeWarning, stacklevel=4)


# ------------------------------------------------------------------ public


def stats() -> dict:
    """This process's cache counters, and what the directory holds now."""
    entries = _entries()
    root = directory()
    return {
        "directory": None if root is None else str(root),
        "problem": problem(),
        "disk_entries": len(entries),
        "disk_bytes": sum(size for _, _, size in entries),
        "max_bytes": max_bytes(),
        "memory_entries": len(_memory),
        **{
            k: _stats[k]
            for k in (
                "memory_hits",
                "disk_hits",
                "disk_misses",
                "disk_writes",
                "corrupt_entries",
                "rejected_entries",
                "outdated_entries",
                "write_errors",
                "evictions",
                "unserializable",
                "memory_resets",
            )
        },
    }


def on_clear(hook: Callable[[], None]) -> None:
    """Register an in-memory lookup table of executables (the executor's per-op table,
    fused segments') that clear() and a change of compiler options must empty."""
    _clear_hooks.append(hook)


def forget_lookups() -> None:
    """Empty every registered lookup table (`on_clear`): the next call of each op or
    graph looks its executable up again, through the program it traces now."""
    for hook in _clear_hooks:
        hook()


def clear(disk: bool = True) -> int:
    """Forget every executable in memory and, with disk=True, delete the disk entries.
    Returns the number of disk entries deleted."""
    global _disk_bytes
    _memory.clear()
    forget_lookups()
    removed = 0
    if disk:
        for path, _, _ in _entries():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
        _disk_bytes = None
    return removed
