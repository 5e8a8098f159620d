"""The `tpu_dist` process group: c10d's collective API on XLA collectives.

A Python subclass of c10d's ProcessGroup (c10d offers Python subclasses of
ProcessGroup, not of Backend): `torch.distributed` calls its methods from
Python, and C++ callers (DDP's reducer, `_broadcast_coalesced`, the
functional collectives' default kernels) reach the same methods through
c10d's Python trampoline.

Every collective is one XLA program over the group's mesh (`programs.py`),
dispatched asynchronously; the returned Work waits for it within the
group's timeout. Ranks are group ranks, as in c10d; the mesh is built from
the group's global ranks.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._C._distributed_c10d import ProcessGroup

from .. import platform
from . import programs, runtime
from .tensors import check_device, describe, flat_value, write
from .work import CollectiveError, Launch, TpuWork, settle

_OPS = {
    "SUM": "sum",
    "AVG": "avg",
    "PRODUCT": "product",
    "MIN": "min",
    "MAX": "max",
    "BAND": "band",
    "BOR": "bor",
    "BXOR": "bxor",
}


def reduce_op_name(op) -> str:
    """'sum', 'avg', ... for a c10d ReduceOp (or RedOpType, or a functional op string)."""
    if isinstance(op, str):
        name = op.upper()
    else:
        name = getattr(op, "op", op).name
    if name not in _OPS:
        raise ValueError(f"tpu_dist does not support the reduce op {name}")
    return _OPS[name]


class TpuProcessGroup(ProcessGroup):
    """c10d process group whose collectives are XLA collectives over a JAX mesh."""

    def __init__(
        self, store, rank: int, size: int, timeout: datetime.timedelta, ranks: tuple[int, ...]
    ) -> None:
        super().__init__(rank, size)
        self._store = store
        self._timeout = timeout
        self.global_ranks = ranks  # group rank -> global rank (= JAX process index)
        self._mismatches = 0
        self._name = ""
        self._desc = ""

    # c10d keeps a group's name on its backends; a Python group keeps its own.
    def getBackendName(self) -> str:  # noqa: N802 (c10d's names)
        return "tpu_dist"

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    @property
    def _device_types(self) -> list[torch.device]:
        return [torch.device("tpu")]  # object collectives and barrier pick tpu tensors

    # ---------------------------------------------------------------- plumbing

    def launch(
        self,
        kind: str,
        params: tuple,
        blocks: list,
        described: str,
        writes: Sequence[torch.Tensor] = (),
        deliver=None,
        ranks=None,
    ) -> Launch:
        """Dispatch one collective over the group (or over `ranks`, a subset in group
        order) without waiting for it. Its wait gives `deliver` the output blocks, which
        writes them into `writes` (by default: the first block into the one tensor)."""
        group = self.global_ranks if ranks is None else tuple(self.global_ranks[r] for r in ranks)
        what = f"{kind} on ranks {list(group)}"
        runtime.join_first_use(group, self._timeout, what)
        for t in writes:
            settle(t)  # an unfinished collective writing it comes first
        try:
            outcome = programs.run(kind, group, params, blocks, described)
        except Exception as e:  # the wait raises it, as it would a failure in flight
            outcome = e
        summary = f"{kind}{params} {described}"
        members = tuple(range(self.size())) if ranks is None else tuple(ranks)
        if deliver is None:
            deliver = (lambda out, t=writes[0]: write(t, out[0])) if writes else _ignore
        return Launch(
            what, outcome, list(writes), deliver, lambda: self._mismatch(summary, members)
        )

    def work(self, what: str, launches: list[Launch], result: list) -> TpuWork:
        return TpuWork(
            f"{what} on ranks {list(self.global_ranks)}", self._timeout, launches, result
        )

    def _mismatch(self, summary: str, members: tuple[int, ...]) -> str:
        """The error text when ranks disagreed: each rank's call, read through the store
        (only on this rare path; every rank of the call gets here together)."""
        key = f"tpu_dist/mismatch/{members}/{self._mismatches}"
        self._mismatches += 1
        self._store.set(f"{key}/{self.rank()}", summary)
        keys = [f"{key}/{r}" for r in members]
        try:
            self._store.wait(keys, min(self._timeout, datetime.timedelta(seconds=30)))
            calls = [f"rank {r}: {self._store.get(k).decode()}" for r, k in zip(members, keys)]
        except Exception:
            calls = [f"rank {self.rank()}: {summary}"]
        return (
            "tpu_dist: ranks called mismatched collectives (shape, dtype, op or arguments "
            "differ): " + "; ".join(calls)
        )

    def _single(self, what: str, tensors: list) -> bool:
        for t in tensors:
            check_device(t)
        return self.size() == 1

    # ---------------------------------------------------------------- reductions

    def allreduce(self, tensors, opts=None):
        op = reduce_op_name(opts.reduceOp if opts is not None else "sum")
        if self._single("all_reduce", tensors):
            return self.work("all_reduce", [], tensors)
        launches = []
        for t in tensors:
            launches.append(self.launch("all_reduce", (op,), [flat_value(t)], describe(t), [t]))
        return self.work("all_reduce", launches, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts):
        op, root = reduce_op_name(opts.reduceOp), opts.rootRank
        if self._single("reduce", tensors):
            return self.work("reduce", [], tensors)
        launches = []
        for t in tensors:
            writes = [t] if self.rank() == root else []
            launches.append(
                self.launch("all_reduce", (op,), [flat_value(t)], describe(t) + " reduce", writes)
            )
        return self.work("reduce", launches, tensors)

    def broadcast(self, tensors, opts):
        root = opts.rootRank
        if self._single("broadcast", tensors):
            return self.work("broadcast", [], tensors)
        launches = []
        for t in tensors:
            writes = [t] if self.rank() != root else []
            launches.append(self.launch("broadcast", (root,), [flat_value(t)], describe(t), writes))
        return self.work("broadcast", launches, tensors)

    # ---------------------------------------------------------------- gathers

    def all_gather_single(self, output, input, opts=None):
        self._check_multiple(output, input, "all_gather_into_tensor", "output")
        if self._single("all_gather", [output, input]):
            write(output, flat_value(input))
            return self.work("all_gather", [], [output])
        launch = self.launch("all_gather", (), [flat_value(input)], describe(input), [output])
        return self.work("all_gather", [launch], [output])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._join("all_gather", works, outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def allgather(self, output_lists, inputs, opts=None):
        works = []
        for outputs, input in zip(output_lists, inputs):
            for o in outputs:
                check_device(o)
                if o.numel() != input.numel():
                    raise ValueError("tpu_dist: all_gather outputs must match the input's size")
            works.append(self._gather_rows("all_gather", outputs, input, None))
        return self._join("all_gather", works, output_lists)

    def gather(self, output_lists, inputs, opts):
        root = opts.rootRank
        outputs = output_lists[0] if output_lists else []
        return self._gather_rows("gather", outputs, inputs[0], root)

    def _gather_rows(self, what: str, outputs: list, input, root):
        """All-gather input; write rank j's block to outputs[j] (on `root` only, if set)."""
        if self._single(what, [input, *outputs]):
            if outputs:
                write(outputs[0], flat_value(input))
            return self.work(what, [], outputs)
        writes = outputs if root is None or self.rank() == root else []
        n = input.numel()

        def deliver(out):
            for j, o in enumerate(writes):
                write(o, out[0][j * n : (j + 1) * n])

        launch = self.launch(
            "all_gather", (), [flat_value(input)], describe(input), writes, deliver
        )
        return self.work(what, [launch], outputs)

    # ---------------------------------------------------------------- scatters

    def reduce_scatter_single(self, output, input, opts=None):
        op = reduce_op_name(opts.reduceOp if opts is not None else "sum")
        self._check_multiple(input, output, "reduce_scatter_tensor", "input")
        if self._single("reduce_scatter", [output, input]):
            write(output, flat_value(input))
            return self.work("reduce_scatter", [], [output])
        launch = self.launch(
            "reduce_scatter", (op,), [flat_value(input)], describe(input), [output]
        )
        return self.work("reduce_scatter", [launch], [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._join("reduce_scatter", works, outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = reduce_op_name(opts.reduceOp if opts is not None else "sum")
        launches = []
        for output, inputs in zip(outputs, input_lists):
            if self._single("reduce_scatter", [output, *inputs]):
                write(output, flat_value(inputs[0]))
                continue
            for i in inputs:
                if i.numel() != output.numel():
                    raise ValueError("tpu_dist: reduce_scatter inputs must match the output's size")
            joined = jnp.concatenate([flat_value(i) for i in inputs])
            launches.append(
                self.launch("reduce_scatter", (op,), [joined], describe(output), [output])
            )
        return self.work("reduce_scatter", launches, outputs)

    def scatter(self, outputs, input_lists, opts):
        root = opts.rootRank
        output = outputs[0]
        if self._single("scatter", [output]):
            write(output, flat_value(input_lists[0][0]))
            return self.work("scatter", [], outputs)
        if self.rank() == root:
            joined = jnp.concatenate([flat_value(i) for i in input_lists[0]])
        else:
            check_device(output)
            joined = jnp.zeros((self.size() * output.numel(),), flat_value(output).dtype)
        launch = self.launch("scatter", (root,), [joined], describe(output), [output])
        return self.work("scatter", [launch], outputs)

    # ---------------------------------------------------------------- all-to-all

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if self._single("all_to_all", [output, input]):
            write(output, flat_value(input))
            return self.work("all_to_all", [], [output])
        k = self.size()
        if not output_split_sizes and not input_split_sizes:
            check_device(output)
            if input.numel() % k or output.numel() != input.numel():
                raise ValueError(
                    f"tpu_dist: all_to_all_single: input and output must have the same size, "
                    f"divisible by the group size {k}; got {input.numel()} and {output.numel()}"
                )
            launch = self.launch("all_to_all", (), [flat_value(input)], describe(input), [output])
            return self.work("all_to_all", [launch], [output])
        inner = input[0].numel() if input.dim() and input.shape[0] else 1
        send = list(input_split_sizes) or [input.shape[0] // k] * k
        recv = list(output_split_sizes) or [output.shape[0] // k] * k
        flat = self._uneven_all_to_all(
            flat_value(input),
            [s * inner for s in send],
            [r * inner for r in recv],
            str(input.dtype),
        )
        write(output, flat)
        return self.work("all_to_all", [], [output])

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        for t in [*outputs, *inputs]:
            check_device(t)
        if self.size() == 1:
            write(outputs[0], flat_value(inputs[0]))
            return self.work("all_to_all", [], outputs)
        joined = jnp.concatenate([flat_value(t) for t in inputs])
        flat = self._uneven_all_to_all(
            joined,
            [t.numel() for t in inputs],
            [t.numel() for t in outputs],
            str(inputs[0].dtype),
        )
        start = 0
        for t in outputs:
            write(t, flat[start : start + t.numel()])
            start += t.numel()
        return self.work("all_to_all", [], outputs)

    def _uneven_all_to_all(self, flat, send: list[int], recv: list[int], dtype: str):
        """All-to-all with per-pair sizes (in elements): the ranks first exchange their
        send sizes, then every block is padded to the largest, exchanged evenly, and
        unpadded. Synchronous (it waits for the size exchange)."""
        k, me = self.size(), self.rank()
        sizes = platform.put(np.asarray(send, np.int64))
        got: list = []
        launch = self.launch(
            "all_gather", (), [sizes], f"int64[{k}] all_to_all sizes", deliver=got.extend
        )
        self.work("all_to_all sizes", [launch], []).wait()
        matrix = np.asarray(got[0]).reshape(k, k)  # matrix[i][j]: i sends j
        if list(matrix[:, me]) != list(recv):
            raise ValueError(
                f"tpu_dist: all_to_all output split sizes {recv} on rank {me} do not match "
                f"what the ranks send it: {list(matrix[:, me])}"
            )
        width = max(1, int(matrix.max()))
        padded = _pad_blocks(flat, tuple(send), width)
        got.clear()
        launch = self.launch(
            "all_to_all", (), [padded], f"{dtype} all_to_all sizes {matrix.tolist()}",
            deliver=got.extend,
        )  # fmt: skip
        self.work("all_to_all", [launch], []).wait()
        return _unpad_blocks(got[0], tuple(recv), width)

    # ---------------------------------------------------------------- sync, p2p

    def barrier(self, opts=None):
        if self.size() == 1:
            return self.work("barrier", [], [])
        token = platform.put(np.zeros((1,), np.int32))
        launch = self.launch("all_reduce", ("sum",), [token], "barrier")
        return self.work("barrier", [launch], [])

    def send(self, tensors, dst: int, tag: int = 0):
        return self._p2p("send", tensors[0], self.rank(), dst)

    def recv(self, tensors, src: int, tag: int = 0):
        return self._p2p("recv", tensors[0], src, self.rank())

    def recv_anysource(self, tensors, tag: int = 0):
        raise NotImplementedError("tpu_dist: recv needs a source rank (no recv from any source)")

    def _p2p(self, what: str, t, src: int, dst: int):
        """send and recv run one two-rank XLA program (a ppermute), so a send meets its
        recv at the same time and in the same order on both ranks."""
        check_device(t)
        if src == dst:
            raise ValueError(f"tpu_dist: rank {src} cannot send to itself")
        pair = tuple(sorted((src, dst)))
        writes = [t] if what == "recv" else []
        params = (pair.index(src), pair.index(dst))
        launch = self.launch("permute", params, [flat_value(t)], describe(t), writes, ranks=pair)
        return self.work(f"{what} {src}->{dst}", [launch], [t])

    # ---------------------------------------------------------------- helpers

    def _check_multiple(self, big, small, what: str, name: str) -> None:
        check_device(big)
        check_device(small)
        if big.numel() != self.size() * small.numel():
            raise ValueError(
                f"tpu_dist: {what}: {name} must have world size ({self.size()}) times as many "
                f"elements as the other tensor, got {big.numel()} and {small.numel()}"
            )

    def _join(self, what: str, works: list[TpuWork], result) -> TpuWork:
        return _Joined(what, self._timeout, works, result)


class _Joined(TpuWork):
    """Several works waited for as one (coalesced and list calls)."""

    def __init__(self, what, timeout, works, result) -> None:
        super().__init__(what, timeout, [], result)
        self._works = works

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def _finish(self, timeout) -> None:
        self._done = True
        try:
            for w in self._works:
                w.wait(timeout)
        except CollectiveError as e:
            self._error = e


def _ignore(outputs: list) -> None:
    """The delivery of a collective whose outputs this rank does not keep."""


_PAD: dict = {}


def _pad_blocks(flat, sizes: tuple[int, ...], width: int):
    fn = _PAD.get(("pad", sizes, width))
    if fn is None:

        def pad(x):
            out, start = [], 0
            for n in sizes:
                out.append(jnp.pad(x[start : start + n], (0, width - n)))
                start += n
            return jnp.concatenate(out)

        fn = _PAD[("pad", sizes, width)] = jax.jit(pad)
    return fn(flat)


def _unpad_blocks(flat, sizes: tuple[int, ...], width: int):
    fn = _PAD.get(("unpad", sizes, width))
    if fn is None:

        def unpad(x):
            return jnp.concatenate([x[j * width : j * width + n] for j, n in enumerate(sizes)])

        fn = _PAD[("unpad", sizes, width)] = jax.jit(unpad)
    return fn(flat)


def create(options, backend_options=None) -> TpuProcessGroup:
    """c10d's backend creator (extended API): joins the JAX job for the default group."""
    from . import fsdp

    fsdp.install()
    ranks = tuple(options.global_ranks_in_group) or tuple(range(options.group_size))
    if not options.global_ranks_in_group:  # the default (world) group
        runtime.start(options.store, options.group_rank, options.group_size, options.timeout)
    elif not runtime.started() or runtime.rank() != ranks[options.group_rank]:
        raise RuntimeError(
            "tpu_dist: subgroups need tpu_dist as the default process group's backend "
            "(dist.init_process_group(backend='tpu_dist'))"
        )
    return TpuProcessGroup(
        options.store, options.group_rank, options.group_size, options.timeout, ranks
    )
