// strata bench io: lands with the I/O engine
