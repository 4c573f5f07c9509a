"""The downstream models behind BLS: the one client every call goes through
(``downstream``), circuit breakers (``health``), dead stubs seen in /proc (``stubs``),
the server's repository API (``control``) and on-demand loading and repairs
(``ondemand``).
"""
