"""Compiled graphs that hold functional collectives: compute segments between them.

A tpu_dist collective is an XLA program of its own over the group's mesh, with
its own signature check and timeout (`distributed/programs.py`, `work.py`); it
cannot sit inside the executable one process compiles for its graph. So an
ATen graph with `_c10d_functional` nodes is cut at them: the compute between
collectives becomes one `CompiledGraph` per segment (one executable each,
through `torch_tpu.cache`), and the collectives run between segments on the
segments' tpu tensors through their eager tpu kernels (`functional.py`), so a
collective compiled or not is the same code.

Schedule. Each collective is issued at the earliest boundary between segments
its inputs allow, and each compute node goes into the earliest segment its
inputs allow, except that heavy compute (`_heavy`) never moves before a
collective that precedes it in graph order: it runs while that collective is
in flight (issuing does not wait, `distributed/work.py`). A `wait_tensor`
waits only when a later step first reads its value (a wait returns its
input), and a segment is cut in two before that first read when its heavy
part does not need the result. A wait nothing read is done at the end of the
call. Views of graph inputs and factories are repeated in every segment that
uses them rather than carried between segments (a carried value is a
materialised copy). Input mutations (`copy_` into an input) go into the last
segment, after every read of the old value.
"""

from __future__ import annotations

import copy
import operator
from typing import NamedTuple

import torch
from torch.fx.node import map_arg

from .. import metrics
from . import interpret
from .runtime import CompiledGraph

NAMESPACE = "_c10d_functional"
_WAIT = torch.ops._c10d_functional.wait_tensor.default
_COPY_ = torch.ops.aten.copy_.default
_SOURCES = ("placeholder", "get_attr")


def is_collective(node: torch.fx.Node) -> bool:
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and target.namespace == NAMESPACE
    )


def has_collectives(graph: torch.fx.Graph) -> bool:
    return any(is_collective(n) for n in graph.nodes)


class _Plan:
    """Which segment each compute node runs in and at which boundary each collective
    runs (boundary b comes before segment b); `free` nodes run wherever they are used.
    `part` splits each segment k in two: 2k, what runs while the collectives it does
    not read are in flight, then 2k + 1, from the first read of a collective's result
    that was not waited for before segment k."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.segment: dict[torch.fx.Node, int] = {}
        self.boundary: dict[torch.fx.Node, int] = {}
        self.free: set[torch.fx.Node] = set()
        mutations = []
        issued = 0  # the latest boundary of a collective seen so far in graph order
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            inputs = node.all_input_nodes
            if is_collective(node) and node.target._schema.is_mutable:
                raise interpret.Unsupported(f"in-place collective {node.target}")
            if is_collective(node) or (
                node.target is operator.getitem and inputs[0] in self.boundary
            ):
                self.boundary[node] = max((self._usable_at_boundary(n) for n in inputs), default=0)
                if node.target is not _WAIT:
                    issued = max(issued, self.boundary[node])
            elif node.target is _COPY_ and inputs[0].op in _SOURCES:
                mutations.append(node)
            elif self._is_free(node):
                self.free.add(node)
            else:
                earliest = max((self._usable_in_segment(n) for n in inputs), default=0)
                self.segment[node] = max(earliest, issued) if _heavy(node) else earliest
        last = max((*self.segment.values(), *self.boundary.values()), default=0)
        self.part = self._parts(graph)
        for node in mutations:  # after every read of the input's old value
            self.segment[node] = last
            self.part[node] = 2 * last + 1
        self.n_segments = 1 + max(self.segment.values(), default=-1)
        self.n_boundaries = 1 + max(self.boundary.values(), default=-1)

    def _parts(self, graph: torch.fx.Graph) -> dict[torch.fx.Node, int]:
        waited_by: dict[torch.fx.Node, int] = {}  # wait -> the segment it is done before
        for node in graph.nodes:
            if node in self.boundary:  # a collective reading a wait waits when issued
                before = self.boundary[node]
            elif node in self.segment:  # a segment, just before it runs
                before = self.segment[node] + 1
            else:
                continue
            for n in node.all_input_nodes:
                if n.target is _WAIT:
                    waited_by[n] = min(waited_by.get(n, before), before)
        part: dict[torch.fx.Node, int] = {}
        for node in graph.nodes:
            if node in self.segment:
                k = self.segment[node]
                late = any(
                    (n.target is _WAIT and waited_by[n] > k) or part.get(n) == 2 * k + 1
                    for n in node.all_input_nodes
                )
                part[node] = 2 * k + late
        for k in {self.segment[n] for n in part}:  # light work is not worth an executable
            early = [n for n in part if part[n] == 2 * k]
            if not any(map(_heavy, early)):
                part.update(dict.fromkeys(early, 2 * k + 1))
        return part

    def _is_free(self, node: torch.fx.Node) -> bool:
        """A view of graph inputs, or a node without tensor inputs (a factory): cheaper
        to repeat in each segment than to carry as a materialised value."""
        inputs = node.all_input_nodes
        view = node.target is operator.getitem or getattr(node.target, "is_view", False)
        if (inputs and not view) or interpret.is_random(node):
            return False  # (a random node repeated would draw other numbers)
        return all(n.op in _SOURCES or n in self.free for n in inputs)

    def _usable_in_segment(self, node: torch.fx.Node) -> int:
        if node.op in _SOURCES or node in self.free:
            return 0
        return self.segment.get(node, self.boundary.get(node, 0))

    def _usable_at_boundary(self, node: torch.fx.Node) -> int:
        if node in self.segment:
            return self.segment[node] + 1
        return self.boundary.get(node, 0)


class _Segment(NamedTuple):
    compiled: CompiledGraph
    inputs: list[torch.fx.Node]  # graph inputs, earlier segments' values, collective results
    outputs: list[torch.fx.Node]  # values later steps or the graph's output read


class _Boundary(NamedTuple):
    collectives: list[torch.fx.Node]  # collectives, their waits and getitems, graph order


class SegmentedGraph:
    """An ATen graph with collectives: compiled segments, collectives between them.
    Called like a `CompiledGraph` (boxed: one list of inputs), returns its outputs.
    Raises interpret.Unsupported when a segment holds an op with no lowering."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, options: dict | None = None) -> None:
        self._boxed_call = True  # an instance attribute, as in CompiledGraph
        plan = _Plan(gm.graph)
        self.gm = gm
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.outputs = list(gm.graph.output_node().args[0])
        consumers = self._consumers(gm.graph, plan)
        self.steps: list[_Boundary | _Segment] = []
        for k in range(max(plan.n_segments, plan.n_boundaries)):
            collectives = [n for n in gm.graph.nodes if plan.boundary.get(n) == k]
            if collectives:
                self.steps.append(_Boundary(collectives))
            for p, label in ((2 * k, f"{k}"), (2 * k + 1, f"{k}+")):
                nodes = [n for n in gm.graph.nodes if plan.part.get(n) == p]
                outs = [n for n in nodes if consumers[n] - {p}]
                if nodes and (outs or any(n.target is _COPY_ for n in nodes)):
                    segment, ins = _segment_module(gm, nodes, plan.free, outs)
                    interpret.check_supported(segment.graph)
                    compiled = CompiledGraph(segment, f"{name}[{label}]", None, options)
                    self.steps.append(_Segment(compiled, ins, outs))
        self.free = plan.free
        self._waits = [n for n in gm.graph.nodes if n.target is _WAIT]
        self._release = self._last_uses()

    @staticmethod
    def _consumers(graph: torch.fx.Graph, plan: _Plan) -> dict:
        """Per node, where its value is used: segment indices, "outside" (a collective,
        the graph's output or a free node evaluated outside segments)."""
        used: dict = {n: set() for n in graph.nodes}
        for node in graph.nodes:
            if node.op == "output":
                where = "outside"
            elif node in plan.part:
                where = plan.part[node]
            elif node in plan.free:
                continue  # a free node's inputs are graph inputs or free nodes
            else:
                where = "outside"
            for n in node.all_input_nodes:
                used[n].add(where)
        return used

    def _last_uses(self) -> list[list[torch.fx.Node]]:
        """Per step, the values no later step or output needs: released after it."""
        last: dict = {}
        for index, step in enumerate(self.steps):
            if isinstance(step, _Segment):
                nodes = step.inputs
            else:  # (a wait reads its collective where its own value is read)
                nodes = [n for c in _issued(step.collectives) for n in c.all_input_nodes]
            for node in self._with_sources(nodes):
                last[node] = index
        outputs = [n.args[0] if n.target is _COPY_ else n for n in self.outputs if _is_node(n)]
        kept = set(self._with_sources(outputs))
        release: list[list] = [[] for _ in self.steps]
        for node, index in last.items():
            if node not in kept:
                release[index].append(node)
        return release

    def __call__(self, args: list) -> list:
        env: dict = dict(zip(self.placeholders, args))
        args.clear()
        for index, step in enumerate(self.steps):
            if isinstance(step, _Boundary):
                self._collectives(step.collectives, env)
            else:
                values = step.compiled([self._value(n, env) for n in step.inputs])
                env.update(zip(step.outputs, values))
            for node in self._release[index]:
                env.pop(node, None)
        for node in self._waits:  # a wait nothing read still reports a failed collective
            if node not in env and node.args[0] in env:
                self._value(node, env)
        out = []
        for item in self.outputs:
            if _is_node(item) and item.target is _COPY_:
                item = item.args[0]  # copy_ returns the input it wrote into
            out.append(self._value(item, env) if _is_node(item) else item)
        return out

    def _collectives(self, nodes: list[torch.fx.Node], env: dict) -> None:
        """Issue the boundary's collectives in graph order; their waits come later."""
        for node in _issued(nodes):
            args, kwargs = map_arg((node.args, node.kwargs), lambda n: self._value(n, env))
            if is_collective(node):
                metrics.count("compiled_graph_collectives")
            env[node] = node.target(*args, **kwargs)

    def _value(self, node: torch.fx.Node, env: dict):
        """A node's value; a free node or constant outside segments is computed eagerly,
        a wait waits when its value is first read."""
        if node in env:
            return env[node]
        if node.op == "get_attr":
            return operator.attrgetter(node.target)(self.gm)
        if node.target is _WAIT:
            value = env[node] = torch.ops._c10d_functional.wait_tensor(
                self._value(node.args[0], env)
            )
            return value
        if node in self.free:
            args, kwargs = map_arg((node.args, node.kwargs), lambda n: self._value(n, env))
            value = env[node] = node.target(*args, **kwargs)
            return value
        raise RuntimeError(f"torch_tpu: no value for {node} in split graph")  # a plan bug

    def _with_sources(self, nodes: list[torch.fx.Node]) -> list[torch.fx.Node]:
        """nodes, and for each free node the graph inputs it is computed from."""
        out, stack = [], list(nodes)
        while stack:
            node = stack.pop()
            out.append(node)
            if node in self.free or node.target is _WAIT:
                stack.extend(node.all_input_nodes)
        return out


# Compute that may wait for a collective's issue to overlap it: a matrix product, a
# convolution, or any op with a large output. Light work (a few small elementwise
# ops) is cheaper run earlier than as an executable of its own.
_MATMULS = frozenset({"mm", "bmm", "addmm", "baddbmm", "convolution", "_convolution"})
_LARGE = 1 << 16  # elements


def _heavy(node: torch.fx.Node) -> bool:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        if target._schema.name.split("::")[-1] in _MATMULS:
            return True
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return False
    numel = value.numel()
    return isinstance(numel, int) and numel >= _LARGE  # (a symbolic size counts as light)


def _issued(nodes: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """A boundary's nodes run when it is reached: all but the waits."""
    return [n for n in nodes if n.target is not _WAIT]


def _is_node(item) -> bool:
    return isinstance(item, torch.fx.Node)


def _segment_module(
    gm: torch.fx.GraphModule,
    nodes: list[torch.fx.Node],
    free: set[torch.fx.Node],
    outputs: list[torch.fx.Node],
) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]]:
    """One segment as its own graph: placeholders for the values it reads from graph
    inputs, earlier segments and collectives (returned in order), free nodes copied in."""
    members = set(nodes)
    inputs: dict = {}  # ordered set

    def find_inputs(node):
        for n in node.all_input_nodes:
            if n in free:
                find_inputs(n)
            elif n not in members and n.op != "get_attr":
                inputs.setdefault(n)

    for node in nodes:
        find_inputs(node)
    graph = torch.fx.Graph()
    mapping: dict = {}
    for node in inputs:
        mapping[node] = graph.placeholder(node.name)
        mapping[node].meta = copy.copy(node.meta)

    def mapped(node):
        if node not in mapping:
            if node.op == "get_attr":
                mapping[node] = graph.get_attr(node.target)
                mapping[node].meta = copy.copy(node.meta)
            else:  # a free node
                mapping[node] = graph.node_copy(node, mapped)
        return mapping[node]

    for node in nodes:
        mapping[node] = graph.node_copy(node, mapped)
    graph.output(tuple(mapping[n] for n in outputs))
    return torch.fx.GraphModule(gm, graph), list(inputs)
