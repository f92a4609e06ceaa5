-- retry.lua: spread the retries of refused clients over the time places free, instead of sending
-- every refused client back after the time one place takes (a crowd would then return all at once,
-- hundreds of times a second, each refused again).
-- ARGV: prefix, scope ('fleet', or 'key:<name>' for one API key's share), first_ms (when the first
-- place frees), spacing_ms (how long each further place takes to free), max_ms (the longest hint).
-- Each refusal is given the next free retry time of its scope, at least first_ms from now and
-- spacing_ms after the one given before; the scope's key expires once that time has passed, so a
-- crowd that has gone leaves nothing behind.
-- Returns the hint in ms (from now).
local key = P .. ':retry:' .. ARGV[2]
local first, spacing, longest = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
local last = num(redis.call('GET', key), 0)
local at = math.max(now + first, last + spacing)
if at - now > longest then at = now + longest end
redis.call('SET', key, at, 'PX', math.max(1, math.ceil(at - now + spacing)))
return math.ceil(at - now)
