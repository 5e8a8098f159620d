"""`torch-tpu migrate PATH... [--write] [--diff]`: rewrite the CUDA-specific parts of a
PyTorch program for the tpu device.

Rewriting goes through libcst, so comments and formatting survive and a file that
does not parse is reported and left untouched. Nothing is written without
`--write`. The rewrite is idempotent: its output has nothing left to rewrite.
What cannot be migrated (CUDA extensions, Triton, CuPy, CUDA graphs, NCCL tuning)
is listed with file:line and a suggestion.

Exit status: 0 nothing needs a person, 1 something listed needs one, 2 a path
could not be read or parsed.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

# torch.cuda.<name> -> torch.accelerator.<name>: device-generic, so the migrated program
# still runs where no accelerator is present
_ON_ACCELERATOR = {
    "is_available": "is_available",
    "device_count": "device_count",
    "synchronize": "synchronize",
    "current_device": "current_device_index",
    "set_device": "set_device_index",
    "current_stream": "current_stream",
    "empty_cache": "empty_cache",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "memory_stats": "memory_stats",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
}
# torch.cuda.<name> -> torch.tpu.<name>: the same function on the tpu device module
_SAME_ON_TPU = frozenset(
    """manual_seed manual_seed_all seed seed_all initial_seed get_rng_state set_rng_state
    get_rng_state_all set_rng_state_all get_device_name get_device_properties Stream Event
    default_stream stream device is_bf16_supported""".split()
)
# torch.cuda.<name> that has no tpu counterpart: what to do instead
_NO_COUNTERPART = {
    "graphs": "CUDA graphs: use torch.compile(backend='tpu') or fused eager mode instead",
    "graph": "CUDA graphs: use torch.compile(backend='tpu') or fused eager mode instead",
    "CUDAGraph": "CUDA graphs: use torch.compile(backend='tpu') or fused eager mode instead",
    "make_graphed_callables": "CUDA graphs: use torch.compile(backend='tpu') instead",
    "nvtx": "NVTX ranges: use jax.profiler / torch.profiler annotations",
    "set_per_process_memory_fraction": "XLA manages device memory: see XLA_PYTHON_CLIENT_* "
    "variables",
}
_MANUAL_IMPORTS = {
    "triton": "Triton kernels do not run on TPU: write the kernel in JAX or Pallas "
    "(torch.tpu.pallas.jax_op) or as PyTorch ops",
    "cupy": "CuPy arrays live on CUDA: use torch or jax.numpy on the tpu device",
    "torch.utils.cpp_extension": "custom CUDA/C++ extensions cannot run on TPU: express "
    "the op in PyTorch ops or JAX/Pallas",
    "pynvml": "NVML queries GPUs: use torch.tpu.get_device_properties / memory_stats",
    "apex": "apex is CUDA-only: use torch.optim (fused/foreach) and torch.autocast",
}
_LOW_PRECISION_HALF = ("torch.float16", "torch.half")
_SET_DEVICE = ("torch.accelerator.set_device_index", "torch.tpu.set_device")


@dataclass
class Finding:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class FileResult:
    path: str
    original: str
    migrated: str | None = None  # None: could not be parsed
    changes: list[Finding] = field(default_factory=list)
    manual: list[Finding] = field(default_factory=list)
    error: str | None = None


def _dotted(node: cst.BaseExpression) -> str | None:
    """'torch.cuda.amp.autocast' for that attribute chain, None for anything else."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def _attribute(dotted: str) -> cst.BaseExpression:
    node: cst.BaseExpression = cst.Name(dotted.split(".")[0])
    for part in dotted.split(".")[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def _string_value(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.SimpleString):
        try:
            return node.evaluated_value if isinstance(node.evaluated_value, str) else None
        except Exception:  # byte strings and odd prefixes: not a device name
            return None
    return None


def _with_value(node: cst.SimpleString, value: str) -> cst.SimpleString:
    quote = node.quote
    prefix = node.prefix
    return node.with_changes(value=f"{prefix}{quote}{value}{quote}")


def _cuda_device_string(value: str) -> str | None:
    """'cuda' -> 'tpu', 'cuda:0' -> 'tpu:0'; None when value is no CUDA device name."""
    if value == "cuda":
        return "tpu"
    if value.startswith("cuda:") and value[5:].isdigit():
        return "tpu:" + value[5:]
    return None


class _Migrator(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.changes: list[Finding] = []
        self.manual: list[Finding] = []
        self._dropped: set[int] = set()  # ids of statements to remove from their block

    # ------------------------------------------------------------- reporting

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def _changed(self, node: cst.CSTNode, message: str) -> None:
        self.changes.append(Finding(self.path, self._line(node), message))

    def _needs_person(self, node: cst.CSTNode, message: str) -> None:
        self.manual.append(Finding(self.path, self._line(node), message))

    # ------------------------------------------------------------ statements

    def leave_SimpleStatementLine(self, original, updated):
        """Drop cuDNN/TF32 switches and torch.cuda.set_device: one tpu device per
        process, no cuDNN, no TF32."""
        if len(updated.body) != 1:
            return updated
        stmt = updated.body[0]
        target = None
        if isinstance(stmt, cst.Assign) and len(stmt.targets) == 1:
            target = _dotted(stmt.targets[0].target)
        if target and target.startswith(("torch.backends.cudnn.", "torch.backends.cuda.")):
            self._changed(original, f"removed {target} (a CUDA-only switch)")
            return self._drop(updated)
        if isinstance(stmt, cst.Expr) and isinstance(stmt.value, cst.Call):
            name = _dotted(stmt.value.func)
            if name in _SET_DEVICE and stmt.value.args:
                first = stmt.value.args[0].value
                if not (isinstance(first, cst.Integer) and first.value == "0"):
                    self._changed(
                        original,
                        f"removed {name}(...): each process has one tpu device; tpu_dist "
                        "gives each rank the device of its LOCAL_RANK",
                    )
                    return self._drop(updated)
        return updated

    def _drop(self, statement: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        """Mark a statement for removal by its block, which hands the blank lines and
        comments above it to the next statement (libcst's own removal loses them)."""
        self._dropped.add(id(statement))
        return statement

    def _without_dropped(self, body) -> list:
        kept, carried = [], []
        for statement in body:
            if id(statement) in self._dropped:
                carried.extend(statement.leading_lines)
                continue
            if carried and hasattr(statement, "leading_lines"):
                statement = statement.with_changes(
                    leading_lines=[*carried, *statement.leading_lines]
                )
                carried = []
            kept.append(statement)
        return kept, carried

    def leave_Module(self, original, updated):
        body, carried = self._without_dropped(updated.body)
        return updated.with_changes(body=body, footer=[*carried, *updated.footer])

    def leave_IndentedBlock(self, original, updated):
        body, _ = self._without_dropped(updated.body)
        return updated.with_changes(body=body or [cst.SimpleStatementLine([cst.Pass()])])

    # ----------------------------------------------------------------- imports

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            self._check_import(node, _dotted(alias.name) or "")

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = _dotted(node.module) if node.module is not None else ""
        self._check_import(node, module or "")
        if module in ("torch.cuda.amp", "torch.cuda"):
            self._needs_person(
                node,
                f"`from {module} import ...`: call torch.autocast('tpu', dtype=torch.bfloat16)"
                " and torch.amp.GradScaler('tpu', enabled=False) through the torch "
                "namespace instead, then run migrate again",
            )

    def _check_import(self, node: cst.CSTNode, module: str) -> None:
        for prefix, advice in _MANUAL_IMPORTS.items():
            if module == prefix or module.startswith(prefix + "."):
                self._needs_person(node, f"import of {module}: {advice}")

    # ------------------------------------------------------------- expressions

    def leave_SimpleString(self, original, updated):
        value = _string_value(updated)
        if value is None:
            return updated
        device = _cuda_device_string(value)
        if device is not None:
            self._changed(original, f"device {value!r} -> {device!r}")
            return _with_value(updated, device)
        if value == "nccl":
            self._changed(original, "backend 'nccl' -> 'tpu_dist'")
            return _with_value(updated, "tpu_dist")
        if value.startswith("NCCL_"):
            self._needs_person(
                original,
                f"{value}: NCCL tuning has no effect on tpu_dist (XLA collectives); remove it",
            )
        return updated

    def leave_FormattedString(self, original, updated):
        """f"cuda:{local_rank}" -> "tpu": under torchrun each process sees its own device."""
        first = updated.parts[0] if updated.parts else None
        if isinstance(first, cst.FormattedStringText) and first.value.startswith("cuda:"):
            self._changed(original, 'per-rank device f"cuda:{...}" -> "tpu"')
            return cst.SimpleString('"tpu"')
        return updated

    def leave_BinaryOperation(self, original, updated):
        """ "cuda:" + str(rank) -> "tpu": under torchrun each process sees its own device."""
        if isinstance(updated.operator, cst.Add) and _string_value(updated.left) == "cuda:":
            self._changed(original, 'per-rank device "cuda:" + ... -> "tpu"')
            return cst.SimpleString('"tpu"')
        return updated

    def leave_Attribute(self, original, updated):
        name = _dotted(updated)
        if name is None or not name.startswith("torch.cuda."):
            return updated
        parts = name.split(".")
        member = parts[2]
        if len(parts) == 3 and member in _ON_ACCELERATOR:
            new = f"torch.accelerator.{_ON_ACCELERATOR[member]}"
            self._changed(original, f"{name} -> {new}")
            return _attribute(new)
        if len(parts) == 3 and member in _SAME_ON_TPU:
            self._changed(original, f"{name} -> torch.tpu.{member}")
            return _attribute(f"torch.tpu.{member}")
        if len(parts) > 3:
            return updated  # reported once, at its torch.cuda.<member> prefix
        if member in _NO_COUNTERPART:
            self._needs_person(original, f"{name}: {_NO_COUNTERPART[member]}")
        elif member != "amp":
            self._needs_person(
                original, f"{name} has no tpu counterpart that migrate knows: port it by hand"
            )
        return updated

    def leave_Call(self, original, updated):
        func = _dotted(updated.func)
        if func in ("torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"):
            return self._autocast(original, updated, device_given=False)
        if func in ("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"):
            return self._autocast(original, updated, device_given=True)
        if func in ("torch.cuda.amp.GradScaler", "torch.amp.GradScaler"):
            return self._grad_scaler(original, updated, func)
        if func == "torch.device" and updated.args:
            first = updated.args[0].value
            if _string_value(first) == "tpu" and len(updated.args) == 2:
                self._changed(original, "torch.device('cuda', i) -> torch.device('tpu')")
                return updated.with_changes(args=[updated.args[0].with_changes(comma=None)])
        if isinstance(updated.func, cst.Attribute) and updated.func.attr.value == "cuda":
            if _dotted(updated.func) != "torch.cuda":
                return self._dot_cuda(original, updated)
        if func == "torch.compile":
            for arg in updated.args:
                if arg.keyword and arg.keyword.value == "backend":
                    if _string_value(arg.value) == "inductor":
                        self._needs_person(
                            original,
                            "torch.compile(backend='inductor') cannot compile tpu tensors: "
                            "drop the argument (tpu tensors pick backend='tpu')",
                        )
        return updated

    def _dot_cuda(self, original, updated):
        """x.cuda(), x.cuda(i), x.cuda(non_blocking=True) -> x.to("tpu", ...)."""
        kept = [a for a in updated.args if a.keyword and a.keyword.value != "device"]
        args = [cst.Arg(cst.SimpleString('"tpu"'))] + kept
        args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]
        self._changed(original, '.cuda() -> .to("tpu")')
        return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("to")), args=args)

    def _autocast(self, original, updated, device_given: bool):
        args = list(updated.args)
        device = None
        if device_given:
            for i, arg in enumerate(args):
                if (arg.keyword is None and i == 0) or (
                    arg.keyword is not None and arg.keyword.value == "device_type"
                ):
                    device = _string_value(arg.value)
            if device not in ("tpu",):
                return updated  # another device (cpu) or not a literal: leave it
        dtype_index = next(
            (i for i, a in enumerate(args) if a.keyword and a.keyword.value == "dtype"), None
        )
        low = cst.Arg(
            keyword=cst.Name("dtype"),
            value=_attribute("torch.bfloat16"),
            equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""),
                whitespace_after=cst.SimpleWhitespace(""),
            ),
        )
        if dtype_index is not None:
            if _dotted(args[dtype_index].value) not in _LOW_PRECISION_HALF:
                return updated if device_given else self._autocast_call(original, args)
            args[dtype_index] = args[dtype_index].with_changes(value=low.value)
            self._changed(original, "autocast float16 -> bfloat16 (the TPU's low precision)")
        elif not device_given:
            args.append(low)
        if device_given:
            return updated.with_changes(args=args)
        return self._autocast_call(original, args)

    def _autocast_call(self, original, args):
        self._changed(original, 'torch.cuda.amp.autocast -> torch.autocast("tpu", bfloat16)')
        device = cst.Arg(cst.SimpleString('"tpu"'))
        args = [device] + args
        args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]
        return cst.Call(func=_attribute("torch.autocast"), args=args)

    def _grad_scaler(self, original, updated, func: str):
        """bfloat16 needs no loss scaling: the scaler stays (its calls still work) but
        disabled."""
        args = list(updated.args)
        if func == "torch.amp.GradScaler":
            if not args or _string_value(args[0].value) not in ("tpu",):
                return updated
            if any(a.keyword and a.keyword.value == "enabled" for a in args):
                first = next(a for a in args if a.keyword and a.keyword.value == "enabled")
                if isinstance(first.value, cst.Name) and first.value.value == "False":
                    return updated  # already migrated
            args = args[1:]
        args = [a for a in args if not (a.keyword and a.keyword.value in ("enabled", "device"))]
        enabled = cst.Arg(
            keyword=cst.Name("enabled"),
            value=cst.Name("False"),
            equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""),
                whitespace_after=cst.SimpleWhitespace(""),
            ),
        )
        new_args = [cst.Arg(cst.SimpleString('"tpu"')), *args, enabled]
        new_args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in new_args]
        self._changed(
            original, 'GradScaler -> torch.amp.GradScaler("tpu", enabled=False) (bf16: no scaling)'
        )
        return cst.Call(func=_attribute("torch.amp.GradScaler"), args=new_args)


def migrate_source(source: str, path: str = "<string>") -> FileResult:
    """The migrated text of one file, what changed and what needs a person."""
    result = FileResult(path, source)
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        result.error = f"cannot parse: {str(e).splitlines()[0]} (line {e.raw_line})"
        return result
    migrator = _Migrator(path)
    result.migrated = MetadataWrapper(module).visit(migrator).code
    result.changes = migrator.changes
    result.manual = migrator.manual
    return result


def _python_files(paths: list[str]) -> tuple[list[Path], list[str]]:
    files, missing = [], []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files.extend(sorted(q for q in p.rglob("*.py") if q.is_file()))
        elif p.is_file():
            files.append(p)
        else:
            missing.append(raw)
    return files, missing


def run(paths: list[str], write: bool, diff: bool) -> int:
    files, missing = _python_files(paths)
    status = 0
    for raw in missing:
        print(f"{raw}: no such file or directory", file=sys.stderr)
        status = 2
    changed_files = 0
    manual = 0
    for path in files:
        try:
            source = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            print(f"{path}: cannot read: {e}", file=sys.stderr)
            status = 2
            continue
        result = migrate_source(source, str(path))
        if result.error:
            print(f"{path}: {result.error}; left untouched", file=sys.stderr)
            status = 2
            continue
        for finding in result.changes:
            print(f"{finding}  [migrated]" if write else f"{finding}  [would migrate]")
        for finding in result.manual:
            print(f"{finding}  [needs a person]")
        manual += len(result.manual)
        if result.migrated != source:
            changed_files += 1
            if diff:
                sys.stdout.writelines(
                    difflib.unified_diff(
                        source.splitlines(keepends=True),
                        result.migrated.splitlines(keepends=True),
                        f"a/{path}",
                        f"b/{path}",
                    )
                )
            if write:
                path.write_text(result.migrated)
    verb = "migrated" if write else "would migrate (run with --write to apply)"
    print(f"{len(files)} file(s) read, {changed_files} {verb}, {manual} place(s) need a person")
    if status == 0 and manual:
        status = 1
    return status
