"""The routing policy's format, compiled once at load: the declaration and parser
(``schema``, ``policy``), the generated docs (``policy_docs``), the models' heads
(``heads``, with ``sigmoid`` and ``logit``) and one module per node kind (``nodes``).
"""
