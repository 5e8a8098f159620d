"""What the executor needs to know about one ATen overload's schema, computed once."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class Kind(enum.Enum):
    TENSOR = "tensor"
    OPT_TENSOR = "optional tensor"
    TENSOR_LIST = "tensor list"
    INDEX_LIST = "optional tensor list"  # Tensor?[]: indices, which may live on the CPU
    SCALAR = "scalar"  # a runtime value unless the lowering wants it static
    SCALAR_LIST = "scalar list"  # Scalar[] (foreach ops): each a runtime value, as SCALAR
    STATIC = "static"  # ints, shapes, dtypes, flags: part of the cache key


_KINDS = {
    "Tensor": Kind.TENSOR,
    "Optional[Tensor]": Kind.OPT_TENSOR,
    "List[Tensor]": Kind.TENSOR_LIST,
    "List[Optional[Tensor]]": Kind.INDEX_LIST,
    "number": Kind.SCALAR,
    "Optional[number]": Kind.SCALAR,
    "List[number]": Kind.SCALAR_LIST,
}


@dataclass(frozen=True)
class Arg:
    name: str
    kind: Kind
    kwarg_only: bool
    has_default: bool
    default: object
    written: bool  # the schema marks it (a!)


@dataclass(frozen=True)
class OpSchema:
    op: torch._ops.OpOverload
    args: tuple[Arg, ...]
    return_aliases: tuple[int | None, ...]  # per return: index of the arg it aliases
    tensor_returns: bool  # every return is a Tensor (or Tensor[])
    # per number of positional args given: the defaults of the rest, or None where one
    # of the rest has none (bind without keywords, the common call, in one step)
    defaults_after: tuple = ()

    @property
    def name(self) -> str:
        return f"{self.op._schema.name}.{self.op._overloadname}"  # "aten::add.Tensor"

    def bind(self, args: tuple, kwargs: dict) -> list:
        """All argument values in schema order, defaults filled in."""
        if not kwargs:
            tail = self.defaults_after[len(args)]
            if tail is not None:
                return [*args, *tail]
        values = list(args)
        for arg in self.args[len(args) :]:
            if arg.name in kwargs:
                values.append(kwargs[arg.name])
            elif arg.has_default:
                values.append(arg.default)
            else:
                raise TypeError(f"{self.name}() missing argument {arg.name!r}")
        return values


def parse(op: torch._ops.OpOverload) -> OpSchema:
    schema = op._schema
    args = []
    for a in schema.arguments:
        kind = _KINDS.get(str(a.type), Kind.STATIC)
        written = bool(a.alias_info and a.alias_info.is_write)
        default = a.default_value
        if isinstance(default, list):
            default = tuple(default)  # specs are cache keys: keep them hashable
        args.append(Arg(a.name, kind, a.kwarg_only, a.has_default_value(), default, written))
    aliases = []
    for r in schema.returns:
        target = None
        if r.alias_info is not None and r.alias_info.is_write:
            for i, a in enumerate(schema.arguments):
                if a.alias_info is not None and a.alias_info.before_set == r.alias_info.before_set:
                    target = i
        aliases.append(target)
    tensor_returns = all(str(r.type) in ("Tensor", "List[Tensor]") for r in schema.returns)
    defaults_after = tuple(
        tuple(a.default for a in args[k:]) if all(a.has_default for a in args[k:]) else None
        for k in range(len(args) + 1)
    )
    return OpSchema(op, tuple(args), tuple(aliases), tensor_returns, defaults_after)
