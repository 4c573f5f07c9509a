"""What serves Triton: the router model's adapter (``router``, with its queue-delay
estimate), each request's parsing and validation, with the input checks the other models
share (``request``), admission control (``admission``) and what the running
python_backend release offers (``releases``).
"""
