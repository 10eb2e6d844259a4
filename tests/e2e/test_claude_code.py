"""Claude Code, the real CLI from npm, pointed at the gateway with a Switchyard key (issue 16):
a coding agent with Anthropic's protocol built in works through Switchyard unchanged, and its
requests are reserved, reconciled and recorded under the key's tenant like any other."""

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.stack import ROOT, wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-sy-test-acme-web-0001"
PACKAGE = "@anthropic-ai/claude-code"
# Installed once per checkout (var/ is not committed); a second run reuses it.
CACHE = ROOT / "var" / "claude-code"
# The simulator's prose vocabulary (simulator/model/tokenizer.py): its answers are made of it,
# lower case, but for the "So" an answer starts with when its first piece is punctuation.
SIMULATOR_WORDS = re.compile(r"^(?:[a-z]+|So)$")


def _runs(command: list[str]) -> bool:
    try:
        result = subprocess.run(command, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


@pytest.fixture(scope="module")
def claude() -> list[str]:
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    binary = CACHE / "node_modules" / ".bin" / "claude"
    if not _runs([str(binary), "--version"]):
        reachable = _runs([npm, "view", PACKAGE, "version"])
        if not reachable:
            pytest.skip("npm cannot reach the registry to install Claude Code")
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", PACKAGE],
            check=True,
            capture_output=True,
            timeout=600,
        )
    if _runs([str(binary), "--version"]):
        return [str(binary)]
    # The package's postinstall did not put the native binary in place: its own fallback.
    wrapper = CACHE / "node_modules" / PACKAGE / "cli-wrapper.cjs"
    return [shutil.which("node") or "node", str(wrapper)]


def claude_env(stack, home: Path) -> dict[str, str]:
    """Only what Claude Code needs: no credential or setting of the machine it runs on."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "TERM": "dumb",
        "ANTHROPIC_BASE_URL": stack.base_url,
        "ANTHROPIC_API_KEY": KEY,
        # A model id Claude Code knows, which the catalogue has as an alias of acme/chat-large
        # (its default, claude-opus-4-8, is no alias of the reference config's).
        "ANTHROPIC_MODEL": "claude-sonnet-4-5",
        "ANTHROPIC_SMALL_FAST_MODEL": "acme/chat-small",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "acme/chat-small",
        # It asks for 32,000 output tokens by default; the catalogue's endpoints make at most
        # 4,096 to 8,192, and a request asking more than an endpoint can make is not sent there.
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
        "CI": "true",
    }


# Which of its tools Claude Code offers. The simulator calls an offered tool at random, with
# arguments made up from the schema: only tools that read the (empty) working folder are
# offered, none that writes, runs commands or reaches the network. "" offers none.
TOOLSETS = {"no tools": ("", 1), "read-only tools": ("Read,Glob,Grep", 4)}


@pytest.mark.parametrize("toolset", TOOLSETS)
def test_claude_code_answers_through_the_gateway_and_is_recorded(stack, claude, tmp_path, toolset):
    tools, turns = TOOLSETS[toolset]
    [(tenant_id,)] = stack.sql("select id from tenants_tenant where name = 'acme'")
    [(started,)] = stack.sql("select now()")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    result = subprocess.run(
        [
            *claude,
            "-p",
            "Reply with a short greeting.",
            "--max-turns",
            str(turns),
            "--tools",
            tools,
        ],
        cwd=work,
        env=claude_env(stack, home),
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    explain = f"stdout: {result.stdout}\nstderr: {result.stderr}"
    assert result.returncode == 0, explain
    words = re.findall(r"[A-Za-z]+", result.stdout)
    assert words, explain
    assert all(SIMULATOR_WORDS.match(word) for word in words), explain

    def rows():
        return stack.sql(
            "select g.model, g.status, g.input_tokens, g.output_tokens, r.outcome,"
            " r.estimated_input_tokens, r.estimated_output_tokens,"
            " r.actual_input_tokens, r.actual_output_tokens"
            " from gateway_generation g join quotas_reservation r on r.request_id = g.id"
            " where g.tenant_id = %s and g.created_at >= %s and g.detail->>'door' = 'messages'",
            tenant_id,
            started,
        )

    wait_until(lambda: bool(rows()), timeout=15, what="Claude Code's ledger rows")
    time.sleep(1)  # its requests end together; the last rows follow in the same flush
    recorded = rows()
    answered = [row for row in recorded if row[1] == 200]
    assert answered, recorded
    assert "acme/chat-large" in {row[0] for row in answered}, "the alias served as its model"
    for _, _, input_tokens, output_tokens, outcome, est_in, est_out, act_in, act_out in answered:
        assert outcome == "reconciled"
        assert est_in > 0 and est_out > 0, "reserved before it was sent"
        assert (act_in, act_out) == (input_tokens, output_tokens), "reconciled to the usage"
        assert input_tokens > 0 and output_tokens > 0
