-- Runs the front door's gRPC check (orchestrator/tooling/frontdoor_check.lua) outside nginx,
-- for tests/unit/frontdoor_lua.py: luajit frontdoor_check_harness.lua CHECK ROUTER[,ROUTER...]
-- CHECK is the Lua nginx runs (frontdoor.model_check_lua()). Then, per request on stdin, the
-- line "REQUEST SIZE -" followed by SIZE bytes of body (in memory, as nginx holds a small
-- body), or "REQUEST 0 PATH" (a body nginx kept in a file); per answer on stdout the line
-- "VERDICT MICROSECONDS REASON" (the check's CPU time, os.clock). REQUEST "JSON:N" runs the HTTP
-- check (frontdoor.json_refused) on an in-memory body handed over in pieces of N bytes.
dofile(arg[1])
local admitted = {}
for name in string.gmatch(arg[2], "[^,]+") do admitted[name] = true end
if arg[2] == "" then admitted = nil end  -- no model check: the refused parameters alone
io.stdout:setvbuf("no")
while true do
  local line = io.stdin:read("*l")
  if not line then break end
  local request, size, path = string.match(line, "^(%S+) (%d+) (%S+)$")
  local data = nil
  if path == "-" then data = io.stdin:read(tonumber(size)) or "" else data = nil end
  local t0 = os.clock()
  local verdict, why
  local piece = tonumber(string.match(request, "^JSON:(%d+)$") or "")
  if piece then  -- an HTTP body's JSON, handed over in pieces of this many bytes
    local at = 1
    local found = frontdoor.json_refused(function()
      if at > #data then return nil end
      local p = string.sub(data, at, at + piece - 1)
      at = at + piece
      return p
    end)
    verdict, why = found == "limit" and "limit" or (found and "parameter" or "admit"), found ~= "limit" and found or ""
  else
    verdict, why = frontdoor.check(data, path ~= "-" and path or nil, request, admitted)
  end
  local us = math.floor((os.clock() - t0) * 1e6 + 0.5)
  io.stdout:write(verdict, " ", us, " ", (string.gsub(why or "", "\n", " ")), "\n")
end
