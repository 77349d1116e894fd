"""How every report looks to a person: one `render_<report>` per report (rich tables), plus the JSON printer.

The commands in cli*.py compute a report and hand it here (or to `print_json` under --json).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from polarstack.bench import matrix
from polarstack.bench.compare import spread


def progress_bar():
    """The bar of long commands (`routers matrix`, `tasks verify`): description, bar, n/total, elapsed, on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False, width=200 if not sys.stdout.isatty() else None)


def render_smoke(report) -> None:
    from rich.table import Table

    out = console()
    res = report.resolution
    out.print(f"smoke: route={res.route} base={res.base_url} model={report.model}")
    if res.note:
        out.print(f"  path: {res.note}")
    table = Table("#", "kind", "turn", "url", "HTTP", "ms", "prompt ids", "response ids", "trainable", "problems")
    for index, entry in enumerate(report.exchanges, 1):
        verdict = entry.get("verdict", {})
        found = verdict.get("problems", [])
        problems = f"{len(found)}: {found[0]['message'][:90]}" if found else ""
        table.add_row(
            str(index),
            entry["kind"],
            str(entry["turn"]),
            entry["url"],
            str(entry["status"]),
            f"{entry['elapsed_ms']:.1f}",
            str(verdict.get("prompt_tokens", "-")),
            str(verdict.get("response_tokens", "-")),
            str(entry.get("polar", {}).get("polar_trainable_tokens", "-")),
            problems or "-",
        )
    if report.exchanges:
        out.print(table)
    for row in report.per_engine or []:  # NODES>1: every engine of every node (checks.per_engine)
        outcome = "pass" if row["verdict"] == "pass" else f"FAIL ({row['code']}): {row['message'][:120]}"
        out.print(
            f"  node {row['rank']} ({row['addr']}) engine {row['url']}: {row['trainable_tokens']} trainable tokens, "
            f"{outcome}"
        )
    for node in report.per_node or []:
        out.print(
            f"  node {node['rank']} ({node['addr']}): {node['trainable_tokens']} trainable tokens from "
            f"{node['engines']} engine(s)" + (f", failing: {', '.join(node['failed'])}" if node["failed"] else "")
        )
    for warning in report.warnings:
        out.print(f"  warning: {warning}")
    verdict = "PASS" if report.ok else f"FAIL ({report.code.name}, exit {int(report.code)})"
    out.print(
        f"verdict: {verdict}; Polar's verdict {report.polar_verdict or '-'}; trainable tokens "
        f"{report.trainable_tokens}; {report.elapsed:.3f} s"
    )


def render_docker_smoke(report: dict[str, Any], profile_name: str) -> None:
    """A short human report of the trainer's smoke JSON (`--json` prints it whole)."""
    verdict = "PASS" if report["verdict"] == "pass" else f"FAIL ({report.get('code')}, exit {report.get('exit_code')})"
    print(
        f"smoke inside the trainer of {profile_name}: route={report.get('route')} base={report.get('base_url')} "
        f"model={report.get('model')}"
    )
    for entry in report.get("requests") or []:
        polar = entry.get("polar", {}).get("polar_trainable_tokens", "-")
        installed = entry.get("installed_polar", {}).get("trainable_tokens", "-")
        print(
            f"  {entry.get('kind')} turn {entry.get('turn')} {entry.get('url')} HTTP {entry.get('status')}: "
            f"trainable {polar}, installed Polar {installed}"
        )
    for warning in report.get("warnings") or []:
        print(f"  warning: {warning}")
    print(
        f"verdict: {verdict}; Polar's verdict {report.get('polar_verdict') or '-'}; installed Polar "
        f"{report.get('installed_polar')}; trainable tokens {report.get('trainable_tokens')}"
    )
    sys.stdout.flush()


def render_probe(report) -> None:
    from rich.table import Table

    table = Table("path", "url", "HTTP", "bytes", "choices[0] keys", "trainable")
    for label, side in (("direct", report.direct), ("via", report.via)):
        if side:
            table.add_row(
                label,
                side["url"],
                str(side["status"]),
                str(side["bytes"]),
                ", ".join(side["choice_keys"]),
                str(side["trainable_tokens"]),
            )
    out = console()
    out.print(table)
    out.print(f"diagnosis: {report.diagnosis}" + (f" ({report.evidence})" if report.evidence else ""))


def render_status(state) -> None:
    """`polarstack status` of a recorded local stack (local.LocalState)."""
    live = state.live()
    for proc in state.processes:
        alive = "running" if proc in live else "gone"
        print(f"{proc['role']:10} pid {proc['pid']:>7} {proc['url']} {alive}")
    print(f"profile {state.profile}: base URL {state.data.get('base_url')}")


def render_demo(rows: list[dict[str, Any]], elapsed: float, engine: str = "emulator") -> None:
    from rich.table import Table

    title = "engines: the emulator (CPU stand-in)" if engine == "emulator" else f"engines: real {engine} on the CPU"
    table = Table(
        "profile", "router release", "expected", "verdict", "trainable tokens", "smoke s", "as expected", title=title
    )
    for row in rows:
        table.add_row(
            row["profile"],
            row["router"],
            row["expected"],
            row["verdict"],
            str(row["trainable_tokens"]),
            "-" if row.get("smoke_seconds") is None else f"{row['smoke_seconds']:.3f}",
            "yes" if row["as_expected"] else "NO",
        )
    out = console()
    out.print(table)
    rehearsed = [row for row in rows if row.get("rehearsal")]
    if rehearsed:  # make preflight's report, the classes this machine can measure (the rest: the node's)
        classes = [v["class"] for v in rehearsed[0]["rehearsal"]]
        part = Table("rehearsal class (make preflight)", *[row["profile"] for row in rehearsed])
        for index, name in enumerate(classes):
            part.add_row(name, *[_rehearsal_cell(r["rehearsal"][index]) for r in rehearsed])
        out.print(part)
    out.print(f"demo finished in {elapsed:.1f} s")


def render_docker_demo_note(result: dict[str, Any]) -> None:
    """`make demo RUNTIME=docker`'s closing note: cold or warm, its time, the data root's disk use, peak memory."""
    kind = "cold (bases or images built)" if result.get("cold") else "warm (bases and images cached)"
    disk = result.get("data_root_bytes")
    disk_text = f"{disk / 1e9:.1f} GB" if disk else "not measured (not the private engine of `make dockerd`)"
    console().print(
        f"docker demo, {kind}: {result['elapsed_seconds']:.0f} s, of which bases and images "
        f"{result['build_seconds']:.0f} s; Docker data root {disk_text}; peak memory in use on this machine "
        f"{result['peak_memory_bytes'] / 2**30:.1f} GiB"
    )


def _rehearsal_cell(verdict: dict[str, str]) -> str:
    return "node only" if verdict["verdict"] == "node" else f"{verdict['verdict']}: {verdict['figure']}"


def render_train_plan(plan, task: str, profile_name: str, runtime: str, run_dir_in_trainer: str) -> None:
    """`make train DRY_RUN=1`: every command and file of the launch, and what to watch."""
    print(f"# dry run: {task} on profile {profile_name} ({runtime} runtime); nothing is launched")
    print(f"# tasks: polarstack tasks prepare {task} --out .run/train/{plan.run_id}/tasks")
    described = plan.as_dict()
    render_cluster(plan)
    for command in described["commands"]:
        print(command)
    for file_name, text in plan.files.items():
        print(f"# --- {run_dir_in_trainer}/{plan.run_id}/{file_name} ---")
        print(text.rstrip())
    for line in described["watch"]:
        print(f"# on the GPU node, watch: {line}")
    render_memory(plan)
    from polarstack.train.preflight import seven_b_line

    print(f"# {seven_b_line(plan)}")


def render_cluster(plan) -> None:
    """At NODES>1: what each node runs (polarstack.stack.cluster.layout); nothing on one node."""
    cluster = getattr(plan, "cluster", None)
    if cluster is None or not cluster.multi:
        return
    print(
        f"# cluster: {cluster.nodes} nodes on {cluster.iface}, head {cluster.head_addr}, shared {cluster.shared_dir}; "
        f"the plan is run on rank 0"
    )
    for node in plan.nodes:
        print(
            f"# node {node.rank} ({node.addr}): {', '.join(node.roles)}; engine GPUs "
            f"{','.join(map(str, node.engine_gpus))} ({' '.join(node.engine_urls)}), trainer GPUs "
            f"{','.join(map(str, node.trainer_gpus))}"
        )


def render_memory(plan) -> None:
    """The memory estimate per GPU and per host, term by term (polarstack.train.memory; computed, not measured)."""
    if plan.memory is not None:
        for line in plan.memory.lines():
            print(f"# {line}")


def render_verify(result: dict[str, Any], elapsed: float) -> None:
    print(
        f"{result['passed']}/{result['problems']} canonical {result['task']} solutions pass in the sandbox "
        f"({elapsed:.1f} s)"
    )


def render_bench(data: dict[str, Any], paths: dict[str, Any]) -> None:
    from rich.table import Table

    c = data["concurrencies"]
    table = Table(
        "profile",
        "router",
        "smoke",
        "smoke s",
        "added median ms",
        "added p99 ms",
        *[f"req/s c={x}" for x in c],
        "yield",
    )
    for name, row in data["profiles"].items():
        table.add_row(
            name,
            row["router"],
            row["smoke_verdict"],
            spread(row["smoke_seconds"]),
            spread(row["added_median_ms"]),
            spread(row["added_p99_ms"]),
            *[spread(row["throughput"][str(x)], 0) for x in c],
            spread(row["token_yield"], 2),
        )
    out = console()
    out.print(table)
    affinity = Table("profile", "routing", "cache share", "prompt tokens per engine")
    for name, row in data["profiles"].items():
        for routing, aff in row.get("affinity", {}).items():
            affinity.add_row(name, routing, f"{aff['cache_share']:.3f}", str(aff["per_engine_prompt_tokens"]))
    out.print(affinity)
    out.print(f"wrote {paths['markdown']}, {paths['json']}, {paths['plot']}")


def render_routing_bench(data: dict[str, Any], paths: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table("profile", "routing mode", "prompt tok % per engine", "affinity %", "cache/ideal", "turns/s", "goals")
    rows = [("any", "Polar worker bypass", data["bypass"])] + [
        (name, m["label"] + (" (shipped)" if m["shipped"] else ""), m["metrics"])
        for name, row in data["profiles"].items()
        for m in row["modes"]
    ]
    for name, label, m in rows:
        table.add_row(
            name,
            label,
            "/".join(f"{v * 100:.0f}" for v in m["prompt_token_share"]),
            f"{m['session_affinity'] * 100:.1f}",
            f"{m['cache_vs_ideal']:.3f}",
            f"{m['turns_per_s']:.1f}",
            "met" if all(m["goals"].values()) else "missed",
        )
    out = console()
    out.print(table)
    out.print(f"wrote {paths['markdown']}, {paths['json']}, {paths['plot']}")


def render_verify_offline(checks, elapsed: float) -> None:
    from rich.table import Table

    failed = [c for c in checks if not c.ok]
    table = Table("check", "result")
    for check in checks:
        table.add_row(check.name, "ok" if check.ok else "FAIL: " + "; ".join(check.problems)[:200])
    out = console()
    out.print(table)
    out.print(f"{len(checks) - len(failed)}/{len(checks)} checks passed in {elapsed:.1f} s")


def render_routers_catalog(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(*rows[0].keys())
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console().print(table)


def render_matrix(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(*(title for _, title in matrix.COLUMNS), "note")
    for row in rows:
        table.add_row(*(matrix.cell(row, key) for key, _ in matrix.COLUMNS), row.get("note", "")[:60])
    console().print(table)


def render_preflight_plan(plan) -> None:
    """`make preflight DRY_RUN=1`: the rehearsal's model, settings, steps, both jobs' launches and the report path."""
    model = plan.model
    print(f"# dry run: the rehearsal on profile {plan.profile}; nothing is launched")
    print(
        f"# model: {plan.hub_name} (slime scripts/models/qwen2.5-{plan.size}.sh: {model['num_layers']} layers, hidden "
        f"{model['hidden_size']}, {model['num_query_groups']} query groups, vocab {model['vocab_size']}, "
        f"{'tied' if model['tied_embeddings'] else 'untied'} embeddings, {model['parameters']:,} parameters computed)"
    )
    first = plan.phases[0][1].train_args
    value = lambda flag: first[first.index(flag) + 1]  # noqa: E731
    print(
        f"# GRPO: {value('--rollout-batch-size')} prompts x {value('--n-samples-per-prompt')} samples, global batch "
        f"{value('--global-batch-size')}, data-parallel size {plan.data_parallel}, tasks {', '.join(plan.task_ids)}"
    )
    print(f"# report: {plan.report_path}")
    render_cluster(plan.phases[0][1])
    for number, step in enumerate(plan.as_dict()["steps"], 1):
        print(f"# step {number}: {step}")
    render_memory(plan.phases[0][1])
    if plan.seven_b is not None:  # the 7B's parts run the real run's plan: its memory, host terms included
        print("# the 7B's parts (the real run's model and memory plan):")
        for line in plan.seven_b.memory.lines():
            print(f"# {line}")
        print("# the 7B's parts' added time (an estimate from sizes and stated rates, not measured):")
        for term, seconds in plan.seven_b.added_seconds.items():
            print(f"#   {seconds:7.1f} s  {term}")
    for name, phase in plan.phases:
        print(f"# --- job {name} ---")
        print(phase.as_dict()["commands"][-1])
    for file_name, text in plan.files.items():
        print(f"# --- .run/train/{plan.run_id}/{file_name} ---")
        print(text.rstrip())


def render_rehearsal_report(result: dict[str, Any]) -> None:
    """The rehearsal's verdict per silent-failure class (polarstack.checks.rehearsal_report)."""
    from rich.table import Table

    table = Table("class", "verdict", "measured", "what to change")
    for row in result["verdicts"]:
        table.add_row(row["class"], row["verdict"].upper(), row["figure"], row["change"])
    console().print(table)
    status = "passed" if result["passed"] else f"FAILED at {result['first_failure']}"
    print(f"rehearsal {status} ({result.get('profile', '?')}, {result.get('plan', '?')})")
