"""The README's promises: its first commands, and the seed-style example, run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make bench", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_seed_example_runs_unchanged_against_our_client(grpc_url: str) -> None:
    example = re.search(
        r"<!-- example:seed -->\n```python\n(.*?)```\n<!-- /example:seed -->", README, re.S
    )
    assert example is not None
    code = example.group(1)
    assert "from ray_triton_shm import TritonSHMClient" in code
    # Only the address differs: the test server listens on a free port, not 8001.
    code = code.replace('"localhost:8001"', repr(grpc_url))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Output shape: (100, 512)"
