"""The production overlay's images (issue 27; docs/guides/security.md, "Production images by
digest, signed"): every container of its Deployment a registry-qualified image by digest
with ``imagePullPolicy: IfNotPresent``; with ``prod`` (``make deploy-check PROD=1``) not the
all-zero placeholder digest either. ``make deploy-check`` runs it
(``orchestrator.tooling.deploy``, check ``prod``)."""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

import yaml

PROD_OVERLAY = "k8s/overlays/prod"
_BY_DIGEST = re.compile(r"^[a-z0-9.-]+(:\d+)?/[a-z0-9._/-]+@sha256:[0-9a-f]{64}$")
PLACEHOLDER = "sha256:" + "0" * 64


def check_prod_images(rendered: Dict[str, str], prod: bool = False) -> List[Tuple[str, str]]:
    """Problems as ``(source, message)``; ``rendered``: kustomization -> rendered YAML."""
    if PROD_OVERLAY not in rendered:
        return [(PROD_OVERLAY, "no production overlay rendered")]
    out = []
    for doc in yaml.safe_load_all(rendered[PROD_OVERLAY]):
        if not isinstance(doc, dict) or doc.get("kind") != "Deployment":
            continue
        for c in doc["spec"]["template"]["spec"].get("containers") or []:
            image, what = c.get("image", ""), f"Deployment/{doc['metadata']['name']} container {c.get('name')}"
            if not _BY_DIGEST.match(image):
                out.append((PROD_OVERLAY, f"{what}: image {image!r} is not REGISTRY/NAME@sha256:<digest>"))
            elif prod and image.endswith(PLACEHOLDER):
                out.append((PROD_OVERLAY, f"{what}: image {image!r} has the placeholder digest: "
                             f"kustomize edit set image NAME=REGISTRY/NAME@sha256:<your image's digest> in deploy/{PROD_OVERLAY}"))
            if c.get("imagePullPolicy") != "IfNotPresent":
                out.append((PROD_OVERLAY, f"{what}: imagePullPolicy {c.get('imagePullPolicy')!r}, not IfNotPresent (the digest fixes the content)"))
    return out
