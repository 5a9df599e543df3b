"""Warmup samples: Triton's ``model_warmup`` (config.pbtxt / config.yaml) and the ``warmup:``
key of YAML graphs, translated to :class:`WarmupSpec` and checked against the inputs.

config.pbtxt (Triton's ``ModelWarmup``)::

    model_warmup [{
      name: "zeros"  batch_size: 2  count: 1
      inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [16] zero_data: true } }
    }]

YAML graph (same fields, graph-style datatypes)::

    warmup:
      - name: zeros
        batch_size: 2          # rows when the graph batches (max_batch_size > 0); else 1
        count: 1               # runs of this sample (0 or absent: once)
        inputs:
          image: {datatype: UINT8, dims: [8, 8, 3], zero_data: true}
          # or random_data: true, or input_data_file: image.bin (under <graph folder>/warmup/)

``input_data_file`` names a file in the ``warmup/`` folder of the model directory (for a YAML
graph: next to the graph file), holding raw row-major data of one row (Triton's layout).
Every problem is reported with the sample's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from flowserve.core.datatypes import DATATYPES, from_config
from flowserve.core.errors import InvalidArgument
from flowserve.spec.bounds import out_of_bounds
from flowserve.spec.model_config import ModelConfig
from flowserve.spec.schema import TensorSpec, WarmupInput, WarmupSpec

# report(message, field)
Report = Callable[[str, str], None]
WARMUP_DIR = "warmup"


def warmup_from_config(
    config: ModelConfig,
    model_dir: Path,
    inputs: tuple[TensorSpec, ...],
    max_batch_size: int,
    report: Report,
) -> tuple[WarmupSpec, ...]:
    """The ``model_warmup`` samples of a ModelConfig, each checked against ``inputs``."""
    from tritonclient.grpc import model_config_pb2 as mc

    samples: list[WarmupSpec] = []
    for i, sample in enumerate(config.model_warmup):
        field = f"model_warmup[{i}]"
        tensors: dict[str, WarmupInput] = {}
        for name, raw in sample.inputs.items():
            kind = raw.WhichOneof("input_data_type")
            try:
                datatype = from_config(mc.DataType.Name(raw.data_type))
            except (InvalidArgument, ValueError) as exc:
                report(f"sample '{sample.name}': input '{name}': {exc}", field)
                continue
            source, path = _source(kind, raw.input_data_file, model_dir, sample.name, name, field, report)
            if source is None:
                continue
            tensors[str(name)] = WarmupInput(datatype, tuple(int(d) for d in raw.dims), source, path)
        samples.append(
            WarmupSpec(str(sample.name), tensors, int(sample.batch_size), max(int(sample.count), 1))
        )
    return check_samples(samples, inputs, max_batch_size, report, "model_warmup")


def warmup_from_yaml(
    raw: Any, base_dir: Path, inputs: Mapping[str, TensorSpec], max_batch_size: int, report: Report
) -> tuple[WarmupSpec, ...]:
    """The ``warmup:`` list of a YAML graph, checked against the graph's inputs."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        report("must be a list of samples {name, batch_size, count, inputs}", "warmup")
        return ()
    samples: list[WarmupSpec] = []
    for i, item in enumerate(raw):
        field = f"warmup[{i}]"
        if not isinstance(item, dict):
            report("a sample must be a mapping {name, batch_size, count, inputs}", field)
            continue
        unknown = sorted(set(map(str, item)) - {"name", "batch_size", "count", "inputs"})
        if unknown:
            report(f"unknown keys {unknown} (expected name, batch_size, count, inputs)", field)
        name = item.get("name", "")
        batch_size = item.get("batch_size", 1)
        count = item.get("count", 1)
        if not _is_int(batch_size) or not _is_int(count) or count < 0:
            report(f"sample '{name}': batch_size and count must be integers", field)
            continue
        raw_inputs = item.get("inputs")
        if not isinstance(raw_inputs, dict):
            report(f"sample '{name}': inputs must be a mapping of input name to data", field)
            continue
        tensors: dict[str, WarmupInput] = {}
        for in_name, spec in raw_inputs.items():
            tensor = _yaml_input(str(name), str(in_name), spec, base_dir, f"{field}.inputs.{in_name}", report)
            if tensor is not None:
                tensors[str(in_name)] = tensor
        samples.append(WarmupSpec(str(name), tensors, batch_size, max(count, 1)))
    return check_samples(samples, tuple(inputs.values()), max_batch_size, report, "warmup")


def _yaml_input(
    sample: str, name: str, spec: Any, base_dir: Path, field: str, report: Report
) -> WarmupInput | None:
    if not isinstance(spec, dict):
        report(f"sample '{sample}': input '{name}' must be a mapping {{datatype, dims, <data>}}", field)
        return None
    datatype = spec.get("datatype")
    dims = spec.get("dims")
    if datatype not in DATATYPES:
        report(f"sample '{sample}': input '{name}': datatype must be one of {sorted(DATATYPES)}", field)
        return None
    if not isinstance(dims, list) or not all(_is_int(d) for d in dims):
        report(f"sample '{sample}': input '{name}': dims must be a list of integers", field)
        return None
    kinds = [k for k in ("zero_data", "random_data", "input_data_file") if spec.get(k)]
    unknown = sorted(
        set(map(str, spec)) - {"datatype", "dims", "zero_data", "random_data", "input_data_file"}
    )
    if unknown:
        report(f"sample '{sample}': input '{name}': unknown keys {unknown}", field)
    if len(kinds) != 1:
        report(
            f"sample '{sample}': input '{name}' needs exactly one of zero_data, random_data, "
            f"input_data_file (got {kinds or 'none'})",
            field,
        )
        return None
    source, path = _source(
        kinds[0], str(spec.get("input_data_file", "")), base_dir, sample, name, field, report
    )
    if source is None:
        return None
    return WarmupInput(str(datatype), tuple(dims), source, path)


def _source(
    kind: str | None, filename: str, base_dir: Path, sample: str, name: str, field: str, report: Report
) -> tuple[Literal["zero", "random", "file"] | None, str]:
    if kind == "zero_data":
        return "zero", ""
    if kind == "random_data":
        return "random", ""
    if kind != "input_data_file":
        report(
            f"sample '{sample}': input '{name}' sets none of zero_data, random_data, input_data_file", field
        )
        return None, ""
    folder = (base_dir / WARMUP_DIR).resolve()
    path = (folder / filename).resolve()
    if not filename or not path.is_relative_to(folder):
        report(f"sample '{sample}': input '{name}': input_data_file must name a file inside {folder}", field)
        return None, ""
    if not path.is_file():
        report(f"sample '{sample}': input '{name}': input_data_file {path} does not exist", field)
        return None, ""
    return "file", str(path)


def check_samples(
    samples: list[WarmupSpec],
    inputs: tuple[TensorSpec, ...],
    max_batch_size: int,
    report: Report,
    key: str,
) -> tuple[WarmupSpec, ...]:
    """Keep the samples that fit the inputs; report the others (by sample name)."""
    by_name = {t.name: t for t in inputs}
    good: list[WarmupSpec] = []
    seen: set[str] = set()
    for i, sample in enumerate(samples):
        field = f"{key}[{i}]"
        problems: list[str] = []
        if not sample.name:
            problems.append("a warmup sample needs a name")
        elif sample.name in seen:
            problems.append(f"sample name '{sample.name}' is used twice")
        seen.add(sample.name)
        problems += _bounds(sample)
        if sample.batch_size < 1:
            problems.append("batch_size must be >= 1")
        elif max_batch_size == 0 and sample.batch_size != 1:
            problems.append("batch_size must be 1 for a model that does not batch (max_batch_size 0)")
        elif 0 < max_batch_size < sample.batch_size:
            problems.append(f"batch_size {sample.batch_size} exceeds max_batch_size {max_batch_size}")
        if not sample.inputs:
            problems.append("a warmup sample needs inputs")
        for name, tensor in sample.inputs.items():
            problems += _check_input(name, tensor, by_name.get(name), list(by_name))
        missing = [t.name for t in inputs if not t.optional and t.name not in sample.inputs]
        if missing and sample.inputs:
            problems.append(f"inputs {missing} are missing")
        if problems:
            where = f"sample '{sample.name}'" if sample.name else "sample"
            report(f"{where}: {'; '.join(problems)}", field)
            continue
        good.append(sample)
    return tuple(good)


def _bounds(sample: WarmupSpec) -> list[str]:
    """The sample's numbers past their bounds (spec/bounds.py): its count, and the elements
    of each input tensor it makes (times its batch_size)."""
    problem = out_of_bounds("warmup_count", sample.count)
    problems = [] if problem is None else [f"count {problem}"]
    for name, tensor in sample.inputs.items():
        problem = out_of_bounds("rank", len(tensor.dims))
        if problem is None:
            elements = max(sample.batch_size, 1)
            for d in tensor.dims:
                elements *= max(d, 1)
            problem = out_of_bounds("elements", elements)
        if problem is not None:
            problems.append(f"input '{name}': dims {problem}")
    return problems


def _check_input(name: str, tensor: WarmupInput, spec: TensorSpec | None, known: list[str]) -> list[str]:
    if spec is None:
        return [f"'{name}' is not an input (inputs: {known})"]
    problems = []
    if tensor.datatype != spec.datatype:
        problems.append(f"input '{name}' is {spec.datatype}, not {tensor.datatype}")
    dims = tensor.dims
    if any(d < 0 for d in dims):
        problems.append(f"input '{name}': dims {list(dims)} must all be >= 0")
    elif len(dims) != len(spec.dims) or any(s >= 0 and s != d for s, d in zip(spec.dims, dims, strict=False)):
        problems.append(f"input '{name}': dims {list(dims)} do not fit the input's dims {list(spec.dims)}")
    return problems


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
