"""Derive daskcluster.schema.json (JSON Schema for check-jsonschema) from the dask-kubernetes operator's CRD.

    python deploy/kubernetes/derive_schema.py            # from the installed dask-kubernetes
    python deploy/kubernetes/derive_schema.py CRD.yaml   # from a CRD file

The CRD's openAPIV3Schema becomes the schema of `spec`, with two changes that make the offline check as
strict as the cluster: objects that list their properties reject unknown keys (as `kubectl apply
--validate=strict` does; a misspelt key would otherwise be dropped silently), and resource quantities
must be non-negative Kubernetes quantities (the API server rejects the pods the operator would make
from anything else). tests/test_deploy.py re-derives the schema and fails if the kept copy differs.
"""

import json
import sys
from pathlib import Path

import yaml

OUT = Path(__file__).with_name("daskcluster.schema.json")
CRD_IN_WHEEL = "operator/deployment/helm/dask-kubernetes-operator/crds/daskcluster.yaml"
QUANTITY = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def installed_crd():
    import dask_kubernetes

    path = Path(dask_kubernetes.__file__).parent / CRD_IN_WHEEL
    return path, f"dask-kubernetes {dask_kubernetes.__version__} ({CRD_IN_WHEEL})"


def strict(node, key=None):
    """Copy of a CRD schema node: no x-kubernetes-* extensions, closed objects, checked quantities."""
    if isinstance(node, list):
        return [strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v, k) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if key in ("limits", "requests") and out.get("additionalProperties") == {"type": "string"}:
        out["additionalProperties"] = {"type": "string", "pattern": QUANTITY}
    return out


def derive(crd, source):
    version = next(v for v in crd["spec"]["versions"] if v.get("storage", v.get("served")))
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    body = strict(version["schema"]["openAPIV3Schema"])
    body["properties"].pop("status", None)  # written by the operator, never by users
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": f"{kind} ({group}/{version['name']})",
        "description": f"Derived by deploy/kubernetes/derive_schema.py from {source}",
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", *body.get("required", [])],
        "properties": {
            "apiVersion": {"const": f"{group}/{version['name']}"},
            "kind": {"const": kind},
            "metadata": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "pattern": DNS_LABEL, "maxLength": 63},
                    "namespace": {"type": "string", "pattern": DNS_LABEL},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                },
                "additionalProperties": False,
            },
            **body["properties"],
        },
        "additionalProperties": False,
    }


def render(schema):
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


def main(argv):
    if argv:
        path, source = Path(argv[0]), f"CRD file {Path(argv[0]).name}"
    else:
        path, source = installed_crd()
    OUT.write_text(render(derive(yaml.safe_load(path.read_text()), source)))
    print(f"wrote {OUT} from {source}")


if __name__ == "__main__":
    main(sys.argv[1:])
