-- settle: reconcile a reservation with actual usage, or release it (SPEC C6, C10), in one call.
-- KEYS[1] epoch hash, KEYS[2] lease index, KEYS[3] the grant parts' spec key (lib.lua
-- specs_load; the lease record's key is made from it).
-- ARGV[1] now (epoch s; '' = Redis TIME), ARGV[2] reservation id, ARGV[3] '1' release
-- (actual = 0) / '0' reconcile, ARGV[4..9] actual requests, input tokens, output tokens,
-- total tokens, spend (USD), cached input tokens (of the input), ARGV[10] the spec set's
-- definition or ''. Max lease, expiry limit and retention come from the spec set.
-- Returns {outcome, now, n, (name, estimated, actual, released, charged)*n}; outcome is
-- reconciled | released | expired | closed | unknown (the last three change nothing); {'S'}
-- when the spec key is unknown (nothing done). The spec set is a second value (for
-- queue_settle; a script's reply is its first).
-- A part whose actual amount equals what it took (a request count, an exact estimate) is left
-- as it is: settling it would change nothing (core book.settle skips it too). Concurrency is
-- always released. A row's fifth field (extend.lua) is what it took before its marker's window:
-- counted as used there, so only the rest is settled in the marker's.
local specs = specs_load(KEYS[3], ARGV[10])
if not specs then return {'S'} end
local now = clock(ARGV[1])
local id, retention = ARGV[2], specs[5]
local rkey = specs[3] .. id
local born = epoch(KEYS[1], now, specs[6])
local limit = specs[7]
local release = ARGV[3] == '1'
local usage = {requests = tonumber(ARGV[4]), input_tokens = tonumber(ARGV[5]),
               output_tokens = tonumber(ARGV[6]), total_tokens = tonumber(ARGV[7]),
               spend = tonumber(ARGV[8]), concurrency = 0}
local cached_input = tonumber(ARGV[9])

local rec = record_load(rkey, now, retention)
if not rec then return {'unknown', fmt(now), 0}, specs end
if rec[1] ~= 'a' then return {'closed', fmt(now), 0}, specs end
if rec[3] <= now then
  record_expire(rkey, rec, KEYS[2], now, retention)
  return {'expired', fmt(now), 0}, specs
end
local by_name = spec_by_name(specs)  -- read only, shared between calls
local out = {release and 'released' or 'reconciled', fmt(now), 0}
for i = 1, rec[4] do
  local at = rec_row(i)
  local p = by_name[rec[at + 5]]
  if p then
    local taken, marker, skipped = rec[at + 1], rec[at + 2], rec[at + 3] == 1
    -- what earlier steps of a stream took in windows before the marker's (extend.lua)
    local locked = rec[at + 4]
    local actual = 0
    if not release then
      actual = usage[p.dim]
      -- core book.actual_amount: a limit that does not count prompt-cache reads
      if p.cached_free and p.dim == 'input_tokens' then
        actual = math.max(0, actual - cached_input)
      end
    end
    out[3] = out[3] + 1
    out[#out + 1] = p.name
    if skipped then
      out[#out + 1] = '0'
      out[#out + 1] = fmt(actual)
      out[#out + 1] = '0'
      out[#out + 1] = '0'
    else
      local seg, held = taken, actual
      if locked > 0 then seg, held = taken - locked, math.max(0, actual - locked) end
      if held ~= seg or p.rule == 'concurrency' then
        local v = view(p, p.key, p.hkey, now, born, limit, settle_field(p, marker, id))
        settle(p, v, p.key, p.hkey, now, seg, held, marker, id)
      end
      -- released and charged: one of them is 0 (no number to format); actual as taken when
      -- they are equal (a request count, an exact estimate): formatted once
      local shown = fmt(taken)
      out[#out + 1] = shown
      if actual ~= taken then shown = fmt(actual) end
      out[#out + 1] = shown
      if seg > held then
        out[#out + 1] = fmt(seg - held)
        out[#out + 1] = '0'
      elseif held > seg then
        out[#out + 1] = '0'
        out[#out + 1] = fmt(held - seg)
      else
        out[#out + 1] = '0'
        out[#out + 1] = '0'
      end
    end
  end
end
record_mark(rkey, rec, release and 'released' or 'reconciled')
redis.call('ZREM', KEYS[2], rkey)
return out, specs
