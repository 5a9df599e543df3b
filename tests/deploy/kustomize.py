"""Reading deploy/: its manifests, and ``kustomize build`` of the subset of kustomize it uses.

The build is a small Python merge (resources, ConfigMap generators with kustomize's name hash
and the references to them, strategic-merge patches, images, labels) so the tests need no
kubectl; where ``kubectl`` is installed, a test checks this build against ``kubectl kustomize``
output document for document.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUSTOMIZATIONS = [
    DEPLOY / "base",
    DEPLOY / "overlays" / "s3",
    DEPLOY / "overlays" / "gpu",
    DEPLOY / "overlays" / "volume",
    DEPLOY / "monitoring",
]

# patchMergeKey of the list fields the patches touch (Kubernetes' strategic merge); other lists
# are replaced whole, as strategic merge does for lists without a merge key (args, envFrom...).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}

Doc = dict[str, Any]


def load_all(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def generator_inputs() -> set[Path]:
    """The files ConfigMap generators read (graphs, node code): content, not manifests."""
    out: set[Path] = set()
    for directory in KUSTOMIZATIONS:
        kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
        for gen in kust.get("configMapGenerator", []):
            out |= {directory / _file_source(f)[1] for f in gen.get("files", [])}
    return out


def manifest_files() -> list[Path]:
    """Every Kubernetes object file in deploy/ (not the kustomization files themselves, the
    generators' inputs, nor the example image's content under examples/)."""
    skipped = generator_inputs()
    return sorted(
        p
        for p in DEPLOY.rglob("*.yaml")
        if p.name != "kustomization.yaml"
        and p not in skipped
        and "examples" not in p.relative_to(DEPLOY).parts
    )


def _file_source(entry: str) -> tuple[str, str]:
    """(key, path) of a generator's ``files`` entry (``key=path`` or ``path``)."""
    key, eq, path = entry.partition("=")
    return (key, path) if eq else (Path(entry).name, entry)


def name_hash(doc: Doc) -> str:
    """kustomize's name suffix for a generated ConfigMap (api/hasher: sha256 of the JSON of
    kind, name and data, ten hex digits with 0 1 3 a e spelled g h k m t). kustomize 5 hashes
    the generated object before it names it: the name is "" (checked against kubectl 1.32's
    kustomize 5.5)."""
    encoded = json.dumps(
        {"data": doc.get("data", {}), "kind": doc["kind"], "name": ""},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):  # Go's json
        encoded = encoded.replace(char, escape)
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def generate_config_maps(directory: Path, kust: Doc) -> tuple[list[Doc], dict[str, str]]:
    """The ConfigMaps of ``configMapGenerator`` and {name: name with its hash suffix}."""
    docs: list[Doc] = []
    names: dict[str, str] = {}
    for gen in kust.get("configMapGenerator", []):
        unknown = set(gen) - {"name", "files", "options"}
        assert not unknown, f"{directory}: configMapGenerator fields this build does not implement: {unknown}"
        data = {}
        for entry in gen.get("files", []):
            key, path = _file_source(entry)
            data[key] = (directory / path).read_text()
        doc: Doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data}
        if not gen.get("options", {}).get("disableNameSuffixHash"):
            doc["metadata"]["name"] = f"{gen['name']}-{name_hash(doc)}"
        names[gen["name"]] = doc["metadata"]["name"]
        docs.append(doc)
    return docs, names


def _rename_config_maps(doc: Doc, names: dict[str, str]) -> None:
    """Point a workload's references (volumes, envFrom, env valueFrom) at the generated names."""

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("configMap", "configMapRef", "configMapKeyRef"):
                ref = node.get(key)
                if isinstance(ref, dict) and ref.get("name") in names:
                    ref["name"] = names[ref["name"]]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(doc)


def merge(base: Any, patch: Any, field: str = "") -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = merge(out[key], value, key)
            else:
                out[key] = copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        key = MERGE_KEYS[field]
        out_list = [copy.deepcopy(x) for x in base]
        added = []  # new items come first, as kustomize orders them
        for item in patch:
            for i, existing in enumerate(out_list):
                if existing.get(key) == item.get(key):
                    out_list[i] = merge(existing, item, field)
                    break
            else:
                added.append(copy.deepcopy(item))
        return added + out_list
    return copy.deepcopy(patch)


def _containers(doc: Doc) -> Iterator[Doc]:
    def walk(node: Any) -> Iterator[Doc]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    yield from value
                else:
                    yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    yield from walk(doc)


def _image_name(image: str) -> str:
    return re.split(r"[@]|:(?=[^/]*$)", image)[0]


def build(directory: Path) -> list[Doc]:
    """The documents ``kustomize build directory`` gives, for the features deploy/ uses."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    known = {"apiVersion", "kind", "resources", "configMapGenerator", "patches", "images", "labels"}
    unknown = set(kust) - known
    assert not unknown, f"{directory}: kustomization fields this build does not implement: {unknown}"
    docs: list[Doc] = []
    for res in kust.get("resources", []):
        path = directory / res
        docs += build(path) if path.is_dir() else load_all(path)
    generated, names = generate_config_maps(directory, kust)
    docs += generated
    for patch in kust.get("patches", []):
        body = yaml.safe_load((directory / patch["path"]).read_text())
        target = patch.get("target", {"kind": body["kind"], "name": body["metadata"]["name"]})
        hits = [
            i
            for i, d in enumerate(docs)
            if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"]
        ]
        assert hits, f"{directory}: patch {patch['path']} matches nothing"
        for i in hits:
            docs[i] = merge(docs[i], body)
    for doc in docs:
        _rename_config_maps(doc, names)
    for image in kust.get("images", []):
        for doc in docs:
            for container in _containers(doc):
                if _image_name(container.get("image", "")) == image["name"]:
                    name = image.get("newName", image["name"])
                    container["image"] = f"{name}:{image['newTag']}" if "newTag" in image else name
    for entry in kust.get("labels", []):
        assert not entry.get("includeSelectors") and not entry.get("includeTemplates")
        for doc in docs:
            doc["metadata"].setdefault("labels", {}).update(entry["pairs"])
    return docs


def find(docs: list[Doc], kind: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def canonical(docs: list[Doc]) -> dict[tuple[str, str], str]:
    return {(d["kind"], d["metadata"]["name"]): json.dumps(d, sort_keys=True) for d in docs}


@cache
def k8s_definitions() -> dict[str, Any]:
    """The bundled Kubernetes definitions of kubernetes-validate (offline)."""
    import kubernetes_validate
    from kubernetes_validate.utils import latest_version

    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    return dict(json.loads((base / f"v{latest_version()}-local-strict" / "_definitions.json").read_text()))
