"""verify-offline (issue 32 point 4): every knob of the code verifier reaches what Polar's test_command sees.

The verifier reads POLARSTACK_VERIFIER_ISOLATION, POLARSTACK_VERIFIER_CGROUP and POLARSTACK_VERIFIER_PYTHON from its
environment (polarstack.stack.verifier_knobs). Polar runs it as the task's test_command inside the SIF, with the task
template's runtime.env passed as `env K=V` (configs/upstream/polar-apptainer.json, direct mode), so the values the stack
chose (configs/stack.env and the environment) must be in that runtime.env, and the same in every other place the
verifier's environment comes from: the trainer (compose.yaml), launch.sh (Polar's servers) and the Ray job's
runtime_env (the in-job gate names an opt-out). POLARSTACK_VERIFIER_PYTHON names a host path and must be in none.
"""

from __future__ import annotations

from typing import Any

from polarstack.stack import verifier_knobs


def problems(
    template: dict[str, Any], trainer_env: dict[str, Any], launch_env: dict[str, str], job_env: dict[str, Any]
) -> list[str]:
    expected = verifier_knobs.verifier_env()
    runtime_env = (template.get("runtime") or {}).get("env") or {}
    test_command = str(((template.get("evaluator") or {}).get("config") or {}).get("test_command") or "")
    out = []
    places = {
        "the task template's runtime.env (Polar's test_command)": runtime_env,
        "the trainer's environment (compose.yaml)": trainer_env,
        "launch.sh": launch_env,
        "the Ray job's runtime env": job_env,
    }
    for where, env in places.items():
        for key in verifier_knobs.PASSED_ON:
            want = expected.get(key, "")
            have = "" if env.get(key) is None else str(env.get(key))
            if have != want:
                out.append(
                    f"{where} has {key}={have!r}, the stack chose {want!r} (configs/stack.env or the environment)"
                )
        if verifier_knobs.PYTHON in env:
            out.append(f"{where} passes {verifier_knobs.PYTHON}, a path of another machine than the SIF")
    if "--isolation" in test_command:
        out.append(
            "the test_command passes --isolation, which overrides the runtime.env's POLARSTACK_VERIFIER_ISOLATION"
        )
    if "verifier.py" not in test_command:
        out.append("the test_command does not run the task's verifier.py")
    return out


__all__ = ["problems"]
