"""What serves Triton: the router model's adapter (``router``), each request's parsing and
validation, with the input checks the other models share (``request``), admission control
and the queue-delay estimate (``admission``, ``load``), and what the running python_backend
release offers (``releases``).
"""
