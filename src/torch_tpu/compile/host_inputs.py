"""CPU tensors among a compiled graph's inputs: a non-capturable optimizer's step counters.

Such an optimizer keeps each parameter's `step` as a 0-d CPU tensor. Under
torch.compile its graph reads `step`, writes `step + 1` back into it and uses the
new value on the device (the bias corrections). Uploading every counter and
downloading its new value cost two transfers per parameter and step, and the
downloads waited for the whole optimizer graph: about 0.7 ms of a 3.3 ms
gpt_small training step. Instead:

- a write into a CPU input whose new value depends on CPU inputs only is computed
  on the host by PyTorch's CPU kernels, as eager computes it, and dropped from the
  device program (`HostWrites`);
- a 0-d CPU input the program then only reads is uploaded once per value and the
  device copy shared (`HostCopies`).
"""

from __future__ import annotations

import torch

from .. import cache, dtypes, platform
from ..engine import executor
from ..tensor import new_tensor, storage_of
from . import interpret

_COPY_ = torch.ops.aten.copy_.default


class HostWrites:
    """The graph's writes into CPU inputs computed on the host. `split` builds it and
    removes those writes from the graph the device runs."""

    def __init__(self, module: torch.fx.GraphModule, reads: list[int], writes: list[int]):
        self.module = module
        self.reads = reads  # input index per argument of module
        self.writes = writes  # input index per result of module

    @classmethod
    def split(cls, gm: torch.fx.GraphModule) -> HostWrites | None:
        """The writes of gm's graph into CPU inputs whose new values depend on CPU
        inputs alone, taken out of the graph; None (graph unchanged) if there are none."""
        graph = gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        on_host = {n for n in placeholders if _on_cpu(n)}
        for node in graph.nodes:
            if (
                node.op == "call_function"
                and node.target is not _COPY_
                and not interpret.is_random(node)
                and _on_cpu(node)
                and all(a in on_host for a in node.all_input_nodes)
            ):
                on_host.add(node)
        writes = [
            n
            for n in graph.nodes
            if n.op == "call_function"
            and n.target is _COPY_
            and n.args[0] in on_host
            and n.args[0].op == "placeholder"
            and n.args[1] in on_host
            and not n.users
        ]
        if not writes:
            return None
        needed = _ancestors([n.args[1] for n in writes])
        host = torch.fx.Graph()
        env: dict = {}
        reads = []
        for k, node in enumerate(placeholders):
            if node in needed:
                env[node] = host.placeholder(node.name)
                reads.append(k)
        for node in graph.nodes:
            if node.op == "call_function" and node in needed:
                env[node] = host.node_copy(node, lambda a: env[a])
        host.output(tuple(env[n.args[1]] for n in writes))
        index = {node: k for k, node in enumerate(placeholders)}
        targets = [index[n.args[0]] for n in writes]
        for node in writes:
            graph.erase_node(node)
        gm.recompile()
        return cls(torch.fx.GraphModule(gm, host), reads, targets)

    def apply(self, host: dict) -> None:
        """Write the new values into the CPU inputs (`host`: input index -> the CPU
        tensor), from the values they hold before the write."""
        new = self.module(*[host[k] for k in self.reads])
        for k, value in zip(self.writes, new):
            host[k].copy_(value)


def _on_cpu(node: torch.fx.Node) -> bool:
    """Whether the node's value is a CPU tensor, or a list of them (a foreach op's)."""
    value = node.meta.get("val")
    values = value if isinstance(value, (list, tuple)) and value else [value]
    return all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in values)


def _ancestors(nodes: list) -> set:
    seen: set = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.all_input_nodes)
    return seen


_ARRAYS: dict = {}  # (dtype, bytes) -> a device copy of that 0-d value
_MAX_ARRAYS = 4096
cache.on_clear(_ARRAYS.clear)


class HostCopies:
    """The tpu copies of one graph's CPU inputs. A 0-d one the program never writes
    keeps one tpu tensor across calls, its storage pointed at a device copy of the
    current value, uploaded once per value and shared by every input holding it (step
    counters: one upload per step, not one per parameter and step). Distinct tensors
    per input keep the executable's key independent of which values happen to match."""

    def __init__(self, written: set) -> None:
        self.written = written
        self.tensors: dict = {}

    def upload(self, k: int, t: torch.Tensor) -> torch.Tensor:
        if k in self.written or t.dim() != 0:
            return executor.upload(t)
        host = dtypes.numpy_from_cpu(t)
        key = (t.dtype, host.tobytes())
        array = _ARRAYS.get(key)
        if array is None:
            if len(_ARRAYS) >= _MAX_ARRAYS:
                _ARRAYS.clear()
            array = _ARRAYS[key] = platform.put(host)  # (numpy_from_cpu's copy: private)
        copy = self.tensors.get(k)
        if copy is None or copy.dtype != t.dtype:
            copy = self.tensors[k] = new_tensor((), t.dtype, array)
        else:
            storage_of(copy).value = array
        return copy
