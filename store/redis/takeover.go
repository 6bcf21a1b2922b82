package redis

// takeoverScript replaces a dead owner's claim, whose head up to its flags
// is ARGV[1], with the claim ARGV[2] for ARGV[3] ms, its lease ending ARGV[4]
// ns past Redis's clock, and answers 1; a key gone meanwhile it claims too,
// answering 0. A key that holds anything else now (renewed, ended, taken
// over by another) it leaves, and answers what it holds, for Acquire to
// decide again; so too the dead claim itself while its lease holds by
// Redis's clock, the one clock all instances share. The flags are left out
// of the comparison: a waiter may have marked the dead claim watched.
var takeoverScript = codecScript(`
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[1]) ~= ARGV[1] then return held end` + redisNow + `
if held and struct.unpack('>I8', held, {lease_end} + 1) > now then return held end
local claim = string.sub(ARGV[2], 1, {lease_end}) .. struct.pack('>I8', now + tonumber(ARGV[4])) .. string.sub(ARGV[2], {lease_end} + 9)
redis.call('SET', KEYS[1], claim, 'PX', ARGV[3])
if held then return 1 end
return 0
`)
