-- Runs the front door's gRPC check (orchestrator/tooling/frontdoor_check.lua) outside nginx,
-- for tests/unit/frontdoor_lua.py: luajit frontdoor_check_harness.lua CHECK ROUTER[,ROUTER...]
-- CHECK is the Lua nginx runs (frontdoor.model_check_lua()). Then, per request on stdin, the
-- line "REQUEST SIZE -" followed by SIZE bytes of body (in memory, as nginx holds a small
-- body), or "REQUEST 0 PATH" (a body nginx kept in a file); per answer on stdout the line
-- "VERDICT MICROSECONDS REASON" (the check's CPU time, os.clock).
dofile(arg[1])
local admitted = {}
for name in string.gmatch(arg[2], "[^,]+") do admitted[name] = true end
io.stdout:setvbuf("no")
while true do
  local line = io.stdin:read("*l")
  if not line then break end
  local request, size, path = string.match(line, "^(%S+) (%d+) (%S+)$")
  local data = nil
  if path == "-" then data = io.stdin:read(tonumber(size)) or "" else data = nil end
  local t0 = os.clock()
  local verdict, why = frontdoor.check(data, path ~= "-" and path or nil, request, admitted)
  local us = math.floor((os.clock() - t0) * 1e6 + 0.5)
  io.stdout:write(verdict, " ", us, " ", (string.gsub(why or "", "\n", " ")), "\n")
end
