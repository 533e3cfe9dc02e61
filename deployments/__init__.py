"""Example Ray Serve and Ray Data deployments of ``ray_triton_shm`` (run from the repo root)."""
