"""The wire: how requests reach Triton and what its answers and refusals mean (the gRPC
channel, the HTTP/1.1 client, TLS, access keys, waiting for Triton while it restarts)."""
