"""One inference request: the sans-I/O engine, a model's pool as the engine sees it, inputs
checked and written, outputs read, requests made, the transport chosen and proven."""
