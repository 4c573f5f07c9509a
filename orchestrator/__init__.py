"""orchestrator: a BLS router for NVIDIA Triton Inference Server that replaces an ensemble."""

__version__ = "0.1.0"
