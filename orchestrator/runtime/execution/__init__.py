"""Running a policy over one execute's texts: the engine made at load and a run per execute
(``engine``), model calls and tokens (``calls``, ``tokenize``), deadlines, cancellation
and what each call carries (``deadlines``), which calls may block the loop
(``concurrency``) and the shadow queue (``mirror``).
"""
