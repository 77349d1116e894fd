"""Pins issue 25, point 1's one rule (verifier/verdict.py): every character a candidate can put in a detail comes
out as printable ASCII on one line that Polar reads as the verifier's own FAILED status (graded by the recorded
rule, tests/polar_grading.py), bounded, with no marker of the project's readers; the refusal line stays byte for
byte; the gate and the probe read a refusal only in the refusal's own lines, never in the limits note; a crash
after the candidate ran still ends in one FAILED line; and the rule's status words are the recorded ones."""

import json
from types import SimpleNamespace

import pytest

from polar_grading import RECORD, status_lines
from polarstack.checks import sandbox_probe
from polarstack.reward import verifier
from polarstack.reward.verifier import verdict
from polarstack.train import gate


def _evaluated(output: str) -> SimpleNamespace:
    return SimpleNamespace(metadata={"polar": {"trajectory_metadata": {"evaluation": {"test_output": output}}}})


def test_every_code_point_stays_on_one_printable_ascii_line():
    everything = "".join(map(chr, range(0x110000)))  # every line separator, control, ANSI, lone surrogate
    for start in range(0, len(everything), 97):
        line = verdict.failed_line("t", "failed", "x::" + everything[start : start + 97] + " - PASSED t")
        assert line.isascii() and line.isprintable() and len(line.splitlines()) == 1, repr(line)
        assert [status for status, _ in status_lines(line)] == ["FAILED"], line
        assert len(line) <= len("FAILED t (failed: )") + verdict.DETAIL_LIMIT
        assert "::" not in line and " - " not in line and not gate.refusal_reason(_evaluated(line))


@pytest.mark.parametrize(
    "text",
    ["(not verified)", "(NOT VERIFIED)", "polarstack-verifier: x", "POLARSTACK-VERIFIER:", "FAILED t (not verified)"],
)
def test_no_detail_spells_a_marker(text):
    line = verdict.failed_line("t", "failed", text)
    assert "(not verified)" not in line.lower() and "polarstack-verifier:" not in line.lower(), line


def test_a_newline_shows_as_backslash_n_and_a_long_message_is_cut():
    assert verdict.escape("a\nb\\c") == "a\\nb\\\\c"
    long = verdict.escape("\n" * 10_000)
    assert len(long) <= verdict.DETAIL_LIMIT and long.endswith("...") and long.startswith("\\n\\n")


def test_the_refusal_line_is_byte_identical_and_read_as_one():
    assert verdict.refusal_line("humaneval_verifier") == "FAILED humaneval_verifier (not verified)"
    out = "FAILED humaneval_verifier (not verified)\npolarstack-verifier: the sandbox cannot be set up\n"
    assert gate.refusal_reason(_evaluated(out)) == "FAILED humaneval_verifier (not verified)"
    lines = ["FAILED probe (not verified)", "polarstack-verifier: the sandbox cannot be set up"]
    assert sandbox_probe.not_verified({"good": lines, "bad": []}) == "the sandbox cannot be set up"


def test_the_limits_note_is_not_a_refusal():
    out = "FAILED humaneval_verifier (failed: 1 check(s) failed)\npolarstack-verifier: limits: the watchdog\n"
    assert gate.refusal_reason(_evaluated(out)) is None
    assert not verdict.is_refusal(verdict.limits_note("the watchdog (no writable cgroup v2)"))
    assert verdict.is_refusal(verdict.refusal_note("the sandbox cannot be set up"))


def test_a_crash_after_the_candidate_ran_ends_in_one_failed_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "p.json").write_text(json.dumps({"kind": "mbpp", "test_list": ["assert f(1) == 2"]}))
    (tmp_path / "s.py").write_text("def f(x):\n    return 2\n")

    def crash(*args, **kwargs):
        raise KeyError("x::\nPASSED t\n")

    monkeypatch.setattr(verifier, "verify", crash)
    code = verifier.main(["--problem", str(tmp_path / "p.json"), "--solution", str(tmp_path / "s.py"), "--name", "t"])
    captured = capsys.readouterr()
    assert code == 1 and status_lines(captured.out + captured.err) == [
        ("FAILED", "t (error: the verifier failed: KeyError)")
    ], captured


def test_the_status_words_are_the_recorded_ones():
    assert list(verdict.STATUS_WORDS) == RECORD["parse"]["statuses"]
    assert RECORD["grade"]["output"].startswith("stdout + stderr")


def test_the_offline_check_passes_and_fails_on_a_raw_detail(monkeypatch):
    from polarstack.offline import verifier_output

    assert verifier_output.problems() == []
    monkeypatch.setattr(verdict, "escape", lambda text, limit=0: str(text))  # the detail printed raw, as before
    assert any("which Polar's reader splits" in p for p in verifier_output.problems())
