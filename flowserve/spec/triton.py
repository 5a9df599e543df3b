"""Triton's model configuration (config.pbtxt / config.yaml) -> :class:`ModelSpec`.

The file is parsed with protobuf's text format into ``ModelConfig`` (the message Triton itself
uses, shipped by ``tritonclient.grpc.model_config_pb2``), then translated. An ensemble
(``platform: "ensemble"``) becomes a :class:`GraphSpec` whose nodes are ``model`` steps.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from types import MappingProxyType
from typing import Any

import yaml
from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as mc

from flowserve.core.errors import FlowserveError, InvalidArgument, SpecIssue
from flowserve.spec.bounds import config_problems
from flowserve.spec.model_config import (
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelQueuePolicy,
    new_config,
)
from flowserve.spec.schema import (
    BatchingSpec,
    GraphOutput,
    GraphSpec,
    InstanceSpec,
    ModelSpec,
    NodeSpec,
    QueuePolicy,
    Ref,
    ResourceSpec,
    TensorSpec,
    WarmupSpec,
)
from flowserve.spec.suggest import did_you_mean
from flowserve.spec.warmup import warmup_from_config

# platform -> backend, as Triton resolves them.
PLATFORM_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "pytorch_torch2": "pytorch",
    "tensorrt_plan": "tensorrt",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
    "ensemble": "ensemble",
}
BACKEND_PLATFORMS = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "tensorrt": "tensorrt_plan",
}
# backend -> default model file name inside a version directory.
DEFAULT_FILENAMES = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
    "python": "model.py",
    "dali": "model.dali",
    "fil": "xgboost.model",
    "openvino": "model.xml",
    "tensorflow": "model.savedmodel",
}
# platform -> default model file, where it differs from its backend's.
PLATFORM_FILENAMES = {"tensorflow_graphdef": "model.graphdef"}
CONFIG_FILES = ("config.pbtxt", "config.yaml", "config.yml")


@dataclass(slots=True)
class Completion:
    """What a backend's auto-complete read from the model file, for what the config leaves out.

    Inputs and outputs are added when the config has none of that name; ``max_batch_size``
    (when not None) replaces the config's; ``dynamic_batching`` adds an empty
    ``dynamic_batching {}`` when the model has no scheduler; ``decoupled`` sets the
    transaction policy.
    """

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_batch_size: int | None = None
    dynamic_batching: bool = False
    decoupled: bool | None = None


# backend -> auto-complete hook: (ModelConfig, model directory, served version directories)
# -> Completion or None (nothing to add). The backends provide them
# (flowserve.nodes.backends.autocompletions(), so framework imports stay there) and the
# repository layer passes them in explicitly; the spec layer only calls them, before the config
# is translated, so graph validation sees the model's real signature.
AutoComplete = Callable[[ModelConfig, Path, list[Path]], "Completion | None"]
AutoCompletions = Mapping[str, AutoComplete]
NO_COMPLETIONS: AutoCompletions = MappingProxyType({})


def read_config(model_dir: Path) -> tuple[ModelConfig, str | None]:
    """The model's ModelConfig and the file it came from (None: no file, an empty config)."""
    for name in CONFIG_FILES:
        path = model_dir / name
        if path.is_file():
            return parse_config_text(path.read_text(), name), str(path)
    return new_config(), None


def parse_config_text(text: str, filename: str = "config.pbtxt") -> ModelConfig:
    """Parse config text: protobuf text format, or YAML/JSON with ModelConfig's field names."""
    config = new_config()
    try:
        if filename.endswith(".pbtxt"):
            text_format.Parse(text, config)
        else:
            doc = yaml.safe_load(text) or {}
            json_format.ParseDict(doc, config)
    except (text_format.ParseError, json_format.ParseError, yaml.YAMLError) as exc:
        raise InvalidArgument(f"cannot parse {filename}: {exc}{_config_hint(str(exc))}") from None
    return config


_NO_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_NO_VALUE = re.compile(r'Enum type "([\w.]+)" has no value named "?(\w+)')
_BAD_ENUM = re.compile(r"Invalid enum value (\w+) for enum type ([\w.]+)")  # json_format's


def _config_hint(error: str) -> str:
    """A "did you mean" for protobuf's unknown field or enum value (``max_batch_szie``,
    ``TYPE_FP23``), from the ModelConfig message's own names; "" for any other error."""
    pool = mc.DESCRIPTOR.pool
    try:
        if found := _NO_FIELD.search(error):
            fields = pool.FindMessageTypeByName(found[1]).fields
            return did_you_mean(found[2], [f.name for f in fields])
        if found := _NO_VALUE.search(error):
            values = pool.FindEnumTypeByName(found[1]).values
            return did_you_mean(found[2], [v.name for v in values])
        if found := _BAD_ENUM.search(error):
            values = pool.FindEnumTypeByName(found[2]).values
            return did_you_mean(found[1], [v.name for v in values])
    except KeyError:
        pass
    return ""


def parse_config_json(text: str) -> ModelConfig:
    """A ModelConfig from JSON (the repository load API's ``config`` parameter)."""
    config = new_config()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise InvalidArgument(f"cannot parse model config JSON: {exc}") from None
    return config


def resolve_backend(config: ModelConfig, version_dirs: list[Path]) -> str:
    """Backend name from ``backend``, else ``platform``, else the files of a version directory."""
    if config.backend:
        return str(config.backend)
    if config.platform:
        return PLATFORM_BACKENDS.get(config.platform, str(config.platform))
    for vdir in version_dirs:
        for backend, filename in DEFAULT_FILENAMES.items():
            if (vdir / filename).exists():
                return backend
    return ""


def select_versions(model_dir: Path, config: ModelConfig) -> tuple[dict[int, str], list[int]]:
    """Version directories that the version policy serves, and all numeric versions found.

    Like Triton, names that are not numeric or start with "0" are ignored.
    """
    found = sorted(
        int(p.name)
        for p in model_dir.iterdir()
        if p.is_dir() and p.name.isdigit() and not p.name.startswith("0")
    )
    policy = config.version_policy.WhichOneof("policy_choice")
    if policy == "all":
        chosen = found
    elif policy == "specific":
        wanted = set(config.version_policy.specific.versions)
        chosen = [v for v in found if v in wanted]
    else:
        n = config.version_policy.latest.num_versions if policy == "latest" else 1
        chosen = found[-max(n, 1) :] if found else []
    return {v: str(model_dir / str(v)) for v in chosen}, found


def input_from_config(t: ModelInput) -> TensorSpec:
    return _tensor(t, optional=bool(t.optional), allow_ragged_batch=bool(t.allow_ragged_batch))


def output_from_config(t: ModelOutput) -> TensorSpec:
    return _tensor(t, label_filename=t.label_filename)


def _tensor(
    t: ModelInput | ModelOutput,
    optional: bool = False,
    allow_ragged_batch: bool = False,
    label_filename: str = "",
) -> TensorSpec:
    from flowserve.core.datatypes import from_config

    return TensorSpec(
        name=t.name,
        datatype=from_config(mc.DataType.Name(t.data_type)),
        dims=tuple(t.dims),
        optional=optional,
        reshape=tuple(t.reshape.shape) if t.HasField("reshape") else None,
        allow_ragged_batch=allow_ragged_batch,
        is_shape_tensor=bool(t.is_shape_tensor),
        label_filename=label_filename,
    )


def _queue_policy(p: ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        timeout_action="DELAY" if p.timeout_action == mc.ModelQueuePolicy.DELAY else "REJECT",
        default_timeout_us=int(p.default_timeout_microseconds),
        allow_timeout_override=bool(p.allow_timeout_override),
        max_queue_size=int(p.max_queue_size),
    )


def batching_from_config(config: ModelConfig) -> BatchingSpec | None:
    if not config.HasField("dynamic_batching") or config.max_batch_size <= 0:
        return None
    db = config.dynamic_batching
    return BatchingSpec(
        max_batch_size=int(config.max_batch_size),
        preferred_batch_size=tuple(db.preferred_batch_size),
        max_queue_delay_us=int(db.max_queue_delay_microseconds),
        preserve_ordering=bool(db.preserve_ordering),
        priority_levels=int(db.priority_levels),
        default_priority_level=int(db.default_priority_level),
        default_queue_policy=_queue_policy(db.default_queue_policy),
        priority_queue_policy={int(k): _queue_policy(v) for k, v in db.priority_queue_policy.items()},
    )


def model_spec(
    model_dir: Path,
    config: ModelConfig,
    source: str,
    issues: list[SpecIssue],
    completions: AutoCompletions = NO_COMPLETIONS,
) -> ModelSpec | None:
    """Translate one repository model; problems are appended to ``issues``. ``completions``:
    the backends' auto-complete hooks (none: the config is taken as written)."""
    name = model_dir.name
    if config.name and config.name != name:
        issues.append(
            SpecIssue(source, f"name '{config.name}' differs from directory '{name}'", field="name")
        )
        return None
    config.name = name
    if not _inside(config.default_model_filename):
        issues.append(
            SpecIssue(
                source,
                f"'{config.default_model_filename}' must name a file inside the version directory "
                "(a relative path without '..')",
                field="default_model_filename",
            )
        )
        return None
    if not within_bounds(config, source, issues):
        return None
    versions, found = select_versions(model_dir, config)
    backend = resolve_backend(config, [Path(p) for p in versions.values()])
    if not backend:
        issues.append(
            SpecIssue(
                source,
                "no backend or platform set and no known model file in any version directory",
                field="backend",
            )
        )
        return None
    if not found:
        issues.append(SpecIssue(source, "no version directory (for example 1/)", field="version"))
        return None
    if not versions:
        issues.append(SpecIssue(source, f"version_policy selects none of {found}", field="version_policy"))
        return None
    if config.max_batch_size < 0:
        issues.append(SpecIssue(source, "must be >= 0", field="max_batch_size"))
        return None
    if not config.platform and backend in BACKEND_PLATFORMS:
        config.platform = BACKEND_PLATFORMS[backend]
    if not auto_complete(config, backend, model_dir, versions, source, issues, completions):
        return None
    if not within_bounds(config, source, issues):  # what auto-complete read from the model file
        return None
    try:
        inputs = tuple(input_from_config(t) for t in config.input)
        outputs = tuple(output_from_config(t) for t in config.output)
    except InvalidArgument as exc:
        issues.append(SpecIssue(source, exc.message, field="input/output data_type"))
        return None
    graph = None
    if backend == "ensemble":
        graph = ensemble_graph(config, source, inputs, outputs, issues)
        if graph is None:
            return None
    warmup = _warmup(config, model_dir, inputs, backend, source, issues)
    if warmup is None:
        return None
    instances = tuple(
        InstanceSpec(
            count=max(int(g.count), 1),
            kind=mc.ModelInstanceGroup.Kind.Name(g.kind),
            gpus=tuple(g.gpus),
            resources=tuple(
                ResourceSpec(r.name, int(r.count), bool(getattr(r, "global")))
                for r in g.rate_limiter.resources
            ),
            priority=int(g.rate_limiter.priority),
        )
        for g in config.instance_group
    )
    return ModelSpec(
        name=name,
        source=source,
        backend=backend,
        platform=config.platform,
        max_batch_size=int(config.max_batch_size),
        inputs=inputs,
        outputs=outputs,
        versions=versions,
        default_model_filename=config.default_model_filename
        or PLATFORM_FILENAMES.get(config.platform, DEFAULT_FILENAMES.get(backend, "")),
        batching=batching_from_config(config),
        instances=instances,
        parameters={k: v.string_value for k, v in config.parameters.items()},
        decoupled=bool(config.model_transaction_policy.decoupled),
        graph=graph,
        config=config,
        warmup=warmup,
    )


def within_bounds(config: ModelConfig, source: str, issues: list[SpecIssue]) -> bool:
    """Whether every number of ``config`` is within its bound (spec/bounds.py); each one that
    is not is appended to ``issues``, naming the model, the field and the bound."""
    problems = config_problems(config)
    issues.extend(
        SpecIssue(source, f"model '{config.name}': {problem}", field=field) for field, problem in problems
    )
    return not problems


def check_config_override(name: str, config_json: str) -> None:
    """Refuse a load request's config override (ModelConfig JSON) with a number past its bound
    before anything is built from it, in any worker: InvalidArgument naming the model, each
    field and its bound. An override that does not parse is left to the load itself, which
    answers it as Triton does ("failed to load", logging "Invalid config override")."""
    try:
        config = parse_config_json(config_json)
    except Exception:
        return
    config.name = config.name or name
    issues: list[SpecIssue] = []
    if not within_bounds(config, f"{name} (config override)", issues):
        raise InvalidArgument(f"failed to load '{name}': " + "; ".join(str(i) for i in issues))


def _warmup(
    config: ModelConfig,
    model_dir: Path,
    inputs: tuple[TensorSpec, ...],
    backend: str,
    source: str,
    issues: list[SpecIssue],
) -> tuple[WarmupSpec, ...] | None:
    """The model's ``model_warmup`` samples (None: invalid, with the problems in ``issues``)."""
    if not config.model_warmup:
        return ()
    if backend == "ensemble":
        issues.append(SpecIssue(source, "an ensemble cannot have model_warmup", field="model_warmup"))
        return None
    found: list[SpecIssue] = []
    samples = warmup_from_config(
        config,
        model_dir,
        inputs,
        int(config.max_batch_size),
        lambda message, field: found.append(SpecIssue(source, message, field=field)),
    )
    issues.extend(found)
    return None if found else samples


def auto_complete(
    config: ModelConfig,
    backend: str,
    model_dir: Path,
    versions: dict[int, str],
    source: str,
    issues: list[SpecIssue],
    completions: AutoCompletions = NO_COMPLETIONS,
) -> bool:
    """Run the backend's auto-complete hook, if any, and fold its result into ``config``."""
    hook = completions.get(backend)
    if hook is None:
        return True
    try:
        completion = hook(config, model_dir, [Path(p) for p in versions.values()])
    except FlowserveError as exc:
        issues.append(SpecIssue(source, exc.message, field="auto-complete"))
        return False
    except Exception as exc:
        issues.append(
            SpecIssue(
                source,
                f"model '{model_dir.name}': auto-complete of backend '{backend}' failed: "
                f"{type(exc).__name__}: {exc}",
                field="auto-complete",
            )
        )
        return False
    if completion is not None:
        apply_completion(config, completion)
    return True


def apply_completion(config: ModelConfig, completion: Completion) -> None:
    from flowserve.core.datatypes import to_config

    if completion.max_batch_size is not None:
        config.max_batch_size = completion.max_batch_size
    scheduler = config.WhichOneof("scheduling_choice")
    if completion.dynamic_batching and scheduler is None and config.max_batch_size > 0:
        config.dynamic_batching.SetInParent()
    present = {t.name for t in config.input}
    for t in completion.inputs:
        if t.name not in present:
            entry = config.input.add(
                name=t.name, data_type=mc.DataType.Value(to_config(t.datatype)), dims=list(t.dims)
            )
            if t.optional:
                entry.optional = True
    present = {t.name for t in config.output}
    for t in completion.outputs:
        if t.name not in present:
            config.output.add(
                name=t.name, data_type=mc.DataType.Value(to_config(t.datatype)), dims=list(t.dims)
            )
    if completion.decoupled is not None:
        config.model_transaction_policy.decoupled = completion.decoupled


def ensemble_graph(
    config: ModelConfig,
    source: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    issues: list[SpecIssue],
) -> GraphSpec | None:
    """An ensemble's steps as a graph: each step a ``model`` node, edges by ensemble tensor."""
    steps = list(config.ensemble_scheduling.step)
    if not steps:
        issues.append(SpecIssue(source, "an ensemble needs at least one step", field="ensemble_scheduling"))
        return None
    graph_inputs = {t.name for t in inputs}
    producers: dict[str, Ref] = {}
    names: list[str] = []
    for i, step in enumerate(steps):
        node = step.model_name if step.model_name not in names else f"{step.model_name}_{i}"
        names.append(node)
        for model_output, tensor in step.output_map.items():
            if tensor in producers or tensor in graph_inputs:
                issues.append(
                    SpecIssue(
                        source,
                        f"ensemble tensor '{tensor}' is produced more than once",
                        node=node,
                        field="output_map",
                    )
                )
            producers[tensor] = Ref(node, model_output)
    nodes: dict[str, NodeSpec] = {}
    for node, step in zip(names, steps, strict=True):
        bindings: dict[str, tuple[Ref, ...]] = {}
        for model_input, tensor in step.input_map.items():
            ref = Ref(None, tensor) if tensor in graph_inputs else producers.get(tensor)
            if ref is None:
                issues.append(
                    SpecIssue(
                        source,
                        f"ensemble tensor '{tensor}' is not an ensemble input nor any step's output",
                        node=node,
                        field=f"input_map.{model_input}",
                    )
                )
                continue
            bindings[model_input] = (ref,)
        version = "" if step.model_version < 0 else str(step.model_version)
        nodes[node] = NodeSpec(
            name=node,
            kind="model",
            target=step.model_name,
            version=version,
            inputs=bindings,
            outputs=dict.fromkeys(step.output_map.keys()),
        )
    graph_outputs = {}
    for t in outputs:
        ref = producers.get(t.name)
        if ref is None:
            issues.append(
                SpecIssue(source, f"ensemble output '{t.name}' is not produced by any step", field="output")
            )
            continue
        graph_outputs[t.name] = GraphOutput(t.name, (ref,), t.datatype, t.dims)
    return GraphSpec(
        name=config.name,
        source=source,
        inputs={t.name: t for t in inputs},
        outputs=graph_outputs,
        nodes=nodes,
        max_batch_size=int(config.max_batch_size),
        platform="ensemble",
    )


def config_to_json(config: Message) -> dict[str, Any]:
    """ModelConfig as Triton's HTTP endpoint prints it.

    Unlike protobuf's ``json_format``, Triton prints 64-bit integers as JSON numbers and
    includes default-valued scalar, repeated and map fields; perf_analyzer relies on that.
    """
    out: dict[str, Any] = {}
    for field in config.DESCRIPTOR.fields:
        value = getattr(config, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {str(k): _json_value(value_field, v) for k, v in value.items()}
        elif field.label == FieldDescriptor.LABEL_REPEATED:
            out[field.name] = [_json_value(field, v) for v in value]
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if config.HasField(field.name):
                out[field.name] = config_to_json(value)
        else:
            out[field.name] = _json_value(field, value)
    return out


def _json_value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return config_to_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values_by_number[value].name
    if field.type == FieldDescriptor.TYPE_BYTES:
        return json.dumps(value.decode("latin-1"))
    return value


def config_from_graph(
    graph: GraphSpec,
    outputs: list[TensorSpec],
    node_outputs: dict[str, tuple[str, ...]],
    decoupled: bool = False,
) -> ModelConfig:
    """A ModelConfig describing a YAML graph for clients (perf_analyzer reads it).

    A graph that runs repository models reports itself as Triton would an ensemble (platform
    "ensemble", one step per model or graph node, tensors named as in the graph), so clients
    find and query its composing models; a graph of Python nodes only reports platform
    "flowserve_graph". ``outputs`` have full shapes; like inputs, their dims are written
    without the batch dimension when the graph batches.
    """
    from flowserve.core.datatypes import to_config
    from flowserve.spec.kinds import kind_of

    batched = graph.max_batch_size > 0
    steps = [n for n in graph.nodes.values() if kind_of(n).step]
    platform = "ensemble" if steps else graph.platform
    config = new_config(name=graph.name, platform=platform, max_batch_size=graph.max_batch_size)
    for t in graph.inputs.values():
        config.input.add(
            name=t.name,
            data_type=mc.DataType.Value(to_config(t.datatype)),
            dims=list(t.dims),
            optional=t.optional,
        )
    for t in outputs:
        dims = list(t.dims[1:]) if batched and t.dims else list(t.dims)
        config.output.add(name=t.name, data_type=mc.DataType.Value(to_config(t.datatype)), dims=dims)
    for node in steps:
        step = config.ensemble_scheduling.step.add(model_name=node.target, model_version=-1)
        for k, binding in node.inputs.items():
            ref = binding[0]
            step.input_map[k] = ref.tensor if ref.node is None else ref.key
        for k in node_outputs.get(node.name, ()):
            step.output_map[k] = f"{node.name}.{k}"
    if decoupled:
        config.model_transaction_policy.decoupled = True
    return config


def _inside(filename: str) -> bool:
    """Whether a file name from a config stays inside the directory it is relative to."""
    path = PurePath(filename)
    return not filename or not (path.is_absolute() or ".." in path.parts or "\0" in filename)
