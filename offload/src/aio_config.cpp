// placeholder until the I/O engine lands
