"""Execution environments (``EXECUTION_ENV_PATH``) and Python-backend stubs.

What this package does (``make env``, ``make stub``, ``orchestrator env``, ``orchestrator
stub``, ``orchestrator doctor``; ``python -m orchestrator.tooling.env env ...|stub ...``):

- **build** (:mod:`.build`) a portable environment for our Python models (tokenizer,
  router, postprocess, the ONNX Runtime fallback classifiers): conda + conda-pack where
  ``conda`` exists, else a venv of the requested CPython (pyenv's
  ``~/.pyenv/versions/3.x.y`` or ``python3.x`` on ``PATH``, :mod:`.interpreters`) packed
  with venv-pack, with the interpreter's ``libpython3.x.so.1.0`` copied into the env's
  ``lib/``. Packages come from ``env/requirements-<target>.txt`` plus this checkout's
  ``orchestrator`` package (non-editable, no dependencies);
- **verify** (:mod:`.verify`) a packed env the way the stub will run it (unpacked,
  ``source bin/activate``, env ``lib/`` first on ``LD_LIBRARY_PATH``, ``python3 -I``):
  interpreter version against the stub's libpython, imports, and the static checks of
  :mod:`.checks` (numpy against the stub, libpython, GLIBCXX);
- **install** (:mod:`.install`) it into model directories: ``<model>/triton_env.tar.gz``,
  the stub matching its Python version when that differs from the server's, and
  ``configs/env.pbtxt`` = the model's effective config plus ``EXECUTION_ENV_PATH`` (so
  ``--model-config-name=env`` uses it and the default configs stay as they are);
- **stubs** (:mod:`.stubs`): the embedded server's prebuilt stubs (``nvidia-pytriton``
  wheel, Python 3.8 to 3.13) copied offline into ``stub_build/out/<3.x>/``; other Triton
  releases are built by ``stub_build/build.sh`` in the matching NGC container (needs
  Docker);
- **doctor** (:mod:`.doctor`): per Python model of a repository, will its stub run its env.

Reading an env without running it is :mod:`.inspection`, ELF files and ``ldd``
:mod:`.elf`, the command line :mod:`.commands`; names and paths shared by all are
:mod:`.common`.

Facts used, all from Triton's ``python_backend`` at the server's release branch (r24.10 =
Triton 2.51, the embedded server): ``src/stub_launcher.cc`` runs the stub as ``bash -c
"source <env>/bin/activate && exec env LD_LIBRARY_PATH=<env>/lib:$LD_LIBRARY_PATH
<stub> ..."``, where ``<stub>`` is ``<model dir>/triton_python_backend_stub`` when that file
exists, else the backend's; ``src/pb_env.cc`` extracts a gzip-compressed tar (libarchive,
gzip filter + tar format only) into ``/tmp/python_env_XXXXXX/<n>`` or uses a directory
as it is; ``src/python_be.cc`` replaces ``$$TRITON_MODEL_DIRECTORY`` by the model
directory; the README ("Creating Custom Execution Environments", "Building Custom Python
Backend Stub") requires ``PYTHONNOUSERSITE=True`` while installing, an env interpreter of
the stub's Python version, and says a path escaping the model directory is undefined.
Checked on a real server here (``tests/server/test_env_server.py``): a venv-pack'ed env of
another CPython version (3.12 under the 3.11 embedded server, 3.11 under a 3.12 one) with
its copied libpython and the wheel's stub of that version runs the model on the env's
interpreter with a package only the env has.

Errors are :class:`~.common.EnvError`; a failed build step names the command and its output.
This package imports nothing at import time: import the submodule you need.
"""
