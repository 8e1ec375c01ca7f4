DERIVE = []
