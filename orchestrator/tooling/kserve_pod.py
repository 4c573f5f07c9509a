"""The predictor Pod KServe makes of an InferenceService and its ServingRuntime, for checkov
(which knows no KServe kinds): the runtime's containers and volumes
(:func:`servingruntime_as_pod`) with the predictor's pod-level
fields (``V1beta1PredictorSpec`` embeds a ``PodSpec``: security context, service-account
token, grace period, scheduling), the model's resources on the first container, and the
labels KServe puts on predictor pods, so that a NetworkPolicy selecting them is matched."""

from __future__ import annotations

import copy
from typing import List, Optional

#: Pod-level fields of a predictor that KServe copies into the predictor pod.
PREDICTOR_POD_FIELDS = ("securityContext", "automountServiceAccountToken", "terminationGracePeriodSeconds",
                        "serviceAccountName", "imagePullSecrets", "nodeSelector", "tolerations", "affinity")
#: The label KServe sets on every pod of an InferenceService (value: its name).
ISVC_LABEL = "serving.kserve.io/inferenceservice"


def servingruntime_as_pod(doc: dict) -> dict:
    """The Pod KServe makes of a ``ServingRuntime``'s pod fields (containers, volumes,
    scheduling), for checkov, which knows no KServe kinds. The runtime's annotations (its
    ``checkov.io/skipN`` waivers) go with it; the name says where it came from."""
    spec = doc.get("spec") or {}
    meta = doc.get("metadata") or {}
    pod_fields = ("containers", "volumes", "affinity", "nodeSelector", "tolerations", "imagePullSecrets", "hostIPC", "schedulerName")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"servingruntime-{meta.get('name', 'unnamed')}", "annotations": dict(meta.get("annotations") or {})},
        "spec": {k: copy.deepcopy(spec[k]) for k in pod_fields if k in spec},
    }
    if "namespace" in meta:
        pod["metadata"]["namespace"] = meta["namespace"]
    return pod


def predictor_pod(runtime: dict, docs: List[dict]) -> dict:
    """The Pod of ``runtime`` (a ServingRuntime document) as the first InferenceService in
    ``docs`` that names it as ``predictor.model.runtime`` makes it; the runtime's Pod alone
    when none does."""
    pod = servingruntime_as_pod(runtime)
    isvc = _service_of(runtime, docs)
    if isvc is None:
        return pod
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    for key in PREDICTOR_POD_FIELDS:
        if key in predictor:
            pod["spec"][key] = copy.deepcopy(predictor[key])
    resources = (predictor.get("model") or {}).get("resources")
    if resources and pod["spec"].get("containers"):
        pod["spec"]["containers"][0]["resources"] = copy.deepcopy(resources)
    meta = isvc.get("metadata") or {}
    pod["metadata"]["labels"] = {ISVC_LABEL: meta.get("name", ""), "component": "predictor"}
    if "namespace" in meta:
        pod["metadata"]["namespace"] = meta["namespace"]
    return pod


def _service_of(runtime: dict, docs: List[dict]) -> Optional[dict]:
    name = (runtime.get("metadata") or {}).get("name")
    for d in docs:
        if d.get("kind") == "InferenceService" and (((d.get("spec") or {}).get("predictor") or {}).get("model") or {}).get("runtime") == name:
            return d
    return None
