-- batch: several entry calls of one gateway process in one FCALL (quotas/store/library.py,
-- FunctionLibrary: the calls that came while its previous call was on its way). They run in
-- the order sent, each exactly as if called alone; one's error is its own reply, not the
-- others'.
-- ARGV[1] n; then per call its entry's name, key count and argument count; then the calls'
-- keys, one call after another, in KEYS, and their arguments likewise in ARGV.
-- Returns per call {reply} (a reply of nil is {}), or an error reply.
local n = tonumber(ARGV[1])
local out = {}
local k, a = 0, 1 + 3 * n
for c = 1, n do
  local at = 3 * c - 1
  local fn = ENTRY[ARGV[at]]
  local nk, na = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local keys, args = {}, {}
  for i = 1, nk do keys[i] = KEYS[k + i] end
  for i = 1, na do args[i] = ARGV[a + i] end
  k, a = k + nk, a + na
  local ok, reply = pcall(fn, keys, args)
  if ok then
    out[c] = {reply}
  elseif type(reply) == 'table' and reply.err then
    out[c] = reply
  else
    out[c] = redis.error_reply(tostring(reply))
  end
end
return out
