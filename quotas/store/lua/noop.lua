-- noop: the benchmark's baseline; takes the same KEYS and ARGV as reserve and returns 1.
return 1
