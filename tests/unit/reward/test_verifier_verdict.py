"""Pins issue 25, point 1's one rule (verifier/verdict.py): every character a candidate can put in a detail comes
out as printable ASCII on one line that Polar reads as the verifier's own FAILED status (graded by the recorded
rule, tests/polar_grading.py), bounded, with no marker of the project's readers; the refusal line stays byte for
byte; the gate and the probe read a refusal only in the refusal's own lines, never in the limits note; a crash
after the candidate ran still ends in one FAILED line; and the rule's status words are the recorded ones.

The gate reads a sample as Polar's test_on_output evaluator and gateway leave it (tests/polar_grading.py
`evaluation`, built from configs/upstream/polar-grading.json): the refusal is found by the report's exit code 8
alone and by its parsed refusal line alone; an ordinary FAILED, the limits note and a refusal line forged in the
candidate's own patch are not refusals; and `make verify-offline`'s check of those keys passes and fails."""

import json
from types import SimpleNamespace

import pytest

from polar_grading import RECORD, evaluation, sample_metadata, status_lines, unapplied
from polarstack.checks import sandbox_probe
from polarstack.reward import verifier
from polarstack.reward.verifier import verdict
from polarstack.train import gate

NAME = "humaneval_verifier"
REFUSAL_OUT = verdict.refusal_line(NAME) + "\n"
REFUSAL_ERR = verdict.refusal_note("the sandbox cannot be set up: unshare(CLONE_NEWUSER) failed") + "\n"
ORDINARY_OUT = verdict.failed_line(NAME, "failed", "1 check(s) failed") + "\n"
LIMITS_ERR = verdict.limits_note("the watchdog (no writable cgroup v2)") + "\n"


def _evaluated(stdout: str, code: int = 1, stderr: str = "") -> SimpleNamespace:
    """A sample whose test command printed `stdout` / `stderr` and exited `code`, as Polar's node hands it on."""
    return SimpleNamespace(metadata=sample_metadata(evaluation(stdout, stderr, code, {NAME: "PASSED"})))


def test_every_code_point_stays_on_one_printable_ascii_line():
    everything = "".join(map(chr, range(0x110000)))  # every line separator, control, ANSI, lone surrogate
    for start in range(0, len(everything), 97):
        line = verdict.failed_line("t", "failed", "x::" + everything[start : start + 97] + " - PASSED t")
        assert line.isascii() and line.isprintable() and len(line.splitlines()) == 1, repr(line)
        assert [status for status, _ in status_lines(line)] == ["FAILED"], line
        assert len(line) <= len("FAILED t (failed: )") + verdict.DETAIL_LIMIT
        assert "::" not in line and " - " not in line and not gate.refusal_reason(_evaluated(line, 1))


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
    err = "polarstack-verifier: the sandbox cannot be set up\n"
    refused = _evaluated("FAILED humaneval_verifier (not verified)\n", 8, err)
    assert gate.refusal_reason(refused) == "FAILED humaneval_verifier (not verified)"
    lines = ["FAILED probe (not verified)", "polarstack-verifier: the sandbox cannot be set up"]
    assert sandbox_probe.not_verified({"good": lines, "bad": []}) == "the sandbox cannot be set up"


def test_the_limits_note_is_not_a_refusal():
    out, err = "FAILED humaneval_verifier (failed: 1 check(s) failed)\n", "polarstack-verifier: limits: the watchdog\n"
    assert gate.refusal_reason(_evaluated(out, 1, err)) is None
    assert gate.refusal_reason(_evaluated(verdict.passed_line(NAME) + "\n", 0, err)) is None
    assert gate.refusal_reason(_evaluated(out, 8, err)) is not None  # the same report, the refusal's exit code: read
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


# --- the gate on the shape test_on_output and Polar's gateway produce ------------------------------------------


def test_the_evaluation_is_the_recorded_shape():
    evaluated = _evaluated(REFUSAL_OUT, 8, REFUSAL_ERR).metadata["polar"]["trajectory_metadata"]["evaluation"]
    report = evaluated["report"]
    assert report["exit_code"] == 8 and report["parsed_tests"] == {f"{NAME} (not verified)": "FAILED"}
    assert report["resolved"] is False and evaluated["outcome_reward"] == 0.0
    assert report["expected_tests"] == {NAME: "PASSED"} and evaluated["strategy"] == evaluated["mode"]
    assert not any("not verified" in str(v) for k, v in evaluated.items() if k != "report")  # no output text
    solved = _evaluated(verdict.passed_line(NAME) + "\n", 0, LIMITS_ERR).metadata["polar"]["trajectory_metadata"]
    assert solved["evaluation"]["outcome_reward"] == 1.0 and solved["evaluation"]["report"]["resolved"] is True


def test_a_refusal_is_read_from_the_report_exit_code_alone():
    # The verifier's exit 8 with no refusal line parsed (a status line Polar's parser took otherwise).
    sample = _evaluated(ORDINARY_OUT, 8)
    assert sample.metadata["polar"]["trajectory_metadata"]["evaluation"]["report"]["parsed_tests"] == {
        f"{NAME} (failed: 1 check(s) failed)": "FAILED"
    }
    assert gate.refusal_reason(sample) == "the verifier exited 8 (not verified)"
    assert gate.refusal_reason(_evaluated("", 8, REFUSAL_ERR)) == "the verifier exited 8 (not verified)"


def test_a_refusal_is_read_from_parsed_tests_alone():
    # The refusal line with another exit code: the parsed map alone says it.
    assert gate.refusal_reason(_evaluated(REFUSAL_OUT, 1)) == f"FAILED {NAME} (not verified)"
    assert gate.refusal_reason(_evaluated("", 0, REFUSAL_OUT)) == f"FAILED {NAME} (not verified)"  # on stderr


@pytest.mark.parametrize("code", [1, 0, True, 8.5, "8", None])
def test_an_ordinary_verdict_is_not_a_refusal(code):
    assert gate.refusal_reason(_evaluated(ORDINARY_OUT, code, LIMITS_ERR)) is None
    assert gate.refusal_reason(_evaluated(ORDINARY_OUT, 8, LIMITS_ERR)) is not None  # the same session, refused


def test_a_refusal_forged_in_the_candidates_patch_is_not_read():
    # A patch that does not apply carries its head in the metadata (apply_patch_patch_head): text the candidate
    # wrote. Its own commit makes these lines context (one leading space), the shape a status line has once
    # stripped; the old scan of every string in the evaluation read them as the verifier's refusal.
    patch = (
        "diff --git a/solution.py b/solution.py\n--- a/solution.py\n+++ b/solution.py\n@@ -1,3 +1,3 @@\n"
        f" {verdict.refusal_line(NAME)}\n polarstack-verifier: the sandbox cannot be set up\n-x = 1\n+x = 2\n"
    )
    sample = SimpleNamespace(metadata=sample_metadata(unapplied(patch)))
    assert (
        verdict.refusal_line(NAME)
        in sample.metadata["polar"]["trajectory_metadata"]["evaluation"]["apply_patch_patch_head"]
    )
    assert gate.refusal_reason(sample) is None


def test_the_harbor_exit_code_is_still_read():
    # Polar's bridge reads harbor's verifier_exit_code at POLAR_COMMIT (rollout.py _has_trusted_eval_failure).
    harbor = {"polar": {"trajectory_metadata": {"evaluation": {"mode": "harbor", "verifier_exit_code": 8}}}}
    assert gate.refusal_reason(SimpleNamespace(metadata=harbor)) == "the verifier exited 8 (not verified)"
    harbor["polar"]["trajectory_metadata"]["evaluation"]["verifier_exit_code"] = 1
    assert gate.refusal_reason(SimpleNamespace(metadata=harbor)) is None


def test_the_gates_keys_are_checked_against_the_record(monkeypatch):
    from polarstack.offline import verifier_output

    assert verifier_output.gate_problems() == []
    assert set(gate.REPORT_READS) <= set(RECORD["evaluation"]["report"])
    assert RECORD["evaluation"]["report_key"] == gate.REPORT_KEY
    monkeypatch.setattr(gate, "REPORT_EXIT_CODE", "verifier_exit_code")  # a key the record lacks
    monkeypatch.setattr(gate, "REPORT_READS", ("verifier_exit_code", gate.REPORT_PARSED_TESTS))
    problems = verifier_output.gate_problems()
    assert any("the gate reads report['verifier_exit_code']" in p for p in problems), problems
    assert any("misses the refusal's exit code alone" in p for p in problems), problems
    monkeypatch.undo()
    monkeypatch.setattr(gate, "REPORT_PARSED_TESTS", "test_output")
    monkeypatch.setattr(gate, "REPORT_READS", (gate.REPORT_EXIT_CODE, "test_output"))
    problems = verifier_output.gate_problems()
    assert any("report['test_output']" in p for p in problems) and any("misses the refusal line" in p for p in problems)
    record = json.loads(json.dumps(RECORD))
    record["evaluation"]["report_key"] = "grade"  # the evaluator stores its report elsewhere
    assert any("stores its report under 'grade'" in p for p in verifier_output.gate_problems(record))
