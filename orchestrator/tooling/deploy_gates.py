"""The checks issue 27 added to ``make deploy-check`` (``orchestrator.tooling.deploy.check_all``
calls :func:`check_gates`): the front door (:func:`orchestrator.tooling.frontdoor.check_manifests`),
the CVE gate on the base release (:func:`orchestrator.tooling.cves.check_base`) and the
production overlay's images: by digest and ``IfNotPresent`` always; with ``prod`` (``make
deploy-check PROD=1``) no placeholder digest either."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

from orchestrator.tooling.deploy import DEPLOY_DIR, Finding, documents

PROD_OVERLAY = "k8s/overlays/prod"
_BY_DIGEST = re.compile(r"^[a-z0-9.-]+(:\d+)?/[a-z0-9._/-]+@sha256:[0-9a-f]{64}$")
PLACEHOLDER = "sha256:" + "0" * 64


def check_prod_images(rendered: Dict[str, str], prod: bool = False) -> List[Finding]:
    """Every container of the production overlay's workloads: a registry-qualified image by
    digest, ``imagePullPolicy: IfNotPresent``; with ``prod``, not the placeholder digest."""
    if PROD_OVERLAY not in rendered:
        return [Finding("prod", PROD_OVERLAY, "no production overlay rendered")]
    findings = []
    for doc in documents(rendered[PROD_OVERLAY]):
        if doc.get("kind") != "Deployment":
            continue
        for c in doc["spec"]["template"]["spec"].get("containers") or []:
            image, what = c.get("image", ""), f"Deployment/{doc['metadata']['name']} container {c.get('name')}"
            if not _BY_DIGEST.match(image):
                findings.append(Finding("prod", PROD_OVERLAY, f"{what}: image {image!r} is not REGISTRY/NAME@sha256:<digest>"))
            elif prod and image.endswith(PLACEHOLDER):
                findings.append(Finding("prod", PROD_OVERLAY, f"{what}: image {image!r} has the placeholder digest: "
                                        f"kustomize edit set image NAME=REGISTRY/NAME@sha256:<your image's digest> in deploy/{PROD_OVERLAY}"))
            if c.get("imagePullPolicy") != "IfNotPresent":
                findings.append(Finding("prod", PROD_OVERLAY, f"{what}: imagePullPolicy {c.get('imagePullPolicy')!r}, not IfNotPresent (the digest fixes the content)"))
    return findings


def check_gates(rendered: Dict[str, str], deploy_dir: Path = DEPLOY_DIR, prod: bool = False) -> List[Finding]:
    from orchestrator.tooling import cves, frontdoor

    return frontdoor.check_manifests(rendered, deploy_dir) + cves.check_base(deploy_dir) + check_prod_images(rendered, prod)
