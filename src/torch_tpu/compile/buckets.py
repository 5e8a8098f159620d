"""Bounded dynamic shapes for compiled graphs: pad a varying size up to a bucket.

XLA compiles static shapes, so a graph fed every prompt length compiles once
per length. With a bucket policy (torch.compile options `bucket_size`,
`num_dynamic_buckets`, `dynamic_buckets`), each varying size of a graph Dynamo
made dynamic is rounded up to a bucket: the inputs are padded along that
dimension, the graph runs at the bucket's shape, and the results are sliced
back. The number of programs is then bounded by the number of buckets.

Padding must not change the real part of any result. Before any compile,
`check_graph` reads the graph AOTAutograd made with symbolic sizes and
follows every dimension whose size involves a bucketed size ("padded
dimension"). Row-wise work along it (elementwise ops, matmuls whose
contraction is elsewhere, gathers, norms and softmax over other dimensions,
prefix sums) is safe; anything that mixes rows along it (a reduction, softmax
or matmul over it, attention whose keys are the padded rows, `cat` along it,
`x[:, -1]`, using the size as a value, a random op, an op the check does not
know) raises `BucketingError` naming the op: a silent wrong answer is the one
thing bucketing must never produce. Attention is decomposed before the check
(SDPA has no lowering of its own), so a causal mask is not recognised: keys
must come from a static-length axis, as with a preallocated KV cache.

Inputs are padded by repeating their last real row ("edge" padding): pad rows
then hold valid values (no division by zero, indices in range), and while
every op is row-wise they stay copies of the last real row, so a scatter
(`index_copy_` into a static KV cache at the positions of the padded rows)
writes the last real row's value to its own position again. A scatter whose
indices or values may no longer be copies (after a causal attention, a
cumulative sum, an `arange` over the padded size) is refused.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import sympy
import torch

OPTION_NAMES = ("bucket_size", "num_dynamic_buckets", "dynamic_buckets")
_INT_MAX = 2**62


class BucketingError(RuntimeError):
    """A bucketed graph holds an op whose result padding would change."""


# ------------------------------------------------------------------ the policy


@dataclass(frozen=True)
class BucketPolicy:
    """Which size a varying dimension of length n runs at.

    - `dynamic_buckets=(32, 64, 128)`: the smallest listed size >= n.
    - `bucket_size=b` alone: n rounded up to a multiple of b.
    - `num_dynamic_buckets=k` (with `bucket_size=b`, default 16): b, 2b, 4b, ...,
      b * 2**(k-1) — k programs cover lengths up to the last.
    A size above the largest bucket raises `BucketingError` (it would be one more
    program, and the bound is the point)."""

    bucket_size: int | None = None
    num_dynamic_buckets: int | None = None
    dynamic_buckets: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("bucket_size", "num_dynamic_buckets"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(
                    f"torch.compile option {name!r} must be an int >= 1, got {value!r}"
                )
        if self.dynamic_buckets is not None:
            sizes = self.dynamic_buckets
            if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes):
                raise ValueError(
                    f"torch.compile option 'dynamic_buckets' must be ints >= 1, got {sizes!r}"
                )
            if self.bucket_size is not None or self.num_dynamic_buckets is not None:
                raise ValueError(
                    "give either 'dynamic_buckets' or 'bucket_size'/'num_dynamic_buckets'"
                )

    def sizes(self) -> tuple[int, ...] | None:
        """Every bucket, or None where they are unbounded (`bucket_size` alone)."""
        if self.dynamic_buckets is not None:
            return tuple(sorted(set(self.dynamic_buckets)))
        if self.num_dynamic_buckets is None:
            return None
        base = self.bucket_size or 16
        return tuple(base * 2**i for i in range(self.num_dynamic_buckets))

    def bucket(self, n: int) -> int:
        """The size a dimension of length n is padded to."""
        sizes = self.sizes()
        if sizes is None:
            return max(1, math.ceil(n / self.bucket_size)) * self.bucket_size
        for size in sizes:
            if size >= n:
                return size
        raise BucketingError(
            f"a dynamic dimension of size {n} is larger than the largest bucket {sizes[-1]} "
            f"({self.describe()}); raise num_dynamic_buckets/bucket_size or list a larger "
            "size in dynamic_buckets"
        )

    def describe(self) -> str:
        given = {k: getattr(self, k) for k in OPTION_NAMES if getattr(self, k) is not None}
        return ", ".join(f"{k}={v!r}" for k, v in given.items())


def split_options(options: dict | None) -> tuple[BucketPolicy | None, dict]:
    """torch.compile's options -> (bucket policy or None, the XLA compiler options)."""
    options = dict(options or {})
    given = {k: options.pop(k) for k in OPTION_NAMES if k in options}
    if not given:
        return None, options
    if "dynamic_buckets" in given:
        given["dynamic_buckets"] = tuple(given["dynamic_buckets"])
    return BucketPolicy(**given), options


# ----------------------------------------------------------- symbolic sizes


def _free(value) -> frozenset:
    """The symbols of a SymInt (or of an int: none)."""
    if isinstance(value, torch.SymInt):
        return frozenset(value.node.expr.free_symbols)
    return frozenset()


def _val(node):
    if isinstance(node, torch.fx.Node):
        return node.meta.get("val", node.meta.get("example_value"))
    return node


def _dims(value, symbols: frozenset) -> tuple[bool, ...]:
    """Per dimension of a tensor: does its size involve a bucketed symbol?"""
    if not isinstance(value, torch.Tensor):
        return ()
    return tuple(bool(_free(s) & symbols) for s in value.shape)


def _padded(value, symbols: frozenset) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_padded(v, symbols) for v in value)
    return any(_dims(value, symbols))


def _sym_arg(arg, symbols: frozenset) -> bool:
    """A size argument (SymInt) that involves a bucketed symbol."""
    if isinstance(arg, (list, tuple)):
        return any(_sym_arg(a, symbols) for a in arg)
    value = _val(arg)
    return isinstance(value, torch.SymInt) and bool(_free(value) & symbols)


def dynamic_symbols(gm: torch.fx.GraphModule) -> dict:
    """Dynamo graph -> {symbol: [(placeholder index, dim or None)]}: where each plain
    symbol enters (a SymInt input: dim None; a tensor input dimension of exactly that
    size)."""
    found: dict = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for k, node in enumerate(placeholders):
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.SymInt) and value.node.expr.is_Symbol:
            found.setdefault(value.node.expr, []).append((k, None))
        elif isinstance(value, torch.Tensor):
            for d, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    found.setdefault(size.node.expr, []).append((k, d))
    return found


# ------------------------------------------------------------------ the check

_ROWWISE = {  # ops that treat each index of every dimension on its own (besides pointwise)
    "clone", "_to_copy", "copy", "alias", "detach", "lift_fresh_copy", "contiguous",
    "expand", "permute", "transpose", "t", "unsqueeze", "squeeze", "view", "_unsafe_view",
    "reshape", "embedding", "index_select", "gather", "index", "masked_fill", "where",
    "zeros_like", "ones_like", "full_like", "empty_like", "fill", "zero",
    "_native_batch_norm_legit_no_training",
}  # fmt: skip
_FACTORIES = {"zeros", "ones", "full", "empty", "new_zeros", "new_ones", "new_full",
              "new_empty", "empty_strided", "scalar_tensor"}  # fmt: skip
_SCANS = {"cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"}  # prefix sums: rows < n
_CONTRACTIONS = {  # op -> (input index, dim) pairs contracted
    "mm": ((0, 1), (1, 0)), "addmm": ((1, 1), (2, 0)), "bmm": ((0, 2), (1, 1)),
    "baddbmm": ((1, 2), (2, 1)), "mv": ((0, 1), (1, 0)), "dot": ((0, 0), (1, 0)),
}  # fmt: skip
_SCATTERS = {"index_put", "_unsafe_index_put", "index_copy", "scatter", "scatter_add",
             "scatter_reduce", "index_add", "index_fill", "masked_scatter"}  # fmt: skip
_NORMS = {"native_layer_norm": 1}  # op -> index of normalized_shape
_ALL_BUT_DIM = {"renorm", "_weight_norm_interface"}  # reduce over every dim except `dim`


def _name(target) -> str:
    return target._schema.name.removeprefix("aten::") if hasattr(target, "_schema") else ""


def _reduced_dims(node: torch.fx.Node, rank: int) -> tuple[int, ...] | None:
    """The dims a `dim`-taking op reduces over; None when it has no dim argument."""
    schema = node.target._schema
    for k, argument in enumerate(schema.arguments):
        if argument.name != "dim":
            continue
        default = argument.default_value
        value = node.args[k] if k < len(node.args) else node.kwargs.get("dim", default)
        if value is None or value == []:
            return tuple(range(rank))
        dims = value if isinstance(value, (list, tuple)) else [value]
        return tuple(d % rank if rank else 0 for d in dims)
    return None


def _is_pointwise(target) -> bool:
    return torch.Tag.pointwise in getattr(target, "tags", ())


def check_graph(graph: torch.fx.Graph, symbols: frozenset, graph_name: str) -> dict:
    """Raise BucketingError unless padding every dimension sized by `symbols` leaves the
    real part of every result unchanged. Returns {symbol: smallest real size the graph
    needs} (a `select` at index i along a padded dimension needs size > i, which only the
    unpadded program would have checked)."""
    copies: dict = {}  # node -> are its pad rows copies of its last real row?
    atoms: dict = {}  # node -> per dim, its size as ordered factors
    min_size: dict = {}

    def refuse(node, why: str):
        raise BucketingError(
            f"torch_tpu: graph {graph_name!r} cannot be bucketed: {node.target} ({node.name}) "
            f"{why}. Padding would change the result. Remove the bucket options "
            f"({', '.join(OPTION_NAMES)}) for this model, or mask the padded positions "
            "(and pass the real length in) so the op stops depending on them."
        )

    for node in graph.nodes:
        value = _val(node)
        if isinstance(value, torch.Tensor) and node.op != "output":
            atoms[node] = _inherit(node, value, atoms)
        if node.op == "placeholder":
            copies[node] = True
            continue
        if node.op != "call_function":
            continue
        target = node.target
        inputs = [a for a in node.all_input_nodes if isinstance(_val(a), torch.Tensor)]
        padded_inputs = [a for a in inputs if any(_dims(_val(a), symbols))]
        out_padded = _padded(value, symbols)
        if not isinstance(target, torch._ops.OpOverload):  # SymInt arithmetic, getitem
            if target is operator.getitem:
                copies[node] = copies.get(node.args[0], True)
            continue
        name = _name(target)
        if not isinstance(value, (torch.Tensor, list, tuple)):  # sym_size and friends
            continue
        if not padded_inputs and not out_padded and not _sym_arg(node.args, symbols):
            copies[node] = True
            continue
        all_copies = all(copies.get(a, True) for a in padded_inputs)
        if name in _FACTORIES or (name == "arange" and not _sym_arg(node.args, symbols)):
            copies[node] = name != "arange"
            continue
        if name == "arange":  # 0..B-1: the real prefix is right; pad rows are not copies
            copies[node] = False
            continue
        if _size_as_value(node, symbols):
            refuse(node, "uses the padded size as a value")
        if name in ("view", "_unsafe_view", "reshape"):
            grouped = _regroup(atoms.get(node.args[0], ()), value.shape, symbols)
            if grouped is None:
                refuse(node, "reshapes a padded dimension into a different order of sizes")
            atoms[node], copies[node] = grouped, all_copies
            continue
        if name in ("select", "slice", "narrow", "unfold", "diagonal", "as_strided"):
            _check_slicing(node, name, symbols, refuse, min_size, atoms)
            copies[node] = all_copies
            continue
        if name == "copy_":  # an input mutation AOTAutograd kept in the graph
            if any(_dims(_val(node.args[0]), symbols)):
                refuse(node, "writes into a padded input (the write would land in its "
                       "padded copy, not in the caller's tensor)")  # fmt: skip
            copies[node] = all_copies
            continue
        if _is_pointwise(target) or name in _ROWWISE:
            copies[node] = all_copies
            continue
        if name in ("triu", "tril"):  # depends on the position: real rows stay right
            copies[node] = False
            continue
        if name in _SCANS:
            copies[node] = False
            continue
        if name in _CONTRACTIONS:
            for index, dim in _CONTRACTIONS[name]:
                dims = _dims(_val(node.args[index]), symbols)
                if dims and dims[dim]:
                    refuse(node, "contracts over a padded dimension (a sum over padded rows)")
            copies[node] = all_copies
            continue
        if name in _NORMS:
            x = _val(node.args[0])
            count = len(node.args[_NORMS[name]])
            if any(_dims(x, symbols)[-count:]):
                refuse(node, "normalizes over a padded dimension")
            copies[node] = all_copies
            continue
        if name in ("cat", "stack"):
            tensors = node.args[0]
            rank = len(_val(tensors[0]).shape)
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            if name == "cat" and any(_dims(_val(t), symbols)[dim % rank] for t in tensors):
                refuse(node, "concatenates along a padded dimension (the padding would sit "
                       "between the pieces)")  # fmt: skip
            copies[node] = all_copies
            continue
        if name in ("split", "split_with_sizes", "unbind", "chunk"):
            rank = len(_val(node.args[0]).shape)
            dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
            if name == "unbind":
                dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            if _dims(_val(node.args[0]), symbols)[dim % rank]:
                refuse(node, "splits along a padded dimension")
            copies[node] = all_copies
            continue
        if name in _SCATTERS:
            _check_scatter(node, name, symbols, refuse, copies)
            copies[node] = all_copies
            continue
        if name in _ALL_BUT_DIM:
            refuse(node, "reduces over the dimensions it is not given, a padded one among them")
        x = _val(node.args[0]) if node.args else None
        reduced = _reduced_dims(node, len(x.shape)) if isinstance(x, torch.Tensor) else None
        if reduced is not None and not target._schema.is_mutable and not _is_random(node):
            if any(_dims(x, symbols)[d] for d in reduced):
                refuse(node, "reduces over a padded dimension")
            copies[node] = all_copies
            continue
        if name in ("sum", "mean", "amax", "amin", "max", "min", "prod", "any", "all", "norm",
                    "var", "std", "argmax", "argmin", "linalg_vector_norm"):  # fmt: skip
            refuse(node, "reduces over a padded dimension")
        if _is_random(node):
            refuse(node, "draws random numbers for a padded shape (they would differ)")
        refuse(node, "is not known to be safe to pad (bucketing knows row-wise ops, "
               "matmuls, reductions over other dimensions and causal attention)")  # fmt: skip

    return min_size


_SIZE_ARGS = {"arange": ("end", "start"), "slice": ("start", "end")}  # checked by their rules


def _size_as_value(node, symbols: frozenset) -> bool:
    """A bucketed size passed where the op reads it as a number rather than a shape (x * n,
    x[:, n - 1]): that number would be the bucket, not n."""
    allowed = _SIZE_ARGS.get(_name(node.target), ())
    schema = node.target._schema
    for k, argument in enumerate(schema.arguments):
        if k < len(node.args):
            arg = node.args[k]
        elif argument.name in node.kwargs:
            arg = node.kwargs[argument.name]
        else:
            continue
        if isinstance(argument.type, torch._C.ListType) or argument.name in allowed:
            continue
        if _sym_arg(arg, symbols):
            return True
    return False


def _is_random(node) -> bool:
    return bool(getattr(node.target, "tags", None)) and torch.Tag.nondeterministic_seeded in (
        node.target.tags
    )


def _check_slicing(node, name, symbols, refuse, min_size, atoms) -> None:
    x = _val(node.args[0])
    dims = _dims(x, symbols)
    if name in ("unfold", "diagonal", "as_strided"):
        if any(dims):
            refuse(node, "reads a padded dimension at computed positions")
        return
    dim = node.args[1] if len(node.args) > 1 else 0
    dim %= len(x.shape)
    if not dims[dim]:
        return
    size = x.shape[dim]
    if len(atoms.get(node.args[0], ((),) * (dim + 1))[dim]) > 1:
        refuse(node, "indexes a dimension that merges a padded size with others")
    if name == "select":
        index = node.args[2]
        if not isinstance(index, int) or index < 0:
            refuse(node, "selects from the end of a padded dimension (x[..., -1] picks padding; "
                   "gather at the real last position instead)")  # fmt: skip
        for symbol in _free(size):
            if size.node.expr == symbol:
                min_size[symbol] = max(min_size.get(symbol, 0), index + 1)
        return
    start = node.args[2] if len(node.args) > 2 else 0
    end = node.args[3] if len(node.args) > 3 else None
    step = node.args[4] if len(node.args) > 4 else 1
    start, end = _val(start), _val(end)
    if name == "narrow":
        refuse(node, "narrows a padded dimension")
    full_end = end is None or (isinstance(end, int) and end >= _INT_MAX) or (
        isinstance(end, torch.SymInt) and end.node.expr == getattr(size, "node", size).expr
    )
    fixed_end = isinstance(end, int) and 0 <= end < _INT_MAX  # x[:, :k]: needs n >= k
    bad_start = start is not None and not (isinstance(start, int) and start >= 0)
    if bad_start or not (full_end or fixed_end) or step != 1:
        refuse(node, "slices a padded dimension relative to its end (the end would be the padding)")
    if fixed_end and not full_end:
        for symbol in _free(size):
            if size.node.expr == symbol:
                min_size[symbol] = max(min_size.get(symbol, 0), end)


def _expr(size):
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)


def _inherit(node, value, atoms: dict) -> tuple:
    """A result's dims as ordered factors ("atoms"), taken from an input dim of the same
    size where there is one (how a merged dim remembers the order of what it merged)."""
    sources = [a for a in node.all_input_nodes if a in atoms]
    if node.target is operator.getitem:
        sources += [a for a in node.args[0].all_input_nodes if a in atoms]
    out = []
    for size in value.shape:
        expr = _expr(size)
        found = next(
            (atoms[a][d] for a in sources for d, s in enumerate(_val(a).shape) if _expr(s) == expr),
            None,
        )
        out.append(found if found is not None else ((expr,) if expr != 1 else ()))
    return tuple(out)


def _regroup(before: tuple, shape, symbols: frozenset) -> tuple | None:
    """A reshape's result dims as runs of the input's atoms in order (static atoms may
    split); None when a padded atom would have to split or change place."""
    pending = [a for dim in before for a in dim if a != 1]
    out = []
    for size in shape:
        target, group, product = _expr(size), [], sympy.Integer(1)
        while sympy.expand(product - target) != 0:
            if not pending:
                return None
            atom = pending.pop(0)
            ratio = sympy.cancel(target / product)
            if atom.is_Integer and ratio.is_Integer and atom > ratio and atom % ratio == 0:
                pending.insert(0, atom // ratio)  # split a static atom
                atom = ratio
            group.append(atom)
            product = product * atom
            if product.is_Integer and target.is_Integer and product > target:
                return None
        out.append(tuple(group))
    if pending:
        return None
    return tuple(out)


def _check_scatter(node, name, symbols, refuse, copies) -> None:
    """A write at positions taken from padded rows is right only when the pad rows of the
    indices and of the values are copies of the last real row (the same write again)."""
    indexing = [a for a in node.all_input_nodes[1:] if any(_dims(_val(a), symbols))]
    if any(_dims(_val(node.args[0]), symbols)):
        refuse(node, "writes into a tensor whose padded rows the write would not skip")
    if indexing and not all(copies.get(a, True) for a in indexing):
        refuse(node, "writes at positions (or values) computed from padded rows that are no "
               "longer copies of the last real row (after an arange, cumsum or causal "
               "attention over the padded size)")  # fmt: skip


def output_sizes(gm: torch.fx.GraphModule, symbols: frozenset) -> list:
    """Per Dynamo graph output: None, or per dim the size expression to slice back to
    (None for a dim that is not padded). A padded output dim must be `s + c`."""
    plans = []
    (outputs,) = gm.graph.output_node().args
    for item in outputs if isinstance(outputs, (list, tuple)) else (outputs,):
        value = _val(item)
        if isinstance(value, torch.SymInt) and _free(value) & symbols:
            plans.append(("int", value.node.expr))
            continue
        if not isinstance(value, torch.Tensor) or not any(_dims(value, symbols)):
            plans.append(None)
            continue
        dims = []
        for size in value.shape:
            free = _free(size) & symbols
            if not free:
                dims.append(None)
                continue
            expr = size.node.expr
            (symbol,) = free if len(free) == 1 else (None,)
            if symbol is None or (expr - symbol).free_symbols:
                raise BucketingError(
                    f"torch_tpu: a graph output has a dimension of size {expr}, which "
                    "merges a padded size with others; bucketing can slice back only "
                    "dimensions of size `n + constant`. Remove the bucket options or "
                    "return the tensor unmerged."
                )
            dims.append(expr)
        plans.append(("tensor", tuple(dims)))
    return plans
