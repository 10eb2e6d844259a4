-- reserve: take a reservation's amounts from all its buckets or from none (SPEC C4), in one call.
-- KEYS[1] epoch hash, KEYS[2] lease index (zset: record key -> expiry), KEYS[3] the parts'
-- spec key (lib.lua
-- specs_load: each part's bucket blob, bucket hash, holders zset and its scope's pause key).
-- ARGV[1] now (epoch s; '' = Redis TIME), ARGV[2] reservation id, ARGV[3] lease (s),
-- ARGV[4] the spec set's definition or '', then ARGV[4 + i] part i's amount, in the bucket's
-- unit. From the spec set: the record retention after expiry (s), the max lease (s, the
-- learning period after lost state), the expiry limit (holders expired per bucket and call).
-- Returns {'G', now, n, (marker, skipped, remaining)*n, m, (name, reason, retry_at)*m} for a
-- new grant (created = now, expires = now + lease, amounts as asked; a skipped shadow part took
-- 0; remaining = what the bucket has left after the grant, for response metadata),
-- {'P', now, created, expires, state, n, (name, amount, marker, skipped)*n} for a replay,
-- {'R', now, bucket, reason, retry_at, k, (name, reason, retry_at)*k, m, (shadow
-- refusals)*m}, or {'S'} when the spec key is unknown (nothing done). Numbers are %.17g
-- strings ('inf' when never).
local specs = specs_load(KEYS[3], ARGV[4])
if not specs then return {'S'} end
local now = clock(ARGV[1])
local id, lease, retention = ARGV[2], tonumber(ARGV[3]), specs[5]
local born, learning_until = epoch(KEYS[1], now, specs[6])
local rkey = specs[3] .. id  -- the lease record, in the first part's scope
local n = specs[1]

local function refusal_rows(out, list)
  out[#out + 1] = #list
  for _, row in ipairs(list) do
    out[#out + 1] = row[1]
    out[#out + 1] = row[2]
    out[#out + 1] = fmt(row[3])
  end
  return out
end

local rec = record_load(rkey, now, retention)
if rec then return record_replay(rec, now) end

local parts = {}
for i = 1, n do
  local p = spec_part(specs, i)
  p.amount = tonumber(ARGV[4 + i])
  parts[i] = p
end
local expires = now + lease
local ctx = {now = now, born = born, learning_until = learning_until,
             limit = specs[7], id = id, expiry = expires}
local res = reserve_parts(ctx, parts)
if not res.ok then
  local out = {'R', fmt(now), res.bucket, res.reason, fmt(res.retry)}
  refusal_rows(out, res.live)
  return refusal_rows(out, res.shadow)
end
rec = record_new(id, now, expires, parts, res.taken)
record_write(rkey, rec, now, retention)
redis.call('ZADD', KEYS[2], expires, rkey)
local out = {'G', fmt(now), n}
for i = 1, n do
  local marker = res.taken[i][2]
  if marker == 0 then out[#out + 1] = '0' else out[#out + 1] = fmt(marker) end
  out[#out + 1] = tostring(res.taken[i][3])
  out[#out + 1] = fmt(res.taken[i][4])
end
return refusal_rows(out, res.shadow)
