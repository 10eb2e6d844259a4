-- queue_settle: settle.lua (reconcile or release) and then the pool's pump, in one call, so
-- capacity given back goes to the next waiter at once (SPEC C6, D2). settle.lua is the body of
-- settle_main(KEYS, ARGV) in the function library (quotas/store/library.py).
-- KEYS: settle.lua's 3 (the pool's keys are made from qp, as queue_admit's are); with a ledger
-- carry (quotas/store/base.py LedgerCarry) also KEYS[4] the ledger list, KEYS[5] its birth mark.
-- ARGV: settle.lua's 10 (the pool's qp and the store's settings come from the spec set); with a
-- carry ARGV[11] the birth mark to set if none, ARGV[12] the settled record ('' when none),
-- ARGV[13] w, then w × (key, value, px) keys to set, then the records to append as they are.
-- Returns {settle.lua's reply, {now, next_fit, depth, granted, refused}}, plus, with a carry,
-- the birth mark found (or set); {'S'} when the spec key is unknown (nothing done). The trailer
-- is not sent back: the caller has the settlement in the reply (and ~0.5 KB a request less). An empty queue costs one ZCARD
-- after the settle.
local settled, specs = settle_main(KEYS, ARGV)
if settled[1] == 'S' then return settled end

-- The ledger's append (gateway/ledger.py) in the settle's round trip: the settled record is
-- the reservation's, completed here with what the settle did, as a JSON trailer:
-- '\3' + its length (4 bytes, big endian) + the record + {"outcome": ..., "settled": {bucket:
-- {"released": r, "charged": c}}} (numbers %.17g, as settle's reply has them).
local born = nil
if #KEYS >= 5 then
  local items = {}
  if ARGV[12] ~= '' then
    local rows = {}
    for i = 1, settled[3] do
      local at = 4 + 5 * (i - 1)
      rows[i] = cjson.encode(settled[at]) .. ':{"released":' .. settled[at + 3] ..
        ',"charged":' .. settled[at + 4] .. '}'
    end
    local trailer = '{"outcome":"' .. settled[1] .. '","settled":{' .. table.concat(rows, ',') ..
      '}}'
    items[1] = '\3' .. struct.pack('>I4', #ARGV[12]) .. ARGV[12] .. trailer
  end
  local w = tonumber(ARGV[13])
  for i = 1, w do
    local at = 14 + 3 * (i - 1)
    redis.call('SET', ARGV[at], ARGV[at + 1], 'PX', ARGV[at + 2])
  end
  for i = 14 + 3 * w, #ARGV do items[#items + 1] = ARGV[i] end
  if #items > 0 then redis.call('RPUSH', KEYS[4], unpack(items)) end
  born = redis.call('SET', KEYS[5], ARGV[11], 'NX', 'GET') or ARGV[11]
end

local now = tonumber(settled[2])
local Q = q_keys(specs[4])
local pumped
if redis.call('ZCARD', Q.d) == 0 then
  pumped = q_pumped(now, INF, 0, 0, 0)
else
  Q = q_load(specs[4])
  local born_at, learning_until = epoch(KEYS[1], now, specs[6])
  local ctx = {now = now, born = born_at, learning_until = learning_until,
               limit = specs[7], retention = specs[5], index = KEYS[2]}
  local next_fit, granted, refused, _, depth = q_pump(Q, ctx, nil)
  pumped = q_pumped(now, next_fit, granted, refused, depth)
end
if born then return {settled, pumped, born} end
return {settled, pumped}
