"""The agent harness preset's view of the agent CLI (issue 18 point 3): version check, settings, the sandbox's CLI.

configs/upstream/polar-harness-presets.json (read by a person): Polar's codex preset runs `codex --version` in
setup() and raises RuntimeError unless it equals settings.get("version", DEFAULT_CODEX_VERSION) (an empty version
skips it); the claude_code preset this stack uses checks no version (read in three forks; upstream's file is not in
the code index) and hands agent.env to the CLI. So:
- `settings_for(harness)`: agent.settings the task template needs so the preset agrees with AGENT_CLI_VERSION
  ({"version": AGENT_CLI_VERSION} for a preset that checks, {} for claude_code);
- `version_problem(output)`: the in-trainer sandbox probe compares the CLI's `--version` in the sandbox (the pinned
  CLI prints "<version> (Claude Code)", measured: its first field) with AGENT_CLI_VERSION and refuses a mismatch either way;
- `problems(agent)`: `make verify-offline`'s check of the rendered agent spec against the record;
- `turn_cap_settings(harness, cap)` / `turn_cap_problems(agent, cap)` (issue 26 point 4): the per-session turn cap as
  the preset's own setting: claude_code's run_steps turns agent.settings.max_turns into the CLI's `--max-turns`, which
  the pinned CLI documents as "Stop after this many turns (only works with --print)" (the record's
  `max_turns_in_cli`, found in the binary); the preset runs it with -p.
"""

from __future__ import annotations

import json
import re
from typing import Any

from polarstack.pins import pins, repo_root

RECORD = "configs/upstream/polar-harness-presets.json"
_VERSION = re.compile(r"\b(\d+\.\d+\.\d+(?:[-+.][0-9A-Za-z.]+)?)\b")


def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text(encoding="utf-8"))


def pinned_version() -> str:
    return pins()["AGENT_CLI_VERSION"]


def settings_for(harness: str, facts: dict[str, Any] | None = None) -> dict[str, str]:
    preset = (facts or record())["presets"].get(harness) or {}
    if preset.get("checks_cli_version"):
        return {preset.get("version_setting", "version"): pinned_version()}
    return {}


def cli_version(output: str) -> str | None:
    """The version `<cli> --version` printed (its first dotted version), or None."""
    found = _VERSION.search(output or "")
    return found.group(1) if found else None


def version_problem(output: str, pinned: str | None = None) -> str | None:
    """One sentence when the sandbox's agent CLI is not AGENT_CLI_VERSION; None when it is."""
    pinned = pinned or pinned_version()
    found = cli_version(output)
    if found == pinned:
        return None
    shown = f"reports {found}" if found else f"printed no version ({(output or 'nothing').strip()[:120]})"
    return (
        f"the agent CLI in the sandbox {shown}, not AGENT_CLI_VERSION={pinned} (configs/pins.env), so the agent "
        "would not be the CLI whose prompt and token budget configs/upstream/harness-prompt.json measured; rebuild "
        "the sandbox and the agent-CLI dir with `make sif`, then `make up`"
    )


def problems(agent: dict[str, Any], facts: dict[str, Any] | None = None) -> list[str]:
    """The rendered agent spec against the recorded preset facts."""
    facts = facts or record()
    harness = agent.get("harness")
    preset = facts["presets"].get(harness)
    if preset is None:
        return [
            f"{RECORD} records nothing about Polar's {harness!r} preset; read it and record whether it checks a version"
        ]
    out = []
    if facts.get("polar_commit") != pins().get("POLAR_COMMIT"):
        out.append(f"{RECORD} was read for another POLAR_COMMIT; read the presets again")
    settings = agent.get("settings") or {}
    if preset.get("checks_cli_version"):
        key = preset.get("version_setting", "version")
        if settings.get(key) not in (pinned_version(), ""):
            out.append(
                f"Polar's {harness} preset checks the CLI version against agent.settings.{key} "
                f"({settings.get(key)!r}), not AGENT_CLI_VERSION={pinned_version()}: every session's setup() fails"
            )
    if (agent.get("env") or {}) and not preset.get("passes_agent_env_to_cli", False):
        out.append(f"Polar's {harness} preset is not recorded to pass agent.env to the CLI, so the env has no effect")
    return out


def turn_cap_settings(harness: str, cap: int, facts: dict[str, Any] | None = None) -> dict[str, int]:
    """agent.settings that cap a session at `cap` turns, when the preset maps a setting to the CLI's max turns."""
    preset = (facts or record())["presets"].get(harness) or {}
    return {"max_turns": cap} if (preset.get("settings_flags") or {}).get("max_turns") and cap > 0 else {}


def turn_cap_problems(agent: dict[str, Any], cap: int, facts: dict[str, Any] | None = None) -> list[str]:
    """The rendered agent spec caps each session at `cap` turns through a setting the preset and the CLI honour."""
    facts = facts or record()
    harness = agent.get("harness")
    preset = facts["presets"].get(harness) or {}
    out = []
    flag = (preset.get("settings_flags") or {}).get("max_turns")
    if not flag:
        return [f"{RECORD} records no setting of Polar's {harness!r} preset that caps a session's turns"]
    cli = preset.get("max_turns_in_cli") or {}
    if flag not in str(cli.get("text", "")) or cli.get("cli_version") != pinned_version():
        out.append(
            f"{RECORD} does not show the agent CLI {pinned_version()} taking {flag} (max_turns_in_cli); find it in "
            "the pinned CLI again"
        )
    got = (agent.get("settings") or {}).get("max_turns")
    if got != cap:
        out.append(
            f"the task template caps a session at max_turns={got!r}, not {cap} turns, the most whose last request "
            "fits the engine context (polarstack.checks.budget.turn_cap)"
        )
    return out


__all__ = [
    "turn_cap_problems",
    "turn_cap_settings",
    "RECORD",
    "cli_version",
    "pinned_version",
    "problems",
    "record",
    "settings_for",
    "version_problem",
]
