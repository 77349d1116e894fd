"""`make verify-offline`: what configs/upstream/real-sglang-cpu.json records, acted on by the stack.

The record is read from the pinned wheel by scripts/tools/record_real_sglang.py. Each check argues one use:
the launch polarstack.stack.real_sglang renders is the recorded one and every flag of it is an option of the pinned
sglang (polarstack.offline.flags reads its ServerArgs); torch_native is an attention backend there; the servers run with
the CPU switch and a /health without generation; the emulator refuses over-long requests with sglang's own
sentences (polarstack.engine.emulator.tokenizer_manager).
"""

from __future__ import annotations

import json
import re

from polarstack.engine.emulator.tokenizer_manager import length_problem
from polarstack.offline import flags
from polarstack.pins import pin, repo_root
from polarstack.stack import real_sglang

RECORD = "configs/upstream/real-sglang-cpu.json"


def _fill(template: str, values: dict[str, int]) -> str:
    return re.sub(r"\{([a-z_.]+)\}", lambda m: str(values[m.group(1)]), template)


def problems() -> list[str]:
    record = json.loads((repo_root() / RECORD).read_text(encoding="utf-8"))
    facts, found = record["facts"], []
    if record["sglang_version"] != pin("SGLANG_VERSION"):
        found.append(
            f"{RECORD} was read from sglang {record['sglang_version']}, not SGLANG_VERSION={pin('SGLANG_VERSION')}; "
            "rerun scripts/tools/record_real_sglang.py"
        )
    rendered = real_sglang.launch_args("MODEL", 0, served_model_name="NAME", tool_call_parser="PARSER")
    if rendered != record["launch_args"]:
        found.append(f"polarstack.stack.real_sglang renders {rendered}, but {RECORD} records {record['launch_args']}")
    table = flags.sglang_table()
    for problem in flags.check_tokens(rendered, table, command="real engine (CPU)", program=flags.sglang_program()):
        found.append(problem.sentence())
    backend = rendered[rendered.index("--attention-backend") + 1]
    if backend not in facts["attention_backend_choices"]["choices"]:
        found.append(f"--attention-backend {backend} is not a choice of the pinned sglang")
    env = real_sglang.server_env()
    if env.get(facts["cpu_switch"]["env"]) != "1":
        found.append(f"the real servers run without {facts['cpu_switch']['env']}=1, so sglang looks for a GPU")
    if env.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION") != "0":
        found.append("the real servers' /health generates (>= 1 s), longer than the stack's 1-s readiness polls")
    for flag in ("--sleep-on-idle", "--max-total-tokens", "--enable-custom-logit-processor"):
        if flag not in rendered:
            found.append(f"the real servers run without {flag} ({RECORD})")
    if real_sglang.GRPC_PORT_OFFSET != facts["grpc_port"]["offset"]:
        found.append(
            f"the pinned sglang derives its gRPC port as --port + {facts['grpc_port']['offset']}, but "
            f"polarstack.stack.real_sglang keeps ports below 65535 - {real_sglang.GRPC_PORT_OFFSET}"
        )
    errors = facts["length_errors"]
    prompt, context = 10, 32768
    for key, max_new in (("input_too_long", None), ("total_tokens", context)):
        length = context + 1 if key == "input_too_long" else prompt
        values = {"input_token_num": length, "self.context_len": context}
        if max_new is not None:
            values.update(max_new_tokens=max_new, total_tokens=length + max_new)
        if length_problem(length, max_new, context) != _fill(errors[key], values):
            found.append(f"the emulator's {key} refusal is not sglang's sentence ({errors['file']})")
    return found
