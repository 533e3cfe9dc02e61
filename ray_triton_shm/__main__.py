"""``python -m ray_triton_shm``: the ``ray-triton-shm`` command line."""

import sys

from ray_triton_shm._cli import main

sys.exit(main())
