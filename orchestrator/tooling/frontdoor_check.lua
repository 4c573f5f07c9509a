-- The front door's gRPC model check (docs/guides/front-door.md), run by nginx's Lua module
-- in the access phase after client_max_body_size has bounded the body. orchestrator
-- frontdoor render puts this file into init_by_lua_block after the message table
-- (frontdoor.messages, from PROTO_MESSAGES in frontdoor.py) and the work budget
-- (frontdoor.budget); tests/unit/test_frontdoor_lua.py runs it under LuaJIT directly.
--
-- It reads the body as protobuf reads it and admits only what every protobuf parser reads
-- the same way: one uncompressed gRPC message filling the body; every tag a minimal varint
-- of at most 5 bytes naming a field of the message with that field's wire type (repeated
-- numbers packed or not); every varint minimal and at most 64 bits, a bool 0 or 1; every
-- length within its message; strings valid UTF-8; a singular field, and a oneof, at most
-- once; nested messages read the same way. Anything else is refused, never skipped:
-- "malformed" and the reason. Then field 1 (the model name) must be an admitted router,
-- else "model".
--
-- Cost: every byte is looked at at most once (lengths are skipped, a UTF-8 search covers
-- the string and stops at its end), so the work is linear in the body; and each tag, packed
-- varint and non-ASCII character counts against frontdoor.budget: past it the verdict is
-- "limit", whatever the body holds. A body nginx kept in a file is read in 64 KiB chunks, so
-- the memory a check holds does not grow with the body.
frontdoor = frontdoor or {}
local byte, char, find, sub, floor, min = string.byte, string.char, string.find, string.sub, math.floor, math.min
local CHUNK = 65536
local WIRE = {string = 2, bytes = 2, message = 2, bool = 0, int = 0, fixed32 = 5, fixed64 = 1}
local SIZE = {fixed32 = 4, fixed64 = 8}
-- Raised (error) when the work budget is spent; check() turns it into the verdict "limit".
local OVER = {}

-- The UTF-8 lead byte c: how many continuation bytes follow and the first one's range.
local function lead(c)
  if c >= 0xC2 and c <= 0xDF then return 1, 0x80, 0xBF
  elseif c == 0xE0 then return 2, 0xA0, 0xBF
  elseif c == 0xED then return 2, 0x80, 0x9F
  elseif c >= 0xE1 and c <= 0xEF then return 2, 0x80, 0xBF
  elseif c == 0xF0 then return 3, 0x90, 0xBF
  elseif c >= 0xF1 and c <= 0xF3 then return 3, 0x80, 0xBF
  elseif c == 0xF4 then return 3, 0x80, 0x8F
  end
  return nil
end

-- verdict, reason: "admit", "model" (not an admitted router) or "malformed" and why.
local function parse(data, f, total, request, admitted)
  local base, pos, work, budget = 0, 0, 0, frontdoor.budget or 65536
  local function spend()
    work = work + 1
    if work > budget then error(OVER, 0) end
  end
  local function getbyte()
    local i = pos - base
    if i < 0 or i >= #data then
      if not f or pos >= total then return nil end
      f:seek("set", pos)
      data, base, i = f:read(CHUNK) or "", pos, 0
      if #data == 0 then return nil end
    end
    pos = pos + 1
    return byte(data, i + 1)
  end
  local function varint(stop, most)
    local v, scale = 0, 1
    for n = 1, most do
      if pos >= stop then return nil, "a varint runs past its message" end
      local c = getbyte()
      if not c then return nil, "a varint runs past the body" end
      if c < 128 then
        if c == 0 and n > 1 then return nil, "a varint is not minimally encoded" end
        if n == 10 and c > 1 then return nil, "a varint is over 64 bits" end
        return v + c * scale
      end
      v, scale = v + (c - 128) * scale, scale * 128
    end
    return nil, (most == 5 and "a tag is" or "a varint is") .. " over " .. most .. " bytes"
  end
  -- The bytes up to stop are valid UTF-8. The search for a non-ASCII byte runs in the
  -- string's own bytes (seg), never past its end: searching the whole buffer from each
  -- string made a body of many short strings quadratic.
  local function utf8(stop)
    while pos < stop do
      if not getbyte() then return false end
      pos = pos - 1
      local first = pos - base + 1
      local seg = sub(data, first, min(#data, stop - base))
      local at, j = pos, 1
      spend()
      while true do
        local k = find(seg, "[\128-\255]", j)
        if not k then
          pos = at + #seg
          break
        end
        spend()
        local n, lo, hi = lead(byte(seg, k))
        if not n then return false end
        if k + n <= #seg then
          for t = 1, n do
            local d = byte(seg, k + t)
            if d < lo or d > hi then return false end
            lo, hi = 0x80, 0xBF
          end
          j = k + n + 1
        else
          -- the character runs past this chunk: read on byte by byte
          pos = at + k
          for _ = 1, n do
            if pos >= stop then return false end
            local d = getbyte()
            if not d or d < lo or d > hi then return false end
            lo, hi = 0x80, 0xBF
          end
          break
        end
      end
    end
    return true
  end
  local function text(stop)
    local out = {}
    while pos < stop do out[#out + 1] = char(getbyte()) end
    return table.concat(out)
  end
  local message
  message = function(schema, stop, top)
    local seen, model = {}, nil
    while pos < stop do
      spend()
      local key, err = varint(stop, 5)
      if not key then return nil, err end
      local number, wire = floor(key / 8), key % 8
      local spec = schema[number]
      if not spec then return nil, "field " .. number .. " is not a field of the request" end
      local want = WIRE[spec.k]
      local packed = spec.r and want ~= 2 and wire == 2
      if wire ~= want and not packed then
        return nil, "field " .. number .. " has wire type " .. wire .. ", not " .. want
      end
      if not spec.r then
        if seen[number] then return nil, "field " .. number .. " occurs twice" end
        seen[number] = true
        if spec.o then
          if seen[spec.o] then return nil, "two fields of oneof " .. spec.o end
          seen[spec.o] = true
        end
      end
      if wire == 0 then
        local v, e = varint(stop, 10)
        if not v then return nil, e end
        if spec.k == "bool" and v > 1 then return nil, "field " .. number .. " is a bool other than 0 or 1" end
      elseif wire ~= 2 then
        if pos + SIZE[spec.k] > stop then return nil, "field " .. number .. " runs past its message" end
        pos = pos + SIZE[spec.k]
      else
        local len, e = varint(stop, 5)
        if not len then return nil, e end
        local finish = pos + len
        if finish > stop then return nil, "field " .. number .. " runs past its message" end
        if packed and SIZE[spec.k] then
          if len % SIZE[spec.k] ~= 0 then return nil, "packed field " .. number .. " is not whole values" end
        elseif packed then
          while pos < finish do
            spend()
            local v, e2 = varint(finish, 10)
            if not v then return nil, e2 end
            if spec.k == "bool" and v > 1 then return nil, "field " .. number .. " is a bool other than 0 or 1" end
          end
        elseif spec.k == "message" then
          local ok, e2 = message(frontdoor.messages[spec.m], finish, false)
          if not ok then return nil, e2 end
        elseif top and number == 1 then
          model = len <= 256 and text(finish) or ""
        elseif spec.k == "string" and not utf8(finish) then
          return nil, "field " .. number .. " is not valid UTF-8"
        end
        pos = finish
      end
    end
    return true, nil, model
  end
  if total < 5 then return "malformed", "not a gRPC message" end
  local flag, b2, b3, b4, b5 = getbyte(), getbyte(), getbyte(), getbyte(), getbyte()
  if flag ~= 0 then return "malformed", "a compressed gRPC message cannot be inspected" end
  if ((b2 * 256 + b3) * 256 + b4) * 256 + b5 ~= total - 5 then
    return "malformed", "the gRPC length prefix is not the length of the body"
  end
  local ok, err, model = message(frontdoor.messages[request], total, true)
  if not ok then return "malformed", err end
  if not model or not admitted[model] then return "model" end
  return "admit"
end

-- The body in memory (data) or in nginx's temporary file (path): verdict, reason.
function frontdoor.check(data, path, request, admitted)
  local f, total = nil, data and #data
  if not data then
    if not path then return "malformed", "no request body" end
    f = io.open(path, "rb")
    if not f then return "malformed", "the request body could not be read" end
    total, data = f:seek("end"), ""
  end
  local ok, verdict, why = pcall(parse, data, f, total, request, admitted)
  if f then f:close() end
  if not ok then
    if verdict == OVER then
      return "limit", "the request holds over " .. frontdoor.budget .. " protobuf fields, packed values and non-ASCII characters"
    end
    if ngx then ngx.log(ngx.ERR, "front door check failed: ", verdict) end
    return "malformed", "the request could not be read"
  end
  return verdict, why
end

-- nginx's access phase: 403 another model, 400 malformed, 422 over the work budget (each
-- error_page answers it as gRPC); the reason goes to $frontdoor_reason.
function frontdoor.admit(request, admitted)
  ngx.req.read_body()
  local verdict, why = frontdoor.check(ngx.req.get_body_data(), ngx.req.get_body_file(), request, admitted)
  if verdict == "admit" then return end
  if verdict == "model" then return ngx.exit(403) end
  ngx.var.frontdoor_reason = why
  if verdict == "limit" then return ngx.exit(422) end
  return ngx.exit(400)
end
