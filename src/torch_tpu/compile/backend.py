"""The Dynamo backend `tpu`, and torch.compile's routing of tpu graphs.

`tpu` hands each Dynamo graph to AOTAutograd, which functionalizes it and
splits forward from backward; each ATen graph becomes one `CompiledGraph`
(one XLA executable per input layout, from `torch_tpu.cache`). Input
mutations (BatchNorm running statistics, in-place ops on inputs) come back
from the graph as extra outputs and AOTAutograd's runtime wrapper copies
them into the real tensors with eager `copy_`. A graph with functional
collectives becomes compiled segments with the collectives between them
(`split.py`).

Routing: torch.compile's default backend becomes `tpu_or_inductor` (through
`torch.compiler.set_default_backend`, unless the user chose another
default), which sends graphs on tpu tensors to `tpu` and the rest to
Inductor as before; an explicit `backend="inductor"` on tpu tensors raises
an error that suggests `tpu`.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from .. import metrics
from . import buckets, interpret, split
from .runtime import CompiledGraph

DEVICE_TYPE = "tpu"


@functools.cache
def decompositions() -> dict:
    """PyTorch's decompositions (the table eager uses for backend ops without a
    lowering) for every op the interpreter has no rule for: ops with a lowering,
    views and the special rules stay whole, so the graph runs eager's lowerings."""
    from torch._decomp import decomposition_table

    table = {}
    for op, decomposition in decomposition_table.items():
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten" or op.is_view:
            continue
        name = interpret.op_name(op)
        if name in interpret.SPECIAL or name in interpret.RANDOM_FACTORIES:
            continue
        if interpret.find_lowering(op) is None:
            table[op] = decomposition
    return table


# ------------------------------------------------------------------ naming


def graph_name(gm: torch.fx.GraphModule) -> str:
    """A name stable for the same code across Dynamo recompiles ("f:12#0"): the frame's
    function and first line, Dynamo's id for the code object, and the graph's index
    within one compile of it. Recompile diagnostics group compiles by this name."""
    compile_id = gm.meta.get("dynamo_compile_id")
    frame = getattr(compile_id, "frame_id", None)
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
    except Exception:  # called outside Dynamo tracing (a direct backend call)
        return "graph" if frame is None else f"graph#{frame}"
    code = tx.f_code
    index = getattr(tx.output, "_torch_tpu_graphs", 0)
    tx.output._torch_tpu_graphs = index + 1
    name = f"{code.co_name}:{code.co_firstlineno}#{frame}"
    return name if index == 0 else f"{name}.{index}"


# --------------------------------------------------------------- the backend


def uses_tpu(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """True when the graph takes or makes tpu tensors."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == DEVICE_TYPE:
            return True
    for node in gm.graph.nodes:
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor) and value.device.type == DEVICE_TYPE:
            return True
    return False


def _is_dynamic(example_inputs) -> bool:
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return True
        if isinstance(x, torch.Tensor) and any(
            not isinstance(s, int) for s in (*x.shape, *x.stride())
        ):
            return True
    return False


def _shares_storage(example_inputs) -> bool:
    """Whether two tensor inputs share a storage: AOTAutograd, tracing them inside Dynamo,
    can fake one with symbolic sizes its aliasing analysis then refuses (numel()); traced
    at the first call instead, they are plain."""
    seen = set()
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == DEVICE_TYPE:
            address = _storage_address(x)
            if address in seen:
                return True
            seen.add(address or None)
    return False


def _storage_address(t: torch.Tensor) -> int | None:
    """Where t's storage is; 0 or None where it has none to share (a fake tensor, a
    wrapper subclass such as a collective's result, whose storage refuses data_ptr)."""
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return None


def tpu(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None, options=None):
    """The `tpu` Dynamo backend. `options` (torch.compile's) are XLA compiler options
    for this model's compiles; `mode` has no meaning for XLA and is ignored."""
    if not uses_tpu(gm, example_inputs):
        warnings.warn(
            "torch.compile(backend='tpu') got a graph without tpu tensors; it runs eagerly. "
            "Move the model and inputs to 'tpu'.",
            stacklevel=2,
        )
        return gm.forward
    name = graph_name(gm)
    input_names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    policy, options = buckets.split_options(options)
    if _is_dynamic(example_inputs):
        if policy is not None:
            return _Bucketed(gm, example_inputs, name, input_names, options, policy)
        return _Specialising(gm, name, input_names, options)
    if _shares_storage(example_inputs):
        return _Specialising(gm, name, input_names, options)
    return _aot(name, input_names, options)(gm, example_inputs)


def _aot(name: str, input_names: list[str], options):
    def compiler(suffix: str, names: list[str] | None):
        def compile_graph(gm: torch.fx.GraphModule, example_inputs):
            return _compile_graph(gm, f"{name}.{suffix}", names, options)

        return compile_graph

    return aot_autograd(
        fw_compiler=compiler("forward", input_names),
        bw_compiler=compiler("backward", None),
        inference_compiler=compiler("inference", input_names),
        decompositions=decompositions(),
        # input mutations of inference graphs (optimizer steps) stay in the graph: the
        # runtime writes them into the inputs' storages, no eager copy_ per tensor
        keep_inference_input_mutations=True,
    )


def _compile_graph(gm: torch.fx.GraphModule, name: str, names, options):
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if names is not None and len(names) != len(placeholders):
        names = None  # AOTAutograd added or merged inputs: keep its own names
    try:
        for node in placeholders:  # tensors, or sizes (ints, no fake value) once specialised
            value = node.meta.get("val")
            if value is not None and not isinstance(value, (torch.Tensor, int)):
                # an opaque object (a DTensor's DeviceMesh) that the graph only hands on
                # to its outputs, as AOTAutograd does to rebuild DTensors, passes through
                if any(user.op != "output" for user in node.users):
                    raise interpret.Unsupported(
                        f"input {node.name} of type {type(value).__name__}"
                    )
        if split.has_collectives(gm.graph):  # compiled segments between the collectives
            return split.SegmentedGraph(gm, name, options)
        interpret.check_supported(gm.graph)
    except interpret.Unsupported as e:
        warnings.warn(
            f"torch_tpu: compiled graph {name!r} runs op by op in tpu eager: "
            f"no tpu lowering for {e}",
            stacklevel=2,
        )
        metrics.count("compiled_graphs_run_eagerly")
        return make_boxed_func(gm.forward)
    return CompiledGraph(gm, name, names, options)


class _Specialising:
    """A graph Dynamo made dynamic (automatic dynamic shapes after a recompile, or
    dynamic=True), or one whose inputs share storages. XLA compiles static shapes, so
    each concrete input signature (with which inputs share a storage) is
    traced by AOTAutograd and compiled on its first call; the compiles share the
    graph's name, so each is recorded as a recompile naming the input that changed."""

    def __init__(self, gm, name: str, input_names: list[str], options) -> None:
        self.gm, self.name, self.input_names, self.options = gm, name, input_names, options
        self.compiled: dict = {}
        self.reads_scalars = _reads_scalars(gm.graph)

    def __call__(self, *args):
        slots: dict = {}  # storage -> its first argument: which arguments share one
        key = (torch.is_grad_enabled(),) + tuple(
            (
                tuple(a.shape),
                a.stride(),
                a.dtype,
                a.requires_grad,
                slots.setdefault(_storage_address(a) or -i - 1, i),
            )
            if isinstance(a, torch.Tensor)
            else a
            for i, a in enumerate(args)
        )
        fn = self.compiled.get(key)
        if fn is None:
            gm = torch.fx.GraphModule(self.gm, self.gm.graph)  # AOTAutograd may edit it
            example = _static_fakes(args) if self.reads_scalars else list(args)
            fn = self.compiled[key] = _aot(self.name, self.input_names, self.options)(
                gm, example
            )
        return fn(*args)


def _reads_scalars(graph: torch.fx.Graph) -> bool:
    """Whether the graph reads a tensor's value as a Python number (`.item()`): Dynamo
    passes a Python float that changed between calls as a 0-d tensor and reads it so."""
    return any(
        (node.op == "call_method" and node.target in ("item", "tolist"))
        or node.target is torch.ops.aten._local_scalar_dense.default
        for node in graph.nodes
    )


def _static_fakes(args) -> list:
    """Fake copies of the tensor arguments at their concrete sizes, in a fake mode with
    a shape environment: there a value read as a number is a symbol, read at run time,
    as when Dynamo traces (without one, AOTAutograd raises DataDependentOutputException
    on the read)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    return [
        mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a
        for a in args
    ]


class _Bucketed(_Specialising):
    """A dynamic graph under a bucket policy (torch.compile's `bucket_size`,
    `num_dynamic_buckets`, `dynamic_buckets`): each varying size is padded up to its
    bucket, the graph is specialised at the bucket's shape, and the results are sliced
    back, so the number of programs is the number of buckets used. `buckets.check_graph`
    first proves, on the graph AOTAutograd makes with symbolic sizes, that padding leaves
    every real result unchanged, or raises naming the op that would mix padding in.
    Sizes that enter only with an input the graph mutates stay exact (the write must
    land in the caller's tensor, not a padded copy)."""

    def __init__(self, gm, example_inputs, name, input_names, options, policy) -> None:
        super().__init__(gm, name, input_names, options)
        self.policy = policy
        if torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs
        ):
            raise buckets.BucketingError(
                f"torch_tpu: graph {name!r} needs gradients, and bucketing pads only "
                "inference graphs (a parameter's gradient sums over the padded rows). "
                "Run it under torch.no_grad() or drop the bucket options."
            )
        aten = _symbolic_graph(gm, example_inputs)
        places = buckets.dynamic_symbols(gm)
        fixed = set()
        inputs = interpret.input_nodes(aten)
        for k, _ in interpret.input_writes(aten):
            value = inputs[k].meta.get("val")
            for size in getattr(value, "shape", ()):
                fixed |= buckets._free(size)
        marked = _marked_symbols(gm, example_inputs)
        self.places = {
            symbol: where
            for symbol, where in places.items()
            if symbol not in fixed
            and any(d is not None for _, d in where)
            and (marked is None or symbol in marked)
        }
        symbols = frozenset(self.places)
        self.min_size = buckets.check_graph(aten, symbols, name)
        self.outputs = buckets.output_sizes(gm, symbols)

    def __call__(self, *args):
        real = {}
        for symbol, where in self.places.items():
            k, d = next((k, d) for k, d in where if d is not None)
            real[symbol] = args[k].shape[d]
        if not real or min(real.values()) == 0:  # nothing to pad, or no edge to repeat
            return super().__call__(*args)
        for symbol, needed in self.min_size.items():
            if real[symbol] < needed:
                raise IndexError(
                    f"index {needed - 1} is out of bounds for a dynamic dimension of size "
                    f"{real[symbol]} (graph {self.name!r})"
                )
        bucket = {symbol: self.policy.bucket(n) for symbol, n in real.items()}
        metrics.record_bucket(self.name, tuple(real.values()), tuple(bucket.values()))
        pads: dict = {}
        for symbol, where in self.places.items():
            for k, d in where:
                pads.setdefault(k, {})
                if d is not None:
                    pads[k][d] = bucket[symbol]
        from ..bucketing import pad_to_size

        padded = list(args)
        for k, sizes in pads.items():
            if isinstance(padded[k], torch.Tensor):
                padded[k] = pad_to_size(padded[k], sizes)
            else:
                padded[k] = next(bucket[s] for s, w in self.places.items() if (k, None) in w)
        out = super().__call__(*padded)
        subs = dict(real)
        sliced = []
        for value, plan in zip(out, self.outputs):
            if plan is None:
                sliced.append(value)
            elif plan[0] == "int":
                sliced.append(int(plan[1].subs(subs)))
            else:
                for d, expr in enumerate(plan[1]):
                    if expr is not None:
                        value = value.narrow(d, 0, max(0, int(expr.subs(subs))))
                sliced.append(value)
        return type(out)(sliced) if isinstance(out, tuple) else sliced


def _marked_symbols(gm: torch.fx.GraphModule, example_inputs) -> set | None:
    """The symbols of the dims the caller marked (torch._dynamo.mark_dynamic), or None if
    none is marked (dynamic=True, or automatic dynamic: the dims that changed)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    marked, any_marks = set(), False
    for node, x in zip(placeholders, example_inputs):
        dims = getattr(x, "_dynamo_dynamic_indices", None)
        value = node.meta.get("example_value")
        if not dims or not isinstance(value, torch.Tensor):
            continue
        any_marks = True
        for d in dims:
            marked |= buckets._free(value.shape[d])
    return marked if any_marks else None


def _symbolic_graph(gm: torch.fx.GraphModule, example_inputs) -> torch.fx.Graph:
    """The ATen graph AOTAutograd makes of a dynamic Dynamo graph with symbolic sizes
    (inside the backend call Dynamo's fake mode is current): what bucketing checks."""
    captured = []

    def capture(graph_module, inputs):
        captured.append(graph_module.graph)
        return graph_module.forward

    copy = torch.fx.GraphModule(gm, gm.graph)  # AOTAutograd may edit it
    aot_autograd(
        fw_compiler=capture,
        inference_compiler=capture,
        decompositions=decompositions(),
        keep_inference_input_mutations=True,
    )(copy, example_inputs)
    return captured[0]


# ----------------------------------------------------------------- routing


def tpu_or_inductor(gm: torch.fx.GraphModule, example_inputs, mode=None, options=None):
    """torch.compile's default backend once torch_tpu is loaded: `tpu` for graphs on
    tpu tensors, Inductor (with the same mode and options) for everything else."""
    if uses_tpu(gm, example_inputs):
        return tpu(gm, example_inputs, options=options)
    if options:  # bucket options are tpu's; Inductor would reject them as unknown configs
        options = buckets.split_options(options)[1]
    return torch._TorchCompileInductorWrapper(mode, options, None)(gm, example_inputs)


class InductorOnTpuError(RuntimeError):
    """torch.compile(backend='inductor') was given tpu tensors."""


def _refuse_tpu(call):
    @functools.wraps(call)
    def inductor_call(self, model_, inputs_):
        if uses_tpu(model_, inputs_):
            raise InductorOnTpuError(
                "torch.compile(backend='inductor') cannot compile tpu tensors: Inductor "
                "generates no code for the tpu device. Use torch.compile(model, backend='tpu') "
                "(or leave backend unset: tpu graphs then use 'tpu')."
            )
        return call(self, model_, inputs_)

    inductor_call._torch_tpu_guard = True
    return inductor_call


# Python that runs eager tpu ops: Dynamo must never trace into it. Between graphs (a
# graph break, a frame Dynamo skips) eager ops call our kernels from the dispatcher
# while Dynamo's frame hook is live, and it would try to compile those frames.
# torch_tpu.training holds user-style models, which Dynamo must trace.
_NOT_TRACED = ("jax", "jaxlib", "ml_dtypes", "opt_einsum")
_TRACED_MODULES = ("training",)


@functools.cache
def _skip_our_internals() -> None:
    """Once per process: each trace_rules.add recompiles Dynamo's skip regex over the
    whole list, so adding our ~80 modules at every torch.compile call grew the list
    and made each call slower than the last (9 s per call in a long test process)."""
    from pathlib import Path

    from torch._dynamo import trace_rules

    import torch_tpu

    root = Path(torch_tpu.__file__).parent
    files = [
        str(path)  # every module (engine/ has no __init__.py, so no package to name)
        for path in sorted(root.rglob("*.py"))
        if path.stem != "__init__"
        and path.relative_to(root).with_suffix("").parts[0] not in _TRACED_MODULES
    ]
    # what trace_rules.add(name) does per name, with the regex rebuilt once, not per
    # module (about a second at the first torch.compile otherwise)
    trace_rules.SKIP_DIRS.extend(files)
    trace_rules._recompile_re()
    for package in _NOT_TRACED:
        trace_rules.add(package)


def register() -> None:
    """Register `tpu`, make it the default for tpu graphs, guard Inductor (idempotent)."""
    from torch._dynamo.backends import registry

    from . import rng_state_ops

    _skip_our_internals()
    rng_state_ops.register()

    if "tpu" not in registry.list_backends(exclude_tags=()):
        registry.register_backend(compiler_fn=tpu, name="tpu")
    if registry.get_default_backend() == "inductor":
        registry.set_default_backend(tpu_or_inductor)
    wrapper = torch._TorchCompileInductorWrapper
    if not getattr(wrapper.__call__, "_torch_tpu_guard", False):
        wrapper.__call__ = _refuse_tpu(wrapper.__call__)
