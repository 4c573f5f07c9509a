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
-- else "model"; a request parameter named in frontdoor.refused (describe_policy unless the
-- deployment admits it) makes it "parameter".
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

-- A parameter name as Triton keeps it: up to its first NUL (it passes names on as C strings,
-- so "describe_policy\0x" is describe_policy to the router).
local function c_string(s)
  local cut = find(s, "\0", 1, true)
  return cut and sub(s, 1, cut - 1) or s
end

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
  local refused = nil
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
  -- params: schema is a ParametersEntry of the request itself (its key a request parameter).
  message = function(schema, stop, top, params)
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
          local ok, e2 = message(frontdoor.messages[spec.m], finish, false, top and number == 4)
          if not ok then return nil, e2 end
        elseif top and number == 1 then
          model = len <= 256 and text(finish) or ""
        elseif params and number == 1 and len <= 64 and not refused then
          local at = pos
          local key = c_string(text(finish))
          if frontdoor.refused and frontdoor.refused[key] then refused = key end
          pos = at
          if not utf8(finish) then return nil, "field " .. number .. " is not valid UTF-8" end
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
  if admitted and (not model or not admitted[model]) then return "model" end
  if refused then return "parameter", refused end
  return "admit"
end

-- The body in memory (data) or in nginx's temporary file (path): verdict, reason. admitted:
-- the set of router names, or nil for any model (the parameters checked alone).
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

-- An HTTP request's JSON (Triton's KServe v2 JSON; with the binary extension, only its first
-- Inference-Header-Content-Length bytes are JSON): the first string in it that decodes to a
-- name in frontdoor.refused, else nil; "limit" past frontdoor.budget strings and escaped
-- quotes. next_chunk() gives the body piece by piece. Linear in the body: a string is decoded
-- only while it is short enough to be a name (MAXRAW escaped bytes); past that only its
-- closing quote is searched for (a quote after an even run of backslashes).
local MAXRAW = 6 * 64
local ESC = {['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t"}
local function unescape(s)
  return (string.gsub(s, "\\(.)(%x?%x?%x?%x?)", function(c, hex)
    if c == "u" then
      local cp = #hex == 4 and tonumber(hex, 16)
      -- another character than ASCII cannot be in a refused name: "\1" stands for it
      return (cp and cp < 128) and char(cp) or "\1"
    end
    return (ESC[c] or "\1") .. hex
  end))
end
function frontdoor.json_refused(next_chunk)
  local mode, parts, raw, pending, run, work = 0, nil, 0, false, 0, 0
  local budget, refused = frontdoor.budget or 65536, frontdoor.refused or {}
  local chunk = next_chunk()
  while chunk do
    local i, n = 1, #chunk
    while i <= n do
      if mode == 0 then  -- outside a string
        local q = find(chunk, '"', i, true)
        if not q then break end
        work = work + 1
        if work > budget then return "limit" end
        mode, parts, raw, pending, i = 1, {}, 0, false, q + 1
      elseif mode == 1 then  -- in a string short enough to be a name: decoded
        if pending then  -- the byte after a backslash that ended the last piece
          parts[#parts + 1] = sub(chunk, i, i)
          raw, pending, i = raw + 1, false, i + 1
        else
          local k = find(chunk, '["\\]', i)
          local stop = k or n + 1
          parts[#parts + 1] = sub(chunk, i, stop - 1)
          raw = raw + stop - i
          if not k then
            i = n + 1
          elseif byte(chunk, k) == 34 then
            local name = c_string(unescape(table.concat(parts)))
            if refused[name] then return name end
            mode, i = 0, k + 1
          elseif k == n then
            parts[#parts + 1] = "\\"
            raw, pending, i = raw + 1, true, n + 1
          else
            parts[#parts + 1] = sub(chunk, k, k + 1)
            raw, i = raw + 2, k + 2
          end
        end
        if mode == 1 and raw > MAXRAW then
          mode, run, pending, parts = 2, pending and 1 or 0, false, nil
        end
      else  -- in a long string: its closing quote follows an even run of backslashes
        local q = find(chunk, '"', i, true)
        local t = (q or n + 1) - 1
        while t >= i and byte(chunk, t) == 92 do t = t - 1 end
        local backslashes = (q or n + 1) - 1 - t + (t < i and run or 0)
        if not q then
          run, i = backslashes, n + 1
        elseif backslashes % 2 == 0 then
          mode, run, i = 0, 0, q + 1
        else
          work = work + 1
          if work > budget then return "limit" end
          run, i = 0, q + 1
        end
      end
    end
    chunk = next_chunk()
  end
  return nil
end

-- Requests in flight, counted as nginx's limit_conn counts them (in all, per client identity,
-- per source address) only to say which limit refused a request: nginx does not. enter() in
-- the access phase, leave() in the log phase ($frontdoor_counted survives the error_page
-- redirects), which() in the refusal.
local function in_flight_keys()
  return {"all", "c:" .. (ngx.var.frontdoor_in_flight_key or ""), "a:" .. (ngx.var.binary_remote_addr or "")}
end
function frontdoor.enter()
  local d = ngx.shared.frontdoor_in_flight
  if not d or ngx.var.frontdoor_counted ~= "" then return end
  ngx.var.frontdoor_counted = "1"
  for _, key in ipairs(in_flight_keys()) do d:incr(key, 1, 0) end
end
function frontdoor.leave()
  local d = ngx.shared.frontdoor_in_flight
  if not d or ngx.var.frontdoor_counted ~= "1" then return end
  ngx.var.frontdoor_counted = "0"
  for _, key in ipairs(in_flight_keys()) do d:incr(key, -1, 0) end
end
-- "client", "address" or "total": the first of the limits this request's client, address or
-- the door as a whole has reached; "unknown" if none has (the counts are not nginx's own).
function frontdoor.which(per_client, per_address, total)
  local d = ngx.shared.frontdoor_in_flight
  if not d then return "unknown" end
  local keys = in_flight_keys()
  if (d:get(keys[2]) or 0) >= per_client then return "client" end
  if (d:get(keys[3]) or 0) >= per_address then return "address" end
  if (d:get(keys[1]) or 0) >= total then return "total" end
  return "unknown"
end

-- nginx's access phase of an HTTP infer: 403 when the JSON names a refused parameter, 413
-- past the work budget; the answer is written here (JSON), not by an error_page.
function frontdoor.admit_http()
  frontdoor.enter()
  ngx.req.read_body()
  local data, path = ngx.req.get_body_data(), ngx.req.get_body_file()
  -- Only the JSON part, when its length is one plain number (else all of it: more than
  -- Triton reads as JSON is never less)
  local given = ngx.req.get_headers()["inference-header-content-length"]
  local left = type(given) == "string" and string.match(given, "^%d+$") and tonumber(given) or math.huge
  local f = (not data and path) and io.open(path, "rb") or nil
  local function next_chunk()
    if left <= 0 then return nil end
    local piece
    if data then piece, data = data, nil elseif f then piece = f:read(CHUNK) end
    if not piece or #piece == 0 then return nil end
    if #piece > left then piece = sub(piece, 1, left) end
    left = left - #piece
    return piece
  end
  local ok, found = pcall(frontdoor.json_refused, next_chunk)
  if f then f:close() end
  if not ok then
    ngx.log(ngx.ERR, "front door check failed: ", found)
    return
  end
  if not found then return end
  ngx.header.content_type = "application/json"
  if found == "limit" then
    ngx.status = 413
    ngx.say('{"error":"request over the front door limit of work per request: the JSON holds over ' .. frontdoor.budget .. ' strings and escaped quotes"}')
  else
    ngx.status = 403
    ngx.say('{"error":"the request parameter ' .. found .. ' is not admitted by the front door (' .. found .. ': true in its quotas file admits it)"}')
  end
  return ngx.exit(ngx.HTTP_OK)
end

-- nginx's access phase: 403 another model, 400 malformed, 422 over the work budget, 423 a
-- refused request parameter (each
-- error_page answers it as gRPC); the reason goes to $frontdoor_reason.
function frontdoor.admit(request, admitted)
  frontdoor.enter()
  ngx.req.read_body()
  local verdict, why = frontdoor.check(ngx.req.get_body_data(), ngx.req.get_body_file(), request, admitted)
  if verdict == "admit" then return end
  if verdict == "model" then return ngx.exit(403) end
  ngx.var.frontdoor_reason = why
  if verdict == "parameter" then return ngx.exit(423) end
  if verdict == "limit" then return ngx.exit(422) end
  return ngx.exit(400)
end
