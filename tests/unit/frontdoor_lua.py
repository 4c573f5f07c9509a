"""The front door's gRPC check run by LuaJIT outside nginx (tests/unit/frontdoor_check_harness.lua):
the same Lua that ``orchestrator frontdoor render`` puts into nginx's configuration. Used by
tests/unit/test_frontdoor_lua.py and the differential fuzz in test_frontdoor_protobuf.py."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional, Sequence, Tuple

from orchestrator.tooling import frontdoor as F

HARNESS = Path(__file__).with_name("frontdoor_check_harness.lua")
#: LuaJIT: the ``LUAJIT`` environment variable, else ``luajit`` on PATH. Debian's ``luajit2``
#: package is the OpenResty branch nginx's Lua module links (Debian's plain ``luajit`` conflicts
#: with libnginx-mod-http-lua).
LUAJIT_HINT = "apt-get install luajit2 (the OpenResty LuaJIT that nginx's Lua module links), or set LUAJIT"


def luajit() -> Optional[str]:
    import os

    found = os.environ.get("LUAJIT") or shutil.which("luajit")
    return found if found and os.access(found, os.X_OK) else None


class LuaCheck:
    """``check(request, body) -> (verdict, microseconds, reason)`` in one LuaJIT process; a
    body over ``F.BODY_BUFFER`` is handed over as a file, as nginx keeps it."""

    def __init__(self, routers: Sequence[str], budget: int = F.CHECK_BUDGET, refused: Sequence[str] = ("describe_policy",)):
        binary = luajit()
        if binary is None:
            raise RuntimeError(f"luajit is not installed: {LUAJIT_HINT}")
        self._tmp = tempfile.TemporaryDirectory(prefix="frontdoor-lua-")
        source = Path(self._tmp.name) / "check.lua"
        source.write_text(F.model_check_lua(budget, refused), encoding="utf-8")
        self._body = Path(self._tmp.name) / "body"
        self.proc = subprocess.Popen([binary, str(HARNESS), str(source), ",".join(routers)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def __call__(self, request: str, body: bytes, timeout: float = 30.0) -> Tuple[str, int, str]:
        """The check's verdict on ``body``, its CPU time in microseconds and its reason;
        :class:`TimeoutError` when no answer comes within ``timeout`` seconds (the process is
        then stopped: a check that slow is a failure in itself)."""
        import select

        assert self.proc.stdin and self.proc.stdout
        if len(body) > F.BODY_BUFFER and not request.startswith("JSON:"):
            self._body.write_bytes(body)
            self.proc.stdin.write(f"{request} 0 {self._body}\n".encode())
        else:
            self.proc.stdin.write(f"{request} {len(body)} -\n".encode() + body)
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            self.proc.kill()
            raise TimeoutError(f"the Lua check took over {timeout} s on a body of {len(body)} bytes")
        line = self.proc.stdout.readline().decode()
        if not line:
            raise RuntimeError(f"the Lua check exited ({self.proc.poll()})")
        verdict, us, reason = line.rstrip("\n").split(" ", 2)
        return verdict, int(us), reason

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._tmp.cleanup()
