"""Reading deploy/: its manifests, and ``kustomize build`` of the subset of kustomize it uses.

The build is a small Python merge (resources, strategic-merge patches, images, labels) so the
tests need no kubectl; where ``kubectl`` is installed, a test checks this build against
``kubectl kustomize`` output document for document.
"""

from __future__ import annotations

import copy
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


def manifest_files() -> list[Path]:
    """Every Kubernetes object file in deploy/ (not the kustomization files themselves)."""
    return sorted(p for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml")


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
    unknown = set(kust) - {"apiVersion", "kind", "resources", "patches", "images", "labels"}
    assert not unknown, f"{directory}: kustomization fields this build does not implement: {unknown}"
    docs: list[Doc] = []
    for res in kust.get("resources", []):
        path = directory / res
        docs += build(path) if path.is_dir() else load_all(path)
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
