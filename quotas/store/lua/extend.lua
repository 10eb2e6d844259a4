-- extend: take a stream's next output step from the buckets a live lease holds (SPEC C10 in
-- steps), all or nothing, adding it to the lease record's amounts so that settle reconciles
-- against all the lease took (core book.extend). KEYS[1] epoch hash, KEYS[2] lease index,
-- KEYS[3] the grant parts' spec key (lib.lua specs_load; the record's key is made from it).
-- ARGV[1] now (epoch s; '' = Redis TIME), ARGV[2] reservation id, ARGV[3] the spec set's
-- definition or '', then ARGV[3 + i] what part i takes more, in the bucket's unit (0: nothing;
-- the caller sends 0 for concurrency, and a skipped shadow part takes nothing more).
-- A part whose new take lands in another window / slice / interval than its marker's keeps
-- what it took before as used there (the row's locked field); settle then settles only the rest.
-- Returns {'X', now, created, expires, n, (name, amount, marker, skipped, remaining or '')*n,
-- m, (shadow refusals)*m} with the record's rows after the take (remaining: what the bucket
-- has left, for the parts that took); {'R', now, bucket, reason, retry_at, k, (name, reason,
-- retry_at)*k, m, (shadow refusals)*m} when a live bucket refuses (nothing taken);
-- {outcome, now} with outcome expired | closed | unknown when the lease no longer holds
-- (nothing taken: a step that lands after the settle is a no-op); {'S'} when the spec key is
-- unknown (nothing done).
local specs = specs_load(KEYS[3], ARGV[3])
if not specs then return {'S'} end
local now = clock(ARGV[1])
local id, retention = ARGV[2], specs[5]
local born, learning_until = epoch(KEYS[1], now, specs[6])
local rkey = specs[3] .. id

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
if not rec then return {'unknown', fmt(now)} end
if rec[1] ~= 'a' then return {'closed', fmt(now)} end
if rec[3] <= now then
  record_expire(rkey, rec, KEYS[2], now, retention)
  return {'expired', fmt(now)}
end
local by_name = {}
for i = 1, specs[1] do
  local p = spec_part(specs, i)
  p.amount = tonumber(ARGV[3 + i])
  by_name[p.name] = p
end
local rows, parts = {}, {}  -- rows: where each part's record row starts
for i = 1, rec[4] do
  local at = rec_row(i)
  local p = by_name[rec[at + 5]]
  if p and rec[at + 3] ~= 1 and p.amount > 0 then
    rows[#rows + 1] = at
    parts[#parts + 1] = p
  end
end
local left = {}
local shadow = {}
if #parts > 0 then
  local ctx = {now = now, born = born, learning_until = learning_until,
               limit = specs[7], id = id, expiry = rec[3]}
  local res = reserve_parts(ctx, parts)
  if not res.ok then
    local out = {'R', fmt(now), res.bucket, res.reason, fmt(res.retry)}
    refusal_rows(out, res.live)
    return refusal_rows(out, res.shadow)
  end
  shadow = res.shadow
  for i, at in ipairs(rows) do
    local t = res.taken[i]
    if t[3] == 0 then
      if t[2] ~= rec[at + 2] then
        rec[at + 4] = rec[at + 1]
        rec[at + 2] = t[2]
      end
      rec[at + 1] = rec[at + 1] + t[1]
      left[rec[at + 5]] = t[4]
    end
  end
  record_write(rkey, rec, now, retention)
end
local out = {'X', fmt(now), fmt(rec[2]), fmt(rec[3]), rec[4]}
for i = 1, rec[4] do
  local at = rec_row(i)
  local name = rec[at + 5]
  out[#out + 1] = name
  out[#out + 1] = fmt(rec[at + 1])
  out[#out + 1] = fmt(rec[at + 2])
  out[#out + 1] = tostring(rec[at + 3])
  if left[name] then out[#out + 1] = fmt(left[name]) else out[#out + 1] = '' end
end
return refusal_rows(out, shadow)
