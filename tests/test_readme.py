"""README.md is for a newcomer with only this repository: every file it names is here, and it
points at nothing outside it (issue 14)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
TRACKED = subprocess.run(
    ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
).stdout.split()
FOLDERS = {path.split("/")[0] for path in TRACKED if "/" in path}


def named_paths() -> list[str]:
    """Code spans whose first part is one of the repository's folders (`gateway/pipeline.py`)."""
    spans = re.findall(r"`([^`\s]+)`", README)
    return [span for span in spans if span.split("/")[0] in FOLDERS and "/" in span]


def test_every_path_it_names_is_in_the_repository():
    paths = named_paths()
    assert len(paths) > 20  # the layout table and the sections name many
    missing = [path for path in paths if not (ROOT / path.split(":")[0]).exists()]
    assert missing == []


def test_it_links_to_nothing_outside_the_repository():
    assert "../" not in README
    urls = re.findall(r"https?://[^\s`)>\]]+", README)
    outside = [url for url in urls if not re.match(r"https?://(127\.0\.0\.1|[\w.-]*example)", url)]
    assert outside == []
