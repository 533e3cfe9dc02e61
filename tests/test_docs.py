"""The README and the documentation as checked code.

Every fenced code block of ``README.md`` and ``docs/**/*.md`` runs, against the session's real
Triton (and, where a page uses Ray, a real local Ray started once for this module), unless an
HTML comment right above it says ``<!-- not-run: <reason> -->``. Blocks without a language, or
of ``text`` or ``mermaid``, are trees, diagrams and output samples: not code, no marker needed.

The runnable Python blocks of a page run in order, as one script in one process (a page reads
as one session: a later block may use what an earlier one made); ``"localhost:8001"`` becomes
the session server's address; a page whose Python is the same as an earlier page's runs once.
Runnable ``bash`` blocks run with ``.venv/bin`` first on the PATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import unicodedata
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]

#: Languages that are not code: trees, diagrams, output samples.
NOT_CODE = {"", "text", "mermaid"}
#: Languages a block may run in.
RUNNABLE = {"python", "bash"}
#: The address examples are written for, and what the tests put in its place.
EXAMPLE_URL = "localhost:8001"

_FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)[^\n]*$")
_NOT_RUN = re.compile(r"^\s*<!--\s*not-run:\s*(?P<reason>\S[^>]*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page."""

    page: Path
    line: int  #: 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None  #: the reason given by a ``not-run`` marker, if any

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUNNABLE and self.not_run is None


def blocks_of(page: Path) -> list[Block]:
    """Every fenced block of a Markdown page, in order (indented ones in lists included)."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        code = "\n".join(line[len(indent) :] for line in lines[i + 1 : end]) + "\n"
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _NOT_RUN.match(above)
        blocks.append(
            Block(page, i + 1, opening["lang"].lower(), code, marker["reason"] if marker else None)
        )
        i = end + 1
    return blocks


ALL_BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _uses_ray(code: str) -> bool:
    return (
        re.search(r"^\s*(import ray\b|from ray\b|from ray_triton_shm\.ray\b)", code, re.M)
        is not None
    )


# --- what the README promises ---------------------------------------------------------------


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make bench", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    assert "make docs" in ci


def test_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail into docs/"


def _slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading."""
    text = unicodedata.normalize("NFKD", heading.replace("`", "")).encode("ascii", "ignore")
    text = re.sub(r"[^\w\s-]", "", text.decode()).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_readme_links_lead_somewhere() -> None:
    """mkdocs checks the links of docs/ (make docs); the README's are checked here."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", README.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        page = ROOT / path
        if not page.exists():
            broken.append(target)
        elif anchor:
            headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(target)
    assert not broken, f"README.md links to nothing: {broken}"


# --- what the pages say ---------------------------------------------------------------------

#: Pages that carry GPU memory's preview label (``ray_triton_shm._slots._memory.CUDA_PREVIEW``).
PREVIEW_PAGES = [README, ROOT / "docs" / "index.md", ROOT / "docs" / "guide" / "gpu.md"]
#: Where files of the project live, besides the pages.
SOURCES = ["ray_triton_shm", "tests", "deployments", "Makefile", "pyproject.toml", "mkdocs.yml"]
_TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".pbtxt", ".json", ""}


def _prose(page: Path) -> str:
    """A page's text as it reads: Markdown's code and emphasis marks dropped, lines joined."""
    return " ".join(re.sub(r"[`*]", "", page.read_text()).split())


def test_no_page_or_file_points_outside_the_project() -> None:
    """A reader, or a user who installed the package, has nothing beside the project."""
    files = [*PAGES]
    for name in SOURCES:
        path = ROOT / name
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    outside = [
        _page_id(f)
        for f in files
        if f.suffix in _TEXT
        and f != Path(__file__).resolve()
        and "../shared" in f.read_text(errors="replace")
    ]
    assert not outside, f"these point at ../shared, outside the project: {outside}"


def test_gpu_memory_is_labelled_a_preview() -> None:
    """tests/test_gpu.py has not been recorded as passing on a GPU. Remove the label from these
    pages, this test, and CUDA_PREVIEW with the note `bench --memory cuda` prints, together, in
    the commit that records a run on a GPU in which every GPU test passed."""
    from ray_triton_shm._slots._memory import CUDA_PREVIEW

    unlabelled = [_page_id(page) for page in PREVIEW_PAGES if CUDA_PREVIEW not in _prose(page)]
    assert not unlabelled, f"say {CUDA_PREVIEW!r} on {unlabelled}"


# --- the policy -----------------------------------------------------------------------------


def test_every_block_runs_or_says_why_not() -> None:
    unmarked = [
        f"{b.where} ({b.lang})"
        for b in ALL_BLOCKS
        if b.lang not in NOT_CODE and b.lang not in RUNNABLE and b.not_run is None
    ]
    assert not unmarked, (
        "blocks in a language that cannot run need <!-- not-run: <reason> --> right above "
        f"them: {unmarked}"
    )
    stray = [b.where for b in ALL_BLOCKS if b.lang in NOT_CODE and b.not_run is not None]
    assert not stray, f"not-run markers on blocks that are not code: {stray}"
    assert sum(b.runs for b in ALL_BLOCKS) >= 10


def test_the_own_model_page_shows_the_example_files_as_they_are() -> None:
    page = ROOT / "docs" / "guide" / "own-model.md"
    shown = [b.code for b in blocks_of(page) if b.lang == "python" and b.not_run]
    example = ROOT / "docs" / "examples" / "iris"
    assert shown[0] == (example / "models" / "iris" / "1" / "model.py").read_text()
    app = (example / "app.py").read_text()
    assert shown[1] == app[app.index("import numpy") :]
    assert _served_repository(page) == example / "models"


def test_the_seed_example_is_the_original_with_its_markers() -> None:
    page = (ROOT / "docs" / "guide" / "client.md").read_text()
    seed = re.search(
        r"<!-- example:seed -->\n```python\n(.*?)```\n<!-- /example:seed -->", page, re.S
    )
    assert seed is not None
    assert "from ray_triton_shm import TritonSHMClient" in seed.group(1)
    assert 'print("Output shape:", results["OUTPUT0"].shape)' in seed.group(1)


# --- running them ---------------------------------------------------------------------------

_RUNNER = r"""
import json, sys, traceback
page, blocks = sys.argv[1], json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for line, code in blocks:
    print(f"--- block {page}:{line}", flush=True)
    try:
        exec(compile(code, f"{page}:{line}", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        sys.exit(f"the block at {page}:{line} failed")
"""


def _env(url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["RAY_TRITON_SHM_URL"] = url
    env.update(extra or {})
    return env


def _run_python(page: Path, blocks: list[Block], url: str, env: dict[str, str]) -> str:
    payload = json.dumps([[b.line, b.code.replace(f'"{EXAMPLE_URL}"', repr(url))] for b in blocks])
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER, _page_id(page)],
        input=payload,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def ray_address(ray_local: str) -> Iterator[str]:
    """The module's local Ray (its processes see the session's Triton), with Serve on a free
    port, for the pages' Ray examples to join as drivers of their own."""
    import ray
    from _helpers import free_ports

    with warnings.catch_warnings():  # Serve's own pydantic deprecations, not ours
        warnings.simplefilter("ignore", DeprecationWarning)
        from ray import serve

    (port,) = free_ports(1)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        serve.shutdown()


def _python_pages() -> list[Path]:
    """The pages with Python to run; a page whose runnable Python is the very same as an
    earlier page's (getting started repeats the README's quick start) runs once, there."""
    pages: list[Path] = []
    seen: set[tuple[str, ...]] = set()
    for page in PAGES:
        script = tuple(b.code for b in blocks_of(page) if b.runs and b.lang == "python")
        if script and script not in seen:
            seen.add(script)
            pages.append(page)
    return pages


PYTHON_PAGES = _python_pages()


#: A page that serves a model repository of its own says so in a ``serve-local`` block.
_SERVES = re.compile(r"ray-triton-shm serve-local --model-repository (\S+)")


def _served_repository(page: Path) -> Path | None:
    """The model repository a page's ``serve-local`` block serves, if it names one."""
    for block in blocks_of(page):
        served = _SERVES.search(block.code)
        if served:
            return ROOT / served.group(1)
    return None


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_page_id)
@pytest.mark.usefixtures("ray_local")  # the shared Ray, which the Ray pages join as drivers
def test_python_examples_run(
    page: Path, grpc_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    blocks = [b for b in blocks_of(page) if b.runs and b.lang == "python"]
    extra = {}
    if any(_uses_ray(b.code) for b in blocks):
        extra["RAY_ADDRESS"] = request.getfixturevalue("ray_address")
    with contextlib.ExitStack() as stack:
        repository = _served_repository(page)
        if repository is not None:
            # As a reader would: the page's set-up (its bash blocks), then its own Triton.
            for block in blocks_of(page):
                if block.runs and block.lang == "bash":
                    _run_bash(block, grpc_url)
            from _helpers import local_triton

            server = stack.enter_context(
                local_triton(repository, log_path=tmp_path / "tritonserver.log")
            )
            grpc_url = server.grpc_url
        try:
            out = _run_python(page, blocks, grpc_url, _env(grpc_url, extra))
        finally:
            if extra:
                _delete_serve_apps()
    if page == ROOT / "docs" / "guide" / "client.md":
        assert "Output shape: (100, 512)" in out  # the seed, unchanged but for the address


def _delete_serve_apps() -> None:
    """Deletes the Serve apps a page made: the next page's replicas get the CPUs (once their
    graceful ends, seconds each, are over: nobody waits on them here)."""
    from ray import serve

    for name in serve.status().applications:
        serve.delete(name, _blocking=False)


BASH_BLOCKS = [b for b in ALL_BLOCKS if b.runs and b.lang == "bash"]


@pytest.mark.parametrize("block", BASH_BLOCKS, ids=lambda b: b.where)
def test_bash_examples_run(block: Block, grpc_url: str) -> None:
    _run_bash(block, grpc_url)


def _run_bash(block: Block, grpc_url: str) -> None:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code.replace(EXAMPLE_URL, grpc_url)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=_env(grpc_url),
        check=False,
    )
    assert done.returncode == 0, f"{block.where}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
