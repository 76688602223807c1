"""The cache follower's server-side compare-and-set: Lua scripts run by Redis (EVALSHA).

Positions are (commit LSN, index in the transaction), compared as decimal strings (exact for
any 64-bit LSN; Lua numbers are doubles). A cached value starts with
`{"_cdc_lsn":<lsn>,"_cdc_seq":<seq>,` so a script reads the stored position with GETRANGE of
its first bytes and one pattern match, whatever the row's size. Tombstones and truncate
markers hold `<lsn>:<seq>`.

Merging unchanged-TOAST columns does not decode and re-encode the JSON (cjson would print
numbers with 14 digits and turn `[]` into `{}`): a small scanner splits the top-level members
of both documents as raw text, and the flagged members of the new document take the raw text
the stored document has under the same name.
"""

from __future__ import annotations

_COMMON = r"""
local HEAD = '^{"_cdc_lsn":(%d+),"_cdc_seq":(%d+)'
local POS = '^(%d+):(%d+)$'

-- (al, as) < (bl, bs) for decimal strings without leading zeros
local function older(al, as, bl, bs)
  if al ~= bl then
    if #al ~= #bl then return #al < #bl end
    return al < bl
  end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end

-- index of the quote closing the JSON string that opens at i
local function skip_string(s, i)
  local j = i + 1
  while true do
    local p = string.find(s, '["\\]', j)
    if not p then return error('cdc: malformed JSON string in a cached value') end
    if string.byte(s, p) == 92 then j = p + 2 else return p end
  end
end

-- index of the last character of the JSON value that starts at i (no whitespace: Spark's to_json)
local function skip_value(s, i)
  local c = string.byte(s, i)
  if c == 34 then return skip_string(s, i) end
  if c == 91 or c == 123 then
    local depth, j = 1, i + 1
    while true do
      local p = string.find(s, '["%[%]{}]', j)
      if not p then return error('cdc: malformed JSON in a cached value') end
      local b = string.byte(s, p)
      if b == 34 then
        j = skip_string(s, p) + 1
      elseif b == 91 or b == 123 then
        depth = depth + 1
        j = p + 1
      else
        depth = depth - 1
        if depth == 0 then return p end
        j = p + 1
      end
    end
  end
  local p = string.find(s, '[,}%]]', i)
  if not p then return error('cdc: malformed JSON in a cached value') end
  return p - 1
end

-- the top-level members of a JSON object as raw texts: names (quoted) and values, in order
local function members(s)
  local names, values = {}, {}
  local i, n = 2, #s
  while i <= n do
    local c = string.byte(s, i)
    if c == 125 then break end
    if c == 44 then i = i + 1 end
    local ne = skip_string(s, i)
    local ve = skip_value(s, ne + 2)
    names[#names + 1] = string.sub(s, i, ne)
    values[#values + 1] = string.sub(s, ne + 2, ve)
    i = ve + 1
  end
  return names, values
end

local function join(names, values)
  local parts = {}
  for j = 1, #names do parts[j] = names[j] .. ':' .. values[j] end
  return '{' .. table.concat(parts, ',') .. '}'
end

-- the new document with the members at the listed indexes (1-based) taken from the stored one
-- (stored: nil when no row is cached). A member the stored row lacks is left out of the new one, as
-- is one marked 'o' (a column the source dropped: the row keeps what it had, and it had nothing).
-- nil when an unmarked member (an unchanged-TOAST value) has no cached row to come from.
local function merge(stored, new, flags)
  local have = {}
  if stored then
    local on, ov = members(stored)
    for j = 1, #on do have[on[j]] = ov[j] end
  end
  local nn, nv = members(new)
  local gone = {}
  for opt, idx in string.gmatch(flags, '(o?)(%d+)') do
    local j = tonumber(idx)
    local v = have[nn[j]]
    if v ~= nil then
      nv[j] = v
    elseif stored or opt == 'o' then
      gone[j] = true
    else
      return nil
    end
  end
  local kn, kv = {}, {}
  for j = 1, #nn do
    if not gone[j] then
      kn[#kn + 1] = nn[j]
      kv[#kv + 1] = nv[j]
    end
  end
  return join(kn, kv)
end

local function marker(key)
  local m = redis.call('GET', key)
  if m then return string.match(m, POS) end
  return nil, nil
end
"""

# KEYS[1]: the table's truncate marker; then per row i: KEYS[2i] row key, KEYS[2i+1] its tombstone.
# ARGV[1]: ttl of cached rows in seconds (0 = none); ARGV[2]: tombstone ttl in seconds; then per row
# 5 values: op ('c','u','r' upsert, 'd' delete), lsn, seq, value (JSON, '' for a delete), indexes of
# the value's members whose cached value is kept ('' = none; comma-separated, 1-based; 'o' before an
# index: a column the source dropped, left out where the cached row lacks it).
# Returns {inserted, updated, deleted, ignored}.
UPSERT = (
    _COMMON
    + r"""
local ttl = tonumber(ARGV[1])
local tomb_ttl = ARGV[2]
local ml, ms = marker(KEYS[1])
local ins, upd, del, ign = 0, 0, 0, 0
local a = 3
for i = 2, #KEYS, 2 do
  local key, tomb = KEYS[i], KEYS[i + 1]
  local op, lsn, seq, value, flags = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  a = a + 5
  if ml and older(lsn, seq, ml, ms) then
    ign = ign + 1  -- older than the table's last truncate: it is gone
  else
    local sl, ss = string.match(redis.call('GETRANGE', key, 0, 63), HEAD)
    local stale = false
    if sl and ml and older(sl, ss, ml, ms) then
      sl, ss, stale = nil, nil, true  -- written before the truncate, not purged yet
    end
    local skip, tombed = false, false
    if sl then
      skip = not older(sl, ss, lsn, seq)
    else
      local t = redis.call('GET', tomb)
      if t then
        tombed = true
        local tl, ts = string.match(t, POS)
        skip = tl ~= nil and not older(tl, ts, lsn, seq)
      end
    end
    if skip then
      ign = ign + 1
    elseif op == 'd' then
      redis.call('DEL', key)
      if sl then del = del + 1 end
      redis.call('SET', tomb, lsn .. ':' .. seq, 'EX', tomb_ttl)
    else
      if flags ~= '' then
        value = merge(sl and redis.call('GET', key) or nil, value, flags)
      end
      if value == nil then
        -- unchanged TOAST values with nothing cached to keep: leave the row out (a cache miss)
        if stale then redis.call('DEL', key) end
        ign = ign + 1
      else
        if ttl > 0 then
          redis.call('SET', key, value, 'EX', ttl)
        else
          redis.call('SET', key, value)
        end
        if tombed then redis.call('DEL', tomb) end
        if sl then upd = upd + 1 else ins = ins + 1 end
      end
    end
  end
end
return {ins, upd, del, ign}
"""
)

# KEYS[1]: truncate marker; ARGV: lsn, seq. Raises the marker to (lsn, seq) unless it is newer.
MARK = (
    _COMMON
    + r"""
local ml, ms = marker(KEYS[1])
if ml and not older(ml, ms, ARGV[1], ARGV[2]) then return ml .. ':' .. ms end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2])
return ARGV[1] .. ':' .. ARGV[2]
"""
)

# KEYS[1]: the follower's fence; KEYS[2]: a table's marker; ARGV: the fence's token, the marker. The
# marker is written only while the fence the cut began with is there: else Redis lost its data during
# the cut (FLUSHALL, FLUSHDB, a restart without persistence) and the marker is removed instead, so the
# next check finds the table lost. Returns 1 (written) or 0 (the fence was gone).
FENCED_MARKER = r"""
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[2])
return 0
"""

# KEYS[1]: truncate marker; KEYS[2..]: row keys (from SCAN). Deletes the cached rows older than the
# marker; other keys (newer rows, values of other types or not ours) are left alone. Returns the count.
PURGE = (
    _COMMON
    + r"""
local ml, ms = marker(KEYS[1])
if not ml then return 0 end
local n = 0
for i = 2, #KEYS do
  local head = redis.pcall('GETRANGE', KEYS[i], 0, 63)
  if type(head) == 'string' then
    local sl, ss = string.match(head, HEAD)
    if sl and older(sl, ss, ml, ms) then
      redis.call('DEL', KEYS[i])
      n = n + 1
    end
  end
end
return n
"""
)

# KEYS: row keys (from SCAN). `change(value)` gives the new value of each cached row (nil: leave
# it), which is stored with its TTL kept; values that are not our rows are left alone. Returns how
# many rows changed.
_EACH_ROW = r"""
local function each_row(change)
  local n = 0
  for i = 1, #KEYS do
    local v = redis.pcall('GET', KEYS[i])
    if type(v) == 'string' and string.match(v, HEAD) then
      local new = change(v)
      if new then
        redis.call('SET', KEYS[i], new, 'KEEPTTL')
        n = n + 1
      end
    end
  end
  return n
end
"""

# KEYS: row keys (from SCAN); ARGV[1]: a member `"name":value`, ARGV[2]: its quoted name. Adds the
# member to cached rows written before the column existed (they lack it); keeps their ttl.
BACKFILL = (
    _COMMON
    + _EACH_ROW
    + r"""
return each_row(function(v)
  local names = members(v)
  for j = 1, #names do
    if names[j] == ARGV[2] then return nil end
  end
  return string.sub(v, 1, -2) .. ',' .. ARGV[1] .. '}'
end)
"""
)

# Source column renamed: KEYS are row keys; ARGV[1] the column's new name, ARGV[2..] its older
# names (newest first), each quoted as in the JSON. A row holding an older name and not the new
# one gets the member renamed in place (value, order and TTL kept). Returns the rows renamed.
RENAME = (
    _COMMON
    + _EACH_ROW
    + r"""
return each_row(function(v)
  local names, values = members(v)
  for j = 1, #names do
    if names[j] == ARGV[1] then return nil end
  end
  for k = 2, #ARGV do
    for j = 1, #names do
      if names[j] == ARGV[k] then
        names[j] = ARGV[1]
        return join(names, values)
      end
    end
  end
  return nil
end)
"""
)

# A column the source dropped, with `dropped_columns: null | drop`: KEYS are row keys; ARGV[1] 'null'
# or 'drop', ARGV[2..] the columns' quoted names. Each cached row gets the member set to null, or
# loses it (other members' text, order and the TTL kept). Returns the rows changed.
RETIRE = (
    _COMMON
    + _EACH_ROW
    + r"""
return each_row(function(v)
  local names, values = members(v)
  local kept_names, kept_values, changed = {}, {}, false
  for j = 1, #names do
    local hit = false
    for k = 2, #ARGV do
      if names[j] == ARGV[k] then hit = true end
    end
    if hit and ARGV[1] == 'drop' then
      changed = true
    else
      if hit and values[j] ~= 'null' then
        values[j] = 'null'
        changed = true
      end
      kept_names[#kept_names + 1] = names[j]
      kept_values[#kept_values + 1] = values[j]
    end
  end
  if not changed then return nil end
  return join(kept_names, kept_values)
end)
"""
)
